//! The conformance suite every read-store backend passes.
//!
//! Each check takes two handles on one backend (two "clients", as two API
//! replicas or a projector and an API would be) and uses ids of its own, so
//! the checks can share one database or keyspace. The embedded backend runs
//! the suite in `store/tests/conformance.rs`; ScyllaDB in
//! `scylla/tests/conformance.rs` when `HINDSIGHT_SCYLLA_NODES` is set.

use crate::auth::*;
use crate::store::*;
use crate::{Error, Position};
use hindsight_schemas::{Event, MarketRecord, Resolution, Timestamp, Token};
use std::sync::Arc;

pub use crate::store::Store as Backend;

type Check = Result<(), String>;

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Check {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

fn store_err(e: Error) -> String {
    format!("store error: {e}")
}

/// 2025-09-01T00:00:00Z
const T0: i64 = 1_756_684_800_000;

fn price_row(id: &str, res: Resolution, bucket: i64, sum: f64, count: u64, last: u64) -> Row {
    Row {
        key: RowKey {
            table: Table::Prices,
            id: id.into(),
            res,
            bucket: Timestamp(bucket),
        },
        value: RowValue::Price { sum, count },
        last_offset: last,
    }
}

async fn write(store: &dyn Backend, rows: Vec<Row>) -> Check {
    store
        .apply(ProjectionWrite {
            rows,
            ..Default::default()
        })
        .await
        .map_err(store_err)
}

/// Bucket rows of every table at every resolution load back exactly, and
/// read back as averages and snapshots.
pub async fn bucket_round_trips(a: &dyn Backend, b: &dyn Backend, prefix: &str) -> Check {
    let mut rows = Vec::new();
    for (i, res) in Resolution::ALL.into_iter().enumerate() {
        let bucket = res.bucket_start(Timestamp(T0 + 123_456_789)).0;
        rows.push(price_row(
            &format!("{prefix}-tok"),
            res,
            bucket,
            1.5 + i as f64,
            3,
            10 + i as u64,
        ));
        rows.push(Row {
            key: RowKey {
                table: Table::Metrics,
                id: format!("{prefix}-mkt").into(),
                res,
                bucket: Timestamp(bucket),
            },
            value: RowValue::Metrics {
                volume_sum: 30.0,
                liquidity_sum: 12.0,
                spread_sum: 0.3,
                count: 3,
            },
            last_offset: 20,
        });
        rows.push(Row {
            key: RowKey {
                table: Table::Books,
                id: format!("{prefix}-tok").into(),
                res,
                bucket: Timestamp(bucket),
            },
            value: RowValue::Book {
                ts: Timestamp(bucket + 5),
                offset: 30,
                bids: "[[0.41,100.0],[0.4,5.0]]".into(),
                asks: "[[0.43,50.0]]".into(),
            },
            last_offset: 31,
        });
    }
    write(a, rows.clone()).await?;
    let mut loaded = b
        .load(rows.iter().map(|r| r.key.clone()).collect())
        .await
        .map_err(store_err)?;
    loaded.sort_by(|x, y| x.key.cmp(&y.key));
    rows.sort_by(|x, y| x.key.cmp(&y.key));
    ensure(loaded == rows, || {
        format!("rows loaded back differ:\n{loaded:?}\nvs\n{rows:?}")
    })?;
    for (i, res) in Resolution::ALL.into_iter().enumerate() {
        let bucket = res.bucket_start(Timestamp(T0 + 123_456_789));
        let range = Range {
            res,
            start: bucket,
            end: Timestamp(bucket.0 + res.width_ms()),
            limit: 10,
        };
        let p = b
            .prices(&format!("{prefix}-tok"), range)
            .await
            .map_err(store_err)?;
        ensure(
            p == vec![PricePoint {
                t: bucket,
                p: (1.5 + i as f64) / 3.0,
            }],
            || format!("{res} prices {p:?}"),
        )?;
        let m = b
            .metrics(&format!("{prefix}-mkt"), range)
            .await
            .map_err(store_err)?;
        ensure(
            m.len() == 1 && (m[0].volume - 10.0).abs() < 1e-12 && (m[0].spread - 0.1).abs() < 1e-12,
            || format!("{res} metrics {m:?}"),
        )?;
        let k = b
            .books(&format!("{prefix}-tok"), range)
            .await
            .map_err(store_err)?;
        ensure(
            k.len() == 1 && k[0].bids == "[[0.41,100.0],[0.4,5.0]]" && k[0].t == bucket,
            || format!("{res} books {k:?}"),
        )?;
    }
    // Missing rows are absent, not errors.
    let missing = b.load(vec![RowKey {
        table: Table::Prices,
        id: format!("{prefix}-none").into(),
        res: Resolution::M1,
        bucket: Timestamp(T0),
    }]);
    ensure(missing.await.map_err(store_err)?.is_empty(), || {
        "a missing row loaded".into()
    })
}

/// `start <= t < end` holds at time-partition edges, in order, across
/// partitions; `limit` stops early; paging resumes after the last bucket.
pub async fn ranges_ordering_and_paging(a: &dyn Backend, b: &dyn Backend, prefix: &str) -> Check {
    let id = format!("{prefix}-range");
    let res = Resolution::M1;
    let w = res.width_ms();
    // 90 buckets every 3 hours: they span many days and so several
    // partitions of any sensible time-partitioning of 1m rows.
    let buckets: Vec<i64> = (0..90).map(|i| T0 + i * 3 * 3_600_000).collect();
    // Written newest first: late rows must still read back in order.
    let rows: Vec<Row> = buckets
        .iter()
        .rev()
        .map(|&t| price_row(&id, res, t, 0.5, 1, 1))
        .collect();
    write(a, rows).await?;
    let all = b.prices(
        &id,
        Range {
            res,
            start: Timestamp(T0),
            end: Timestamp(T0 + 400 * 86_400_000),
            limit: 1000,
        },
    );
    let all: Vec<i64> = all
        .await
        .map_err(store_err)?
        .into_iter()
        .map(|p| p.t.0)
        .collect();
    ensure(all == buckets, || format!("chronological order: {all:?}"))?;
    for &edge in &buckets[1..] {
        let exact = b
            .prices(
                &id,
                Range {
                    res,
                    start: Timestamp(edge),
                    end: Timestamp(edge + w),
                    limit: 10,
                },
            )
            .await
            .map_err(store_err)?;
        ensure(exact.len() == 1 && exact[0].t.0 == edge, || {
            format!("[{edge}, +w) gave {exact:?}")
        })?;
        let before = b
            .prices(
                &id,
                Range {
                    res,
                    start: Timestamp(edge - w),
                    end: Timestamp(edge),
                    limit: 10,
                },
            )
            .await
            .map_err(store_err)?;
        ensure(before.is_empty(), || {
            format!("end is exclusive at {edge}: {before:?}")
        })?;
    }
    let mut pages = Vec::new();
    let mut from = T0;
    loop {
        let page = b
            .prices(
                &id,
                Range {
                    res,
                    start: Timestamp(from),
                    end: Timestamp(T0 + 400 * 86_400_000),
                    limit: 7,
                },
            )
            .await
            .map_err(store_err)?;
        if page.is_empty() {
            break;
        }
        ensure(page.len() <= 7, || "limit honoured".into())?;
        from = page.last().unwrap().t.0 + 1;
        pages.extend(page.into_iter().map(|p| p.t.0));
    }
    ensure(pages == buckets, || {
        "paging with resume visits every bucket once".into()
    })
}

/// Applying the same rows again changes nothing; consumed positions commit.
pub async fn replays_and_positions(a: &dyn Backend, b: &dyn Backend, prefix: &str) -> Check {
    let id = format!("{prefix}-replay");
    let row = price_row(&id, Resolution::H1, T0, 2.25, 5, 77);
    let partition =
        40_000 + (prefix.len() as u32 * 7919 + prefix.bytes().map(u32::from).sum::<u32>()) % 20_000;
    for _ in 0..3 {
        a.apply(ProjectionWrite {
            rows: vec![row.clone()],
            catalog: vec![],
            consumed: vec![Position {
                partition,
                offset: 77,
            }],
        })
        .await
        .map_err(store_err)?;
    }
    let loaded = b.load(vec![row.key.clone()]).await.map_err(store_err)?;
    ensure(loaded == vec![row], || format!("replayed row {loaded:?}"))?;
    let committed = b.committed().await.map_err(store_err)?;
    ensure(
        committed.contains(&Position {
            partition,
            offset: 78,
        }),
        || format!("committed {committed:?}"),
    )
}

fn market(id: &str, slug: &str, question: &str, updated_ms: i64) -> MarketRecord {
    MarketRecord {
        id: id.into(),
        slug: slug.into(),
        event_id: None,
        question: Some(question.into()),
        description: None,
        status: "open".into(),
        start_date: None,
        end_date: None,
        closed_at: None,
        resolved_token_id: None,
        resolved_token_label: None,
        tokens: vec![
            Token {
                id: format!("{id}-y"),
                label: "Yes".into(),
            },
            Token {
                id: format!("{id}-n"),
                label: "No".into(),
            },
        ],
        created_at: Timestamp(T0),
        updated_at: Timestamp(updated_ms),
    }
}

/// The latest version of a record wins whatever order versions arrive in;
/// lookups by id, slug and token; changes are listed for the API catalog.
pub async fn catalog_upserts_and_lookups(a: &dyn Backend, b: &dyn Backend, prefix: &str) -> Check {
    let id = format!("{prefix}-m");
    let slug = format!("{prefix}-slug");
    let pos = |offset| Position {
        partition: 0,
        offset,
    };
    let v1 = market(&id, &slug, "first", T0);
    let v2 = market(&id, &slug, "second", T0 + 1000);
    for (p, m) in [(pos(100), &v1), (pos(101), &v2), (pos(100), &v1)] {
        a.apply(ProjectionWrite {
            rows: vec![],
            catalog: vec![(p, Event::Market(m.clone()))],
            consumed: vec![],
        })
        .await
        .map_err(store_err)?;
    }
    let by_id = b.market(&id).await.map_err(store_err)?;
    ensure(by_id.as_ref() == Some(&v2), || {
        format!("latest version by id: {by_id:?}")
    })?;
    let by_slug = b.market(&slug).await.map_err(store_err)?;
    ensure(by_slug.as_ref() == Some(&v2), || {
        format!("by slug: {by_slug:?}")
    })?;
    let token = b.token(&format!("{id}-n")).await.map_err(store_err)?;
    ensure(
        token
            == Some(TokenRef {
                token_id: format!("{id}-n"),
                market_id: id.clone(),
                label: "No".into(),
            }),
        || format!("token lookup: {token:?}"),
    )?;
    ensure(
        b.market(&format!("{prefix}-absent"))
            .await
            .map_err(store_err)?
            .is_none(),
        || "absent market".into(),
    )?;
    let (changes, _) = b.catalog_changes(None).await.map_err(store_err)?;
    let ours: Vec<&Event> = changes.iter().filter(|e| e.key() == id).collect();
    ensure(ours.last() == Some(&&Event::Market(v2.clone())), || {
        format!("change feed ends with the latest version: {ours:?}")
    })
}

/// Keys are found by hash only, listed, and revocations stick.
pub async fn key_hashes(a: &dyn Backend, b: &dyn Backend, prefix: &str) -> Check {
    let mut hash = [0u8; 32];
    for (i, byte) in prefix.bytes().chain(*b"key-hash").enumerate() {
        hash[i % 32] ^= byte.wrapping_mul(31).wrapping_add(i as u8);
    }
    let record = ApiKeyRecord {
        key_id: format!("key_{prefix}"),
        hash,
        organization: "conformance".into(),
        plan: "pro".into(),
        created_at: Timestamp(T0),
        revoked_at: None,
    };
    a.put_key(record.clone()).await.map_err(store_err)?;
    ensure(
        b.key_by_hash(hash).await.map_err(store_err)? == Some(record.clone()),
        || "key by hash".into(),
    )?;
    let mut other = hash;
    other[0] ^= 1;
    ensure(
        b.key_by_hash(other).await.map_err(store_err)?.is_none(),
        || "another hash finds nothing".into(),
    )?;
    ensure(
        b.list_keys()
            .await
            .map_err(store_err)?
            .iter()
            .any(|k| k.key_id == record.key_id),
        || "listed".into(),
    )?;
    let revoked = ApiKeyRecord {
        revoked_at: Some(Timestamp(T0 + 1)),
        plan: "free".into(),
        ..record
    };
    a.put_key(revoked.clone()).await.map_err(store_err)?;
    ensure(
        b.key_by_hash(hash).await.map_err(store_err)? == Some(revoked),
        || "revocation and plan change stick".into(),
    )
}

/// One window's count is shared by every client and starts over in the
/// next window.
pub async fn rate_windows_across_clients(a: &dyn Backend, b: &dyn Backend, prefix: &str) -> Check {
    let key = format!("key_rate_{prefix}");
    let window = Timestamp(T0);
    let mut counts = Vec::new();
    for i in 0..10 {
        let client = if i % 2 == 0 { a } else { b };
        counts.push(client.hit_window(&key, window).await.map_err(store_err)?);
    }
    ensure(counts == (1..=10).collect::<Vec<u64>>(), || {
        format!("shared count {counts:?}")
    })?;
    let next = b
        .hit_window(&key, Timestamp(T0 + 60_000))
        .await
        .map_err(store_err)?;
    ensure(next == 1, || format!("next window starts at 1, got {next}"))
}

/// Every check, by name, run against two handles on one backend. Returns
/// the failures (empty when the backend conforms).
pub async fn run_all(
    a: Arc<dyn Backend>,
    b: Arc<dyn Backend>,
    run_id: &str,
) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    macro_rules! check {
        ($name:ident) => {
            let prefix = format!("{}-{}", run_id, stringify!($name));
            if let Err(e) = $name(a.as_ref(), b.as_ref(), &prefix).await {
                failures.push((stringify!($name).to_string(), e));
            }
        };
    }
    check!(bucket_round_trips);
    check!(ranges_ordering_and_paging);
    check!(replays_and_positions);
    check!(catalog_upserts_and_lookups);
    check!(key_hashes);
    check!(rate_windows_across_clients);
    failures
}
