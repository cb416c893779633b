//! Store checks: [`ProjectionStore`], [`ReadStore`] and [`AuthStore`]; and
//! [`crate::AccountStore`]'s, from [`super::accounts`].
//!
//! Each check takes two handles on one backend and writes only ids under its
//! prefix (and log partitions derived from it), so that shared checks can run
//! at once on one database; it reads through the other handle what it wrote
//! through one, as an API replica reads what a projector wrote.

pub use super::accounts::*;
pub use super::ticks::{
    book_at_is_the_latest_snapshot_at_or_before, tick_counts_are_the_ticks_a_span_holds,
    ticks_round_trip_in_key_order_and_page, trade_ids_count_once_whatever_write_they_come_in,
    trade_totals_sum_the_deduplicated_trades_per_bucket,
};
use super::{ensure, store_err, Backend, Check, T0};
use crate::auth::*;
use crate::store::*;
use crate::Position;
use hindsight_schemas::wire::RejectKind;
use hindsight_schemas::{
    Event, EventRecord, MarketRecord, Resolution, SeriesRecord, Timestamp, Token,
};

fn price_row(id: &str, res: Resolution, bucket: i64, sum: f64, count: u64, last: u64) -> Row {
    Row {
        key: RowKey {
            table: Table::Prices,
            id: id.into(),
            res,
            bucket: Timestamp(bucket),
        },
        value: RowValue::Price {
            sum,
            count,
            candle: None,
        },
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
        .map(|_| ())
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

/// Price rows keep their candle whole (open and close marks, high, low),
/// or none: `load` gives back exactly what was applied, `candles` reads
/// the same buckets as `prices`, in order, with counts, within the range
/// and limit, and a row stored without a candle reads as one without.
pub async fn candles_round_trip_with_their_price_rows(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let id = format!("{prefix}-candles");
    let mark = |ms: i64, offset: u64, p: f64| Mark {
        ts: Timestamp(T0 + ms),
        offset,
        p,
    };
    let mut rows = Vec::new();
    for (i, res) in Resolution::ALL.into_iter().enumerate() {
        let w = res.width_ms();
        let i = i as u64;
        for k in 0..3_i64 {
            let mut row = price_row(&id, res, T0 + k * w, 1.25 + k as f64, 3 + i, 40 + i);
            if k != 1 {
                row.value = RowValue::Price {
                    sum: 1.25 + k as f64,
                    count: 3 + i,
                    candle: Some(Candle {
                        open: mark(k * w + 7, 11 + i, 0.125),
                        close: mark(k * w + w - 1, 2 + i, 0.875),
                        high: 0.9375,
                        low: 0.0625 * k as f64,
                    }),
                };
            }
            rows.push(row);
        }
    }
    write(a, rows.clone()).await?;
    let mut keys: Vec<RowKey> = rows.iter().map(|r| r.key.clone()).collect();
    keys.sort();
    rows.sort_by(|x, y| x.key.cmp(&y.key));
    let loaded = load_sorted(b, &keys).await?;
    ensure(loaded == rows, || {
        format!("price rows with candles load back changed:\n{loaded:?}\nvs\n{rows:?}")
    })?;
    for res in Resolution::ALL {
        let w = res.width_ms();
        let want: Vec<CandlePoint> = rows
            .iter()
            .filter(|r| r.key.res == res)
            .map(|r| match &r.value {
                RowValue::Price { count, candle, .. } => CandlePoint {
                    t: r.key.bucket,
                    count: *count,
                    candle: *candle,
                    trades: None,
                },
                other => unreachable!("{other:?}"),
            })
            .collect();
        let range = |start: i64, end: i64, limit: usize| Range {
            res,
            start: Timestamp(start),
            end: Timestamp(end),
            limit,
        };
        let all = b
            .candles(&id, range(T0 - w, T0 + 10 * w, 10))
            .await
            .map_err(store_err)?;
        ensure(all == want, || {
            format!("{res} candles {all:?}\nwant {want:?}")
        })?;
        let cut = b
            .candles(&id, range(T0 + 1, T0 + 2 * w + 1, 1))
            .await
            .map_err(store_err)?;
        ensure(cut == want[1..2], || {
            format!("{res} candles of [T0+1, +2w+1) limit 1: {cut:?}")
        })?;
        let prices = b
            .prices(&id, range(T0, T0 + 3 * w, 10))
            .await
            .map_err(store_err)?;
        ensure(
            prices.iter().map(|p| p.t).collect::<Vec<_>>()
                == want.iter().map(|c| c.t).collect::<Vec<_>>(),
            || format!("{res} prices and candles read the same buckets: {prices:?}"),
        )?;
    }
    Ok(())
}

/// `count` is the number of rows a range read would return without a
/// limit, for every table, across time partitions and over decades of
/// empty time, with `start` inclusive and `end` exclusive.
pub async fn counts_are_the_rows_a_range_holds(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    const YEAR: i64 = 365 * 86_400_000;
    let id = format!("{prefix}-count");
    let res = Resolution::M1;
    let w = res.width_ms();
    // Every 3 hours for 30 days (several time partitions), then two rows
    // decades later.
    let mut buckets: Vec<i64> = (0..240).map(|i| T0 + i * 3 * 3_600_000).collect();
    buckets.extend([T0 + 20 * YEAR, T0 + 40 * YEAR]);
    let mut rows = Vec::new();
    for &t in &buckets {
        rows.push(price_row(&id, res, t, 0.5, 1, 1));
        for (table, value) in [
            (
                Table::Metrics,
                RowValue::Metrics {
                    volume_sum: 1.0,
                    liquidity_sum: 1.0,
                    spread_sum: 0.1,
                    count: 1,
                },
            ),
            (
                Table::Books,
                RowValue::Book {
                    ts: Timestamp(t),
                    offset: 1,
                    bids: "[]".into(),
                    asks: "[]".into(),
                },
            ),
        ] {
            rows.push(Row {
                key: RowKey {
                    table,
                    id: id.as_str().into(),
                    res,
                    bucket: Timestamp(t),
                },
                value,
                last_offset: 1,
            });
        }
    }
    write(a, rows).await?;
    let ranges = [
        (T0, T0 + 50 * YEAR),
        (T0 - YEAR, T0),
        (T0 + w, T0 + 3 * 3_600_000),
        (T0 + 3 * 3_600_000, T0 + 3 * 3_600_000 + 1),
        (T0 + 7 * 86_400_000, T0 + 21 * 86_400_000),
        (T0 + 10 * YEAR, T0 + 40 * YEAR),
    ];
    for (start, end) in ranges {
        let want = buckets.iter().filter(|&&t| start <= t && t < end).count() as u64;
        let range = Range {
            res,
            start: Timestamp(start),
            end: Timestamp(end),
            limit: 1,
        };
        for table in Table::ALL {
            let n = b.count(table, &id, range).await.map_err(store_err)?;
            ensure(n == want, || {
                format!("{table:?} count of [{start}, {end}): {n}, want {want}")
            })?;
        }
    }
    let other = Range {
        res: Resolution::H1,
        start: Timestamp(T0),
        end: Timestamp(T0 + 50 * YEAR),
        limit: 1,
    };
    let n = b
        .count(Table::Prices, &id, other)
        .await
        .map_err(store_err)?;
    ensure(n == 0, || format!("another resolution holds none: {n}"))
}

/// A projector step can be large (thousands of rows, book snapshots of
/// kilobytes, many in one partition): `apply` takes it whole, whatever
/// limits the backend puts on one request, and every row loads back.
pub async fn large_writes_round_trip(a: &dyn Backend, b: &dyn Backend, prefix: &str) -> Check {
    let tok = format!("{prefix}-deep-book");
    let level = "[0.5123,12345.67],".repeat(80);
    let levels = format!("[{}]", level.trim_end_matches(','));
    let mut rows: Vec<Row> = (0..400)
        .map(|i| Row {
            key: RowKey {
                table: Table::Books,
                id: tok.as_str().into(),
                res: Resolution::M1,
                bucket: Timestamp(T0 + i * 60_000),
            },
            value: RowValue::Book {
                ts: Timestamp(T0 + i * 60_000 + 1),
                offset: i as u64,
                bids: levels.clone(),
                asks: levels.clone(),
            },
            last_offset: i as u64,
        })
        .collect();
    rows.extend((0..2000).map(|i| {
        price_row(
            &format!("{prefix}-tok{}", i % 40),
            Resolution::M1,
            T0 + (i / 40) * 60_000,
            0.25,
            1,
            i as u64,
        )
    }));
    write(a, rows.clone()).await?;
    rows.sort_by(|x, y| x.key.cmp(&y.key));
    let keys: Vec<RowKey> = rows.iter().map(|r| r.key.clone()).collect();
    let got = load_sorted(b, &keys).await?;
    ensure(got.len() == rows.len(), || {
        format!("{} of {} rows load back", got.len(), rows.len())
    })?;
    ensure(got == rows, || "rows load back changed".into())
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

/// A sparse series asked for over decades at the finest resolution reads
/// its few rows in order and pages through them, at a cost set by the rows,
/// not by the empty time in between (a time-partitioned store must not walk
/// every empty partition: one request could otherwise cost thousands of
/// queries).
pub async fn sparse_ranges_over_decades_cost_what_their_rows_cost(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    const YEAR: i64 = 365 * 86_400_000;
    let id = format!("{prefix}-sparse");
    let res = Resolution::M1;
    let buckets = [T0, T0 + 20 * YEAR, T0 + 40 * YEAR];
    write(
        a,
        buckets
            .iter()
            .map(|&t| price_row(&id, res, t, 0.25, 1, 1))
            .collect(),
    )
    .await?;
    let started = std::time::Instant::now();
    let (start, end) = (T0 - 30 * YEAR, T0 + 60 * YEAR);
    let read = |from: i64, limit: usize| {
        b.prices(
            &id,
            Range {
                res,
                start: Timestamp(from),
                end: Timestamp(end),
                limit,
            },
        )
    };
    let all: Vec<i64> = read(start, 1000)
        .await
        .map_err(store_err)?
        .into_iter()
        .map(|p| p.t.0)
        .collect();
    ensure(all == buckets, || format!("90 years at 1m gave {all:?}"))?;
    let mut pages = Vec::new();
    let mut from = start;
    loop {
        let page = read(from, 1).await.map_err(store_err)?;
        let Some(last) = page.last() else { break };
        from = last.t.0 + 1;
        pages.push(last.t.0);
    }
    ensure(pages == buckets, || format!("one row per page: {pages:?}"))?;
    let took = started.elapsed();
    ensure(took < std::time::Duration::from_secs(5), || {
        format!("five reads over 90 years of 1m buckets took {took:?}")
    })
}

/// A log partition of the check's own, so that checks sharing a store never
/// see each other's positions. Below 2^31: the CQL store keeps it as `int`.
fn own_partition(prefix: &str, n: u32) -> u32 {
    let h = prefix.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    1_000 + (h % 1_000_000) * 8 + n
}

fn pos(partition: u32, offset: u64) -> Position {
    Position { partition, offset }
}

async fn load_sorted(store: &dyn Backend, keys: &[RowKey]) -> Result<Vec<Row>, String> {
    let mut rows = store.load(keys.to_vec()).await.map_err(store_err)?;
    rows.sort_by(|x, y| x.key.cmp(&y.key));
    Ok(rows)
}

/// `apply` writes whole rows as given and `load` returns what was last
/// applied: no merging with the stored row, no keeping the greater offset
/// (replay decisions are the projector's, from `last_offset`).
pub async fn rows_are_whole_and_last_applied_wins(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let tok = format!("{prefix}-tok");
    let mkt = format!("{prefix}-mkt");
    let metrics = |v: f64, count: u64, last: u64| Row {
        key: RowKey {
            table: Table::Metrics,
            id: mkt.as_str().into(),
            res: Resolution::M5,
            bucket: Timestamp(T0),
        },
        value: RowValue::Metrics {
            volume_sum: v,
            liquidity_sum: v * 2.0,
            spread_sum: v / 100.0,
            count,
        },
        last_offset: last,
    };
    let book = |ts: i64, offset: u64, bids: &str| Row {
        key: RowKey {
            table: Table::Books,
            id: tok.as_str().into(),
            res: Resolution::M5,
            bucket: Timestamp(T0),
        },
        value: RowValue::Book {
            ts: Timestamp(ts),
            offset,
            bids: bids.into(),
            asks: "[]".into(),
        },
        last_offset: offset,
    };
    let other = price_row(&tok, Resolution::M5, T0 + 300_000, 0.5, 1, 3);
    let first = vec![
        price_row(&tok, Resolution::M5, T0, 1.0, 2, 5),
        metrics(10.0, 1, 6),
        book(T0 + 10, 7, "[[0.5,1.0]]"),
        other.clone(),
    ];
    write(a, first).await?;
    // The second write replaces three of the rows, one of them with a lower
    // last offset than the stored one, and leaves the fourth alone.
    let second = vec![
        price_row(&tok, Resolution::M5, T0, 3.25, 5, 9),
        metrics(4.0, 2, 2),
        book(T0 + 5, 8, "[[0.25,2.0]]"),
    ];
    write(a, second.clone()).await?;
    let mut want = second;
    want.push(other);
    want.sort_by(|x, y| x.key.cmp(&y.key));
    let keys: Vec<RowKey> = want.iter().map(|r| r.key.clone()).collect();
    let got = load_sorted(b, &keys).await?;
    ensure(got == want, || {
        format!("load after two writes returns\n{got:?}\nnot the last applied rows\n{want:?}")
    })?;
    // Re-applying the same write is a no-op.
    write(a, want.clone()).await?;
    let again = load_sorted(b, &keys).await?;
    ensure(again == want, || {
        format!("re-applied write changed rows: {again:?}")
    })
}

/// [`ProjectionStore::frontiers`]: every bound is past every bucket stored
/// of its series at its resolution — of prices, metrics and books, in time
/// partitions days apart, before the epoch too — and moves past rows
/// written later. A series with nothing stored may answer any bound.
pub async fn frontiers_bound_every_stored_bucket(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let tok: std::sync::Arc<str> = format!("{prefix}-tok").into();
    let mkt: std::sync::Arc<str> = format!("{prefix}-mkt").into();
    let row = |table: Table, res: Resolution, bucket: i64, last: u64| {
        let (id, value) = match table {
            Table::Prices => (
                &tok,
                RowValue::Price {
                    sum: 0.5,
                    count: 1,
                    candle: None,
                },
            ),
            Table::Metrics => (
                &mkt,
                RowValue::Metrics {
                    volume_sum: 1.0,
                    liquidity_sum: 2.0,
                    spread_sum: 0.1,
                    count: 1,
                },
            ),
            Table::Books => (
                &tok,
                RowValue::Book {
                    ts: Timestamp(bucket),
                    offset: last,
                    bids: "[]".into(),
                    asks: "[]".into(),
                },
            ),
        };
        Row {
            key: RowKey {
                table,
                id: id.clone(),
                res,
                bucket: res.bucket_start(Timestamp(bucket)),
            },
            value,
            last_offset: last,
        }
    };
    let day = 86_400_000;
    let series: Vec<Series> = vec![
        (Table::Prices, tok.clone()),
        (Table::Metrics, mkt.clone()),
        (Table::Books, tok.clone()),
        (Table::Prices, format!("{prefix}-none").into()),
    ];
    let mut stored: Vec<Row> = Vec::new();
    // Rows of the three tables at every resolution, the last one first,
    // then rows days later (other time partitions), then one far before.
    for (step, at) in [
        T0 + 3 * day + 1_234_567,
        T0 + 700_000,
        T0 + 40 * day + 5,
        -3 * day - 7,
    ]
    .into_iter()
    .enumerate()
    {
        let rows: Vec<Row> = Table::ALL
            .into_iter()
            .flat_map(|table| Resolution::ALL.map(|res| row(table, res, at, step as u64)))
            .collect();
        write(a, rows.clone()).await?;
        stored.extend(rows);
        let bounds = b.frontiers(series.clone()).await.map_err(store_err)?;
        ensure(bounds.len() == series.len(), || {
            format!("{} bounds for {} series", bounds.len(), series.len())
        })?;
        for r in &stored {
            let i = series
                .iter()
                .position(|(t, id)| (*t, id) == (r.key.table, &r.key.id))
                .expect("a series of the check");
            let bound = bounds[i][r.key.res.index()];
            ensure(r.key.bucket < bound, || {
                format!(
                    "after write {step}, the {} frontier of {} at {} is {}, not past its stored bucket {}",
                    r.key.table.as_str(),
                    r.key.id,
                    r.key.res.as_str(),
                    bound.0,
                    r.key.bucket.0
                )
            })?;
        }
    }
    Ok(())
}

/// [`ReadStore::version`] and [`AuthStore::version`]: a stamp read after
/// a write committed (a key and its revocation; bucket rows, a catalog
/// record) is greater than the stamp read before it, on the other handle; a
/// backend answering `None` tells nothing, and the API keeps nothing. (Other checks write to the same store meanwhile, so
/// a stamp that moved without this check's write is within the contract.)
pub async fn version_moves_with_every_committed_write(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let before = AuthStore::version(b);
    let key = key_record(prefix, [7; 32]);
    a.put_key(key.clone()).await.map_err(store_err)?;
    let after_key = AuthStore::version(b);
    if let (Some(x), Some(y)) = (before, after_key) {
        ensure(x < y, || {
            format!("the key stamp went from {x} to {y} across a new key")
        })?;
    }
    let revoked = ApiKeyRecord {
        revoked_at: Some(Timestamp(T0 + 1)),
        ..key
    };
    a.put_key(revoked).await.map_err(store_err)?;
    if let (Some(x), Some(y)) = (after_key, AuthStore::version(b)) {
        ensure(x < y, || {
            format!("the key stamp went from {x} to {y} across a revocation")
        })?;
    }

    let tok = format!("{prefix}-tok");
    let before = ReadStore::version(b);
    write(a, vec![price_row(&tok, Resolution::M1, T0, 0.5, 1, 1)]).await?;
    let after_rows = ReadStore::version(b);
    if let (Some(x), Some(y)) = (before, after_rows) {
        ensure(x < y, || {
            format!("the stamp went from {x} to {y} across a committed write of bucket rows")
        })?;
    }
    let m = format!("{prefix}-m");
    let t = yes_no(&m);
    let tokens = [(t[0].0.as_str(), t[0].1), (t[1].0.as_str(), t[1].1)];
    let record = market(&m, &format!("{prefix}-slug"), "q", T0, &tokens);
    put(
        a,
        vec![(
            pos(own_partition(prefix, 0), 1),
            Event::Market(Box::new(record)),
        )],
    )
    .await?;
    let after_catalog = ReadStore::version(b);
    if let (Some(x), Some(y)) = (after_rows, after_catalog) {
        ensure(x < y, || {
            format!("the stamp went from {x} to {y} across a committed catalog record")
        })?;
    }
    // What the stamps vouch for is there to read.
    let got = b.prices(
        &tok,
        Range {
            res: Resolution::M1,
            start: Timestamp(T0),
            end: Timestamp(T0 + 60_000),
            limit: 10,
        },
    );
    let got = got.await.map_err(store_err)?;
    ensure(got.len() == 1, || {
        format!("the written bucket reads as {got:?}")
    })
}

/// `committed` reports, per partition, the position after the last one
/// consumed; each partition moves on its own; a repeated write is a no-op.
pub async fn committed_positions_per_partition(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let (p1, p2) = (own_partition(prefix, 0), own_partition(prefix, 1));
    let ours = |all: Vec<Position>| -> Vec<Position> {
        all.into_iter()
            .filter(|p| p.partition == p1 || p.partition == p2)
            .collect()
    };
    let consume = |consumed: Vec<Position>| ProjectionWrite {
        consumed,
        ..Default::default()
    };
    a.apply(consume(vec![pos(p1, 5), pos(p2, 7)]))
        .await
        .map_err(store_err)?;
    let got = ours(b.committed().await.map_err(store_err)?);
    ensure(got == vec![pos(p1, 6), pos(p2, 8)], || {
        format!("after consuming {p1}@5 and {p2}@7, committed is {got:?}")
    })?;
    for _ in 0..2 {
        a.apply(consume(vec![pos(p1, 9)]))
            .await
            .map_err(store_err)?;
        let got = ours(b.committed().await.map_err(store_err)?);
        ensure(got == vec![pos(p1, 10), pos(p2, 8)], || {
            format!("after consuming {p1}@9 (twice), committed is {got:?}")
        })?;
    }
    Ok(())
}

/// When `apply` fails, `committed` does not move past rows that may not be
/// durable. The write fails on a catalog entry that is no catalog record,
/// which every backend refuses; rows of the failed write may or may not be
/// there, the position must not be.
pub async fn positions_never_advance_past_unwritten_rows(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let p = own_partition(prefix, 0);
    let tok = format!("{prefix}-tok");
    let first = price_row(&tok, Resolution::H1, T0, 1.0, 1, 10);
    a.apply(ProjectionWrite {
        rows: vec![first.clone()],
        ticks: vec![],
        catalog: vec![],
        consumed: vec![pos(p, 10)],
    })
    .await
    .map_err(store_err)?;
    let loaded = b.load(vec![first.key.clone()]).await.map_err(store_err)?;
    ensure(loaded == vec![first.clone()], || {
        format!("a row of a successful apply is not loadable: {loaded:?}")
    })?;
    let not_catalog = Event::Price(hindsight_schemas::PriceTick {
        market_id: format!("{prefix}-mkt"),
        token_id: tok.clone(),
        ts: Timestamp(T0),
        p: 0.5,
    });
    let failed = a
        .apply(ProjectionWrite {
            rows: vec![price_row(&tok, Resolution::H1, T0 + 3_600_000, 2.0, 1, 20)],
            ticks: vec![],
            catalog: vec![(pos(p, 19), not_catalog)],
            consumed: vec![pos(p, 20)],
        })
        .await;
    ensure(failed.is_err(), || {
        "a price tick given as a catalog record was accepted".into()
    })?;
    let committed: Vec<Position> = b
        .committed()
        .await
        .map_err(store_err)?
        .into_iter()
        .filter(|q| q.partition == p)
        .collect();
    ensure(committed == vec![pos(p, 11)], || {
        format!("after a failed apply consuming {p}@20, committed is {committed:?} (want {p}@11)")
    })
}

fn series(id: &str, title: &str, updated: i64) -> SeriesRecord {
    SeriesRecord {
        id: id.into(),
        slug: format!("{id}-slug"),
        title: title.into(),
        tags: vec!["conformance".into()],
        status: Some("active".into()),
        start_date: None,
        end_date: None,
        created_at: Timestamp(T0),
        updated_at: Timestamp(updated),
    }
}

fn event(id: &str, series_id: Option<&str>, title: &str, updated: i64) -> EventRecord {
    EventRecord {
        id: id.into(),
        slug: format!("{id}-slug"),
        series_id: series_id.map(String::from),
        title: title.into(),
        tags: vec![],
        status: None,
        start_date: Some(Timestamp(T0)),
        end_date: None,
        created_at: Timestamp(T0),
        updated_at: Timestamp(updated),
    }
}

/// An open market `id` with `slug`, `question`, version `updated` (Unix
/// ms) and `tokens` as `(id, label)`: a builder for tests beside the suite.
pub fn market(
    id: &str,
    slug: &str,
    question: &str,
    updated: i64,
    tokens: &[(&str, &str)],
) -> MarketRecord {
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
        tokens: tokens
            .iter()
            .map(|(id, label)| Token {
                id: (*id).into(),
                label: (*label).into(),
            })
            .collect(),
        created_at: Timestamp(T0),
        updated_at: Timestamp(updated),
    }
}

fn yes_no(id: &str) -> [(String, &'static str); 2] {
    [(format!("{id}-y"), "Yes"), (format!("{id}-n"), "No")]
}

fn simple_market(id: &str, question: &str, updated: i64) -> MarketRecord {
    let t = yes_no(id);
    market(
        id,
        &format!("{id}-slug"),
        question,
        updated,
        &[(&t[0].0, t[0].1), (&t[1].0, t[1].1)],
    )
}

/// Applies catalog records none of which may be refused.
async fn put(store: &dyn Backend, catalog: Vec<(Position, Event)>) -> Check {
    let applied = store
        .apply(ProjectionWrite {
            catalog,
            ..Default::default()
        })
        .await
        .map_err(store_err)?;
    ensure(applied.refused.is_empty(), || {
        format!(
            "records taking no other market's token or slug were refused: {:?}",
            applied.refused
        )
    })
}

fn catalog_id(e: &Event) -> Option<&str> {
    match e {
        Event::Series(s) => Some(&s.id),
        Event::Event(e) => Some(&e.id),
        Event::Market(m) => Some(&m.id),
        _ => None,
    }
}

/// The records of `changes` whose id starts with `prefix`, in answer order.
fn ours<'a>(changes: &'a [Event], prefix: &str) -> Vec<&'a Event> {
    changes
        .iter()
        .filter(|e| catalog_id(e).is_some_and(|id| id.starts_with(prefix)))
        .collect()
}

/// Versions of one record in arrival order as `(offset, updated_at, label)`,
/// and the label of the one that must win.
type Case = (&'static [(u64, i64, &'static str)], &'static str);

/// Of several versions of a record, the greatest `(updated_at, position)`
/// is kept whatever order they arrive in, in separate writes or in one; a
/// losing version never shows in a lookup nor in the change feed.
pub async fn catalog_newest_version_wins_whatever_arrival_order(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    // (versions in arrival order as (offset, updated_at, label), winner label)
    // per case; every write holds one version, except the last case's.
    let cases: [Case; 4] = [
        (&[(10, T0 + 1000, "new"), (20, T0, "old")], "new"),
        (&[(5, T0, "old"), (6, T0 + 1000, "new")], "new"),
        (&[(31, T0, "later"), (30, T0, "earlier")], "later"),
        (&[(30, T0, "earlier"), (31, T0, "later")], "later"),
    ];
    let mut winners: Vec<Event> = Vec::new();
    // Versions that arrive after the winner: never stored. (A version
    // stored until the winner came may show again in a feed re-reading a
    // margin of its history; it must never be a record's last version.)
    let mut never_stored: Vec<(Position, Event)> = Vec::new();
    let mut superseded: Vec<(Position, Event)> = Vec::new();
    for kind in ["series", "event", "market"] {
        let make = |id: &str, updated: i64, label: &str| match kind {
            "series" => Event::Series(Box::new(series(id, label, updated))),
            "event" => Event::Event(Box::new(event(id, None, label, updated))),
            _ => Event::Market(Box::new(simple_market(id, label, updated))),
        };
        // Each record in a log partition of its own, as one record's
        // versions are in the log.
        let partition = |i: u32| own_partition(&format!("{prefix}-{kind}"), i);
        for (i, (versions, winner)) in cases.iter().enumerate() {
            let id = format!("{prefix}-{kind}{i}");
            let mut won = false;
            for &(offset, updated, label) in *versions {
                let e = make(&id, updated, label);
                let at = pos(partition(i as u32), offset);
                put(a, vec![(at, e.clone())]).await?;
                if label == *winner {
                    winners.push(e);
                    won = true;
                } else if won {
                    never_stored.push((at, e));
                } else {
                    superseded.push((at, e));
                }
            }
        }
        // One write, in log order, where the earlier version is the newer.
        let id = format!("{prefix}-{kind}-onewrite");
        let (newer, older) = (make(&id, T0 + 5000, "newer"), make(&id, T0, "older"));
        let p = partition(cases.len() as u32);
        put(
            a,
            vec![(pos(p, 40), newer.clone()), (pos(p, 41), older.clone())],
        )
        .await?;
        winners.push(newer);
        never_stored.push((pos(p, 41), older));
    }
    for w in &winners {
        if let Event::Market(m) = w {
            let got = b.market(&m.id).await.map_err(store_err)?;
            ensure(got.as_ref() == Some(m), || {
                format!("market {} is {got:?}, not the newest version {m:?}", m.id)
            })?;
        }
    }
    let feed_holds_winners = |answer: &[&Event], what: &str| -> Check {
        for w in &winners {
            let id = catalog_id(w).unwrap();
            let last = answer.iter().rev().find(|e| catalog_id(e) == Some(id));
            ensure(last.is_none_or(|l| l == &w), || {
                format!("{what}: the last version of {id} is {last:?}, not the newest {w:?}")
            })?;
        }
        for (_, l) in &never_stored {
            ensure(!answer.contains(&l), || {
                format!("{what}: lists a version that lost on arrival {l:?}")
            })?;
        }
        Ok(())
    };
    let (all, cursor) = b.catalog_changes(None).await.map_err(store_err)?;
    let all = ours(&all, prefix);
    for w in &winners {
        ensure(all.contains(&w), || {
            format!("the full change feed lacks the newest version {w:?}")
        })?;
    }
    feed_holds_winners(&all, "the full change feed")?;
    // Losing versions arriving again change nothing and are not news.
    for (p, l) in never_stored.iter().chain(&superseded) {
        put(a, vec![(*p, l.clone())]).await?;
    }
    let (since, _) = a.catalog_changes(Some(&cursor)).await.map_err(store_err)?;
    feed_holds_winners(
        &ours(&since, prefix),
        "the changes after losers arrived again",
    )
}

/// A market upsert replaces the market's token list: a token no longer
/// listed stops resolving, a new one resolves, a label change shows; a
/// token the market dropped can then be listed by another market.
pub async fn catalog_token_list_is_replaced(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let m = format!("{prefix}-m");
    let other = format!("{prefix}-other");
    let (pm, po) = (own_partition(prefix, 0), own_partition(prefix, 1));
    let (y, n, x) = (format!("{m}-y"), format!("{m}-n"), format!("{m}-x"));
    let slug = format!("{m}-slug");
    let v1 = market(&m, &slug, "q", T0, &[(&y, "Yes"), (&n, "No")]);
    let v2 = market(&m, &slug, "q", T0 + 1, &[(&y, "Yes!"), (&x, "Maybe")]);
    put(a, vec![(pos(pm, 1), Event::Market(Box::new(v1)))]).await?;
    put(a, vec![(pos(pm, 2), Event::Market(Box::new(v2)))]).await?;
    let token = |id: &str, market: &str, label: &str| {
        Some(TokenRef {
            token_id: id.into(),
            market_id: market.into(),
            label: label.into(),
        })
    };
    let got = b.token(&n).await.map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("token {n}, removed from the list, resolves: {got:?}")
    })?;
    let got = b.token(&x).await.map_err(store_err)?;
    ensure(got == token(&x, &m, "Maybe"), || {
        format!("added token {x}: {got:?}")
    })?;
    let got = b.token(&y).await.map_err(store_err)?;
    ensure(got == token(&y, &m, "Yes!"), || {
        format!("relabelled token {y}: {got:?}")
    })?;
    // `m` drops `x`; then another market lists it: `x` is the other's.
    let v3 = market(&m, &slug, "q", T0 + 2, &[(&y, "Yes!")]);
    put(a, vec![(pos(pm, 3), Event::Market(Box::new(v3)))]).await?;
    let got = b.token(&x).await.map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("token {x}, dropped by {m}, resolves: {got:?}")
    })?;
    let o = market(&other, &format!("{other}-slug"), "q", T0, &[(&x, "Taken")]);
    put(a, vec![(pos(po, 1), Event::Market(Box::new(o)))]).await?;
    let got = b.token(&x).await.map_err(store_err)?;
    ensure(got == token(&x, &other, "Taken"), || {
        format!("token {x}, dropped by {m} and then listed by {other}: {got:?}")
    })?;
    let got = b.token(&y).await.map_err(store_err)?;
    ensure(got == token(&y, &m, "Yes!"), || {
        format!("kept token {y}: {got:?}")
    })
}

/// Applies `catalog` and returns what it refused, as `(id, reason kind,
/// field)`.
async fn refused(
    store: &dyn Backend,
    catalog: Vec<(Position, Event)>,
) -> Result<Vec<(Position, String, RejectKind, String)>, String> {
    let applied = store
        .apply(ProjectionWrite {
            catalog,
            ..Default::default()
        })
        .await
        .map_err(store_err)?;
    Ok(applied
        .refused
        .into_iter()
        .map(|r| {
            (
                r.position,
                r.id,
                r.reason.kind(),
                r.reason.field_name().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// One market per token and per slug: a market version listing a token
/// another stored market lists, or taking another stored market's slug, is
/// not stored and is reported refused (in one write, each record is decided
/// after the ones before it); once the first market drops the token or the
/// slug, another may take it. `lookup_tokens` answers as `token` does.
pub async fn catalog_first_market_keeps_its_tokens_and_slug(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let id = |name: &str| format!("{prefix}-{name}");
    let part = |n: u32| own_partition(prefix, n);
    let (ma, mb, mc, md, me) = (id("a"), id("b"), id("c"), id("d"), id("e"));
    let (t1, t2, t3, t5) = (id("t1"), id("t2"), id("t3"), id("t5"));
    let (sa, sa2) = (id("a-slug"), id("a-slug2"));
    let a1 = market(&ma, &sa, "q", T0, &[(&t1, "Yes"), (&t2, "No")]);
    put(
        a,
        vec![(pos(part(0), 1), Event::Market(Box::new(a1.clone())))],
    )
    .await?;

    // b lists a's token t1; c takes a's slug: neither is stored.
    let b1 = market(&mb, &id("b-slug"), "q", T0, &[(&t3, "Yes"), (&t1, "No")]);
    let c1 = market(&mc, &sa, "q", T0, &[(&id("t4"), "Yes")]);
    let got = refused(
        a,
        vec![
            (pos(part(1), 1), Event::Market(Box::new(b1.clone()))),
            (pos(part(2), 1), Event::Market(Box::new(c1.clone()))),
        ],
    )
    .await?;
    let want = vec![
        (
            pos(part(1), 1),
            mb.clone(),
            RejectKind::TokenClaimed,
            "tokens[1].id".to_string(),
        ),
        (
            pos(part(2), 1),
            mc.clone(),
            RejectKind::SlugTaken,
            "slug".to_string(),
        ),
    ];
    ensure(got == want, || format!("refused {got:?}, want {want:?}"))?;
    for (lookup, what) in [(&mb, "b by id"), (&mc, "c by id")] {
        let got = b.market(lookup).await.map_err(store_err)?;
        ensure(got.is_none(), || {
            format!("refused market {what} is stored: {got:?}")
        })?;
    }
    let got = b.market(&sa).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&a1), || {
        format!("slug {sa} resolves to {got:?}, not the first market {ma}")
    })?;
    let got = b.token(&t1).await.map_err(store_err)?;
    ensure(got.as_ref().is_some_and(|t| t.market_id == ma), || {
        format!("token {t1} resolves to {got:?}, not the first market {ma}")
    })?;
    let got = b.token(&t3).await.map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("token {t3} of a refused market resolves: {got:?}")
    })?;
    let mut got = a
        .lookup_tokens(vec![t1.clone(), t3.clone(), t2.clone()])
        .await
        .map_err(store_err)?;
    got.sort_by(|x, y| x.token_id.cmp(&y.token_id));
    let listed: Vec<(&str, &str)> = got
        .iter()
        .map(|t| (t.token_id.as_str(), t.market_id.as_str()))
        .collect();
    ensure(
        listed == [(t1.as_str(), ma.as_str()), (t2.as_str(), ma.as_str())],
        || format!("lookup_tokens answers {listed:?}"),
    )?;

    // In one write, the first of two markets listing a new token keeps it.
    let d1 = market(&md, &id("d-slug"), "q", T0, &[(&t5, "Yes")]);
    let e1 = market(&me, &id("e-slug"), "q", T0, &[(&t5, "Yes")]);
    let got = refused(
        a,
        vec![
            (pos(part(3), 1), Event::Market(Box::new(d1))),
            (pos(part(4), 1), Event::Market(Box::new(e1))),
        ],
    )
    .await?;
    ensure(
        got.len() == 1 && got[0].1 == me && got[0].2 == RejectKind::TokenClaimed,
        || format!("of two markets listing {t5} in one write, refused: {got:?}"),
    )?;
    let got = b.token(&t5).await.map_err(store_err)?;
    ensure(got.as_ref().is_some_and(|t| t.market_id == md), || {
        format!("token {t5} resolves to {got:?}, not the first market {md}")
    })?;

    // a drops t1 and moves to another slug: b and c may take them now.
    let a2 = market(&ma, &sa2, "q", T0 + 1, &[(&t2, "No")]);
    put(a, vec![(pos(part(0), 2), Event::Market(Box::new(a2)))]).await?;
    let b2 = market(
        &mb,
        &id("b-slug"),
        "q",
        T0 + 1,
        &[(&t3, "Yes"), (&t1, "No")],
    );
    let c2 = market(&mc, &sa, "q", T0 + 1, &[(&id("t4"), "Yes")]);
    let got = refused(
        a,
        vec![
            (pos(part(1), 2), Event::Market(Box::new(b2))),
            (pos(part(2), 2), Event::Market(Box::new(c2.clone()))),
        ],
    )
    .await?;
    ensure(got.is_empty(), || {
        format!("after {ma} released them, refused: {got:?}")
    })?;
    let got = b.token(&t1).await.map_err(store_err)?;
    ensure(got.as_ref().is_some_and(|t| t.market_id == mb), || {
        format!("token {t1}, released by {ma} and listed by {mb}, resolves to {got:?}")
    })?;
    let got = b.market(&sa).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&c2), || {
        format!("slug {sa}, released by {ma} and taken by {mc}, resolves to {got:?}")
    })?;
    // A refused version never reached the change feed.
    let (all, _) = b.catalog_changes(None).await.map_err(store_err)?;
    for never in [Event::Market(Box::new(b1)), Event::Market(Box::new(c1))] {
        ensure(!all.contains(&never), || {
            format!("the change feed lists a refused version: {never:?}")
        })?;
    }
    Ok(())
}

/// Catalog records are decided once: re-applying a write (a replay after a
/// crash between the catalog and the consumed positions) leaves a refused
/// record refused, although a later record of the same write released the
/// token it was refused for; and a stored one stays stored.
pub async fn catalog_replay_decides_nothing_again(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let (ma, mb) = (format!("{prefix}-a"), format!("{prefix}-b"));
    let (pa, pb) = (own_partition(prefix, 0), own_partition(prefix, 1));
    let t = format!("{prefix}-t");
    let a1 = market(&ma, &format!("{ma}-slug"), "q", T0, &[(&t, "Yes")]);
    put(a, vec![(pos(pa, 1), Event::Market(Box::new(a1)))]).await?;
    let b1 = market(&mb, &format!("{mb}-slug"), "q", T0, &[(&t, "Yes")]);
    let other = format!("{prefix}-t2");
    let a2 = market(&ma, &format!("{ma}-slug"), "q", T0 + 1, &[(&other, "Yes")]);
    let write = || {
        vec![
            (pos(pb, 5), Event::Market(Box::new(b1.clone()))),
            (pos(pa, 2), Event::Market(Box::new(a2.clone()))),
        ]
    };
    let first = refused(a, write()).await?;
    ensure(first.len() == 1 && first[0].1 == mb, || {
        format!("{mb} listing {ma}'s token: refused {first:?}")
    })?;
    let again = refused(a, write()).await?;
    ensure(again.is_empty(), || {
        format!("the same write again decided records again: refused {again:?}")
    })?;
    let got = b.token(&t).await.map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("after the write was applied again, {t} resolves to {got:?}: the refused {mb} was stored on replay")
    })?;
    let got = b.market(&mb).await.map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("the refused {mb} is stored after a replay: {got:?}")
    })?;
    let got = b.market(&ma).await.map_err(store_err)?;
    ensure(got == Some(a2.clone()), || {
        format!("{ma} after a replay: {got:?}")
    })
}

/// A market's new slug resolves and its old one no longer does (until
/// another market takes it); an older version arriving late moves nothing.
pub async fn catalog_slug_change_moves_the_lookup(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let (m, m2) = (format!("{prefix}-m"), format!("{prefix}-m2"));
    let (old, new) = (format!("{prefix}-old-slug"), format!("{prefix}-new-slug"));
    let (pm, pm2) = (own_partition(prefix, 0), own_partition(prefix, 1));
    let t = yes_no(&m);
    let tokens = [(t[0].0.as_str(), t[0].1), (t[1].0.as_str(), t[1].1)];
    let v1 = market(&m, &old, "q", T0, &tokens);
    let v2 = market(&m, &new, "q", T0 + 1, &tokens);
    put(a, vec![(pos(pm, 1), Event::Market(Box::new(v1.clone())))]).await?;
    put(a, vec![(pos(pm, 2), Event::Market(Box::new(v2.clone())))]).await?;
    let got = b.market(&old).await.map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("the old slug {old} still resolves: {got:?}")
    })?;
    let got = b.market(&new).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&v2), || {
        format!("the new slug {new}: {got:?}")
    })?;
    let got = b.market(&m).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&v2), || {
        format!("market {m} by id: {got:?}")
    })?;
    // Another market takes the old slug; then m's first version arrives again.
    let t2 = yes_no(&m2);
    let other = market(
        &m2,
        &old,
        "q",
        T0,
        &[(&t2[0].0, t2[0].1), (&t2[1].0, t2[1].1)],
    );
    put(
        a,
        vec![(pos(pm2, 1), Event::Market(Box::new(other.clone())))],
    )
    .await?;
    put(a, vec![(pos(pm, 1), Event::Market(Box::new(v1)))]).await?;
    let got = b.market(&old).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&other), || {
        format!("the slug {old}, taken by {m2}, resolves to {got:?}")
    })?;
    let got = b.market(&new).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&v2), || {
        format!("after an old version arrived late, {new} resolves to {got:?}")
    })?;
    let absent = format!("{prefix}-absent");
    let got = b.market(&absent).await.map_err(store_err)?;
    ensure(got.is_none(), || format!("an unknown id resolves: {got:?}"))
}

/// Series and events are stored and listed by the change feed with their
/// whole record; they are not markets.
pub async fn catalog_series_and_events_are_stored_and_listed(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let s = series(&format!("{prefix}-s"), "A series", T0);
    let e = event(&format!("{prefix}-e"), Some(&s.id), "An event", T0);
    let mut m = simple_market(&format!("{prefix}-m"), "A market", T0);
    m.event_id = Some(e.id.clone());
    let written = [
        Event::Series(Box::new(s.clone())),
        Event::Event(Box::new(e.clone())),
        Event::Market(Box::new(m.clone())),
    ];
    put(
        a,
        written
            .iter()
            .enumerate()
            .map(|(i, r)| (pos(own_partition(prefix, 0), i as u64), r.clone()))
            .collect(),
    )
    .await?;
    let (all, _) = b.catalog_changes(None).await.map_err(store_err)?;
    let mut got: Vec<Event> = ours(&all, prefix).into_iter().cloned().collect();
    got.dedup();
    ensure(
        got.len() == 3 && written.iter().all(|w| got.contains(w)),
        || format!("the change feed lists {got:?}, not the series, event and market written"),
    )?;
    for id in [&s.id, &e.id, &s.slug, &e.slug] {
        let got = b.market(id).await.map_err(store_err)?;
        ensure(got.is_none(), || {
            format!("{id} (a series or event) resolves as a market: {got:?}")
        })?;
    }
    Ok(())
}

/// `catalog_changes(Some(cursor))` lists every record stored after the
/// cursor was returned, series, events and markets, new or changed, from any
/// log partition (whose offsets are unrelated), and the cursor works on any
/// handle.
pub async fn catalog_changes_after_a_cursor(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let (s, e, m) = (
        format!("{prefix}-s"),
        format!("{prefix}-e"),
        format!("{prefix}-m"),
    );
    let (p0, p1, p2) = (
        own_partition(prefix, 0),
        own_partition(prefix, 1),
        own_partition(prefix, 2),
    );
    put(
        a,
        vec![
            (pos(p0, 1000), Event::Series(Box::new(series(&s, "v1", T0)))),
            (
                pos(p0, 1001),
                Event::Event(Box::new(event(&e, Some(&s), "v1", T0))),
            ),
            (
                pos(p0, 1002),
                Event::Market(Box::new(simple_market(&m, "v1", T0))),
            ),
        ],
    )
    .await?;
    let (_, cursor) = b.catalog_changes(None).await.map_err(store_err)?;
    // Changes after the cursor: newer versions at later offsets, and new
    // records from other partitions at far lower offsets.
    let changed = vec![
        (
            pos(p0, 1003),
            Event::Series(Box::new(series(&s, "v2", T0 + 1))),
        ),
        (
            pos(p0, 1004),
            Event::Event(Box::new(event(&e, Some(&s), "v2", T0 + 1))),
        ),
        (
            pos(p0, 1005),
            Event::Market(Box::new(simple_market(&m, "v2", T0 + 1))),
        ),
        (
            pos(p1, 3),
            Event::Market(Box::new(simple_market(&format!("{m}-new"), "v1", T0))),
        ),
        (
            pos(p2, 0),
            Event::Series(Box::new(series(&format!("{s}-new"), "v1", T0))),
        ),
    ];
    put(a, changed.clone()).await?;
    let (since, next) = a.catalog_changes(Some(&cursor)).await.map_err(store_err)?;
    let since = ours(&since, prefix);
    for (_, c) in &changed {
        ensure(since.contains(&c), || {
            format!("a record stored after the cursor is missing from the changes: {c:?}\nchanges: {since:?}")
        })?;
    }
    // And from the next cursor on, only what changes next.
    let later = (
        pos(p1, 4),
        Event::Market(Box::new(simple_market(&format!("{m}-new"), "v2", T0 + 1))),
    );
    put(a, vec![later.clone()]).await?;
    let (since, _) = b.catalog_changes(Some(&next)).await.map_err(store_err)?;
    let since = ours(&since, prefix);
    ensure(since.contains(&&later.1), || {
        format!(
            "a record changed after the second cursor is missing: {:?}\nchanges: {since:?}",
            later.1
        )
    })
}

/// `reset` drops every bucket row, catalog record (with its slug and token
/// lookups) and consumed position; keys survive, and a change-feed cursor
/// taken before still sees what is written after.
pub async fn reset_drops_rows_ticks_catalog_and_positions(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let p = own_partition(prefix, 0);
    let tok = format!("{prefix}-m-y");
    let row = price_row(&tok, Resolution::M1, T0, 0.5, 1, 3);
    let m = simple_market(&format!("{prefix}-m"), "q", T0);
    let s = series(&format!("{prefix}-s"), "s", T0);
    let e = event(&format!("{prefix}-e"), None, "e", T0);
    a.apply(ProjectionWrite {
        rows: vec![row.clone()],
        ticks: vec![],
        catalog: vec![
            (pos(p, 1), Event::Series(Box::new(s))),
            (pos(p, 2), Event::Event(Box::new(e))),
            (pos(p, 3), Event::Market(Box::new(m.clone()))),
        ],
        consumed: vec![pos(p, 3)],
    })
    .await
    .map_err(store_err)?;
    let key = key_record(prefix, [7; 32]);
    a.put_key(key.clone()).await.map_err(store_err)?;
    let (_, cursor) = b.catalog_changes(None).await.map_err(store_err)?;
    a.reset().await.map_err(store_err)?;

    let rows = b.load(vec![row.key.clone()]).await.map_err(store_err)?;
    ensure(rows.is_empty(), || format!("rows survive reset: {rows:?}"))?;
    let range = Range {
        res: Resolution::M1,
        start: Timestamp(T0),
        end: Timestamp(T0 + 60_000),
        limit: 10,
    };
    let points = b.prices(&tok, range).await.map_err(store_err)?;
    ensure(points.is_empty(), || {
        format!("prices survive reset: {points:?}")
    })?;
    let committed = b.committed().await.map_err(store_err)?;
    ensure(committed.is_empty(), || {
        format!("positions survive reset: {committed:?}")
    })?;
    for lookup in [&m.id, &m.slug] {
        let got = b.market(lookup).await.map_err(store_err)?;
        ensure(got.is_none(), || {
            format!("market {lookup} survives reset: {got:?}")
        })?;
    }
    let got = b.token(&tok).await.map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("token {tok} survives reset: {got:?}")
    })?;
    let (all, _) = b.catalog_changes(None).await.map_err(store_err)?;
    ensure(all.is_empty(), || {
        format!("catalog records survive reset: {all:?}")
    })?;
    let got = b.key_by_hash(key.hash).await.map_err(store_err)?;
    ensure(got == Some(key), || {
        format!("reset dropped an API key: {got:?}")
    })?;
    // A rebuild writes the catalog again while API replicas keep their cursor.
    let again = simple_market(&format!("{prefix}-m"), "q", T0);
    put(a, vec![(pos(p, 3), Event::Market(Box::new(again.clone())))]).await?;
    let (since, _) = b.catalog_changes(Some(&cursor)).await.map_err(store_err)?;
    ensure(since.contains(&Event::Market(Box::new(again))), || {
        format!("a record written after reset is missing from changes since an earlier cursor: {since:?}")
    })?;
    super::ticks::ticks_and_trade_ids_do_not_survive_reset(a, b, prefix).await
}

fn key_record(prefix: &str, seed: [u8; 32]) -> ApiKeyRecord {
    let mut hash = seed;
    for (i, byte) in prefix.bytes().enumerate() {
        hash[i % 32] ^= byte.wrapping_mul(31).wrapping_add(i as u8);
    }
    ApiKeyRecord {
        key_id: format!("key_{prefix}"),
        hash,
        organization: "conformance".into(),
        plan: "pro".into(),
        created_at: Timestamp(T0),
        revoked_at: None,
    }
}

/// Keys are found by their hash only, listed once each, and a revocation
/// or plan change (same key id and hash) replaces the stored key for every
/// handle.
pub async fn keys_found_by_hash_and_revocation_sticks(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let record = key_record(prefix, [0x5a; 32]);
    a.put_key(record.clone()).await.map_err(store_err)?;
    let got = b.key_by_hash(record.hash).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&record), || {
        format!("key by hash: {got:?}")
    })?;
    let mut other = record.hash;
    other[0] ^= 1;
    let got = b.key_by_hash(other).await.map_err(store_err)?;
    ensure(got.is_none(), || format!("another hash finds {got:?}"))?;
    let revoked = ApiKeyRecord {
        revoked_at: Some(Timestamp(T0 + 1)),
        plan: "free".into(),
        ..record.clone()
    };
    a.put_key(revoked.clone()).await.map_err(store_err)?;
    let got = b.key_by_hash(record.hash).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&revoked), || {
        format!("after revocation and a plan change, the key reads {got:?}")
    })?;
    let listed: Vec<ApiKeyRecord> = b
        .list_keys()
        .await
        .map_err(store_err)?
        .into_iter()
        .filter(|k| k.key_id == record.key_id)
        .collect();
    ensure(listed == vec![revoked], || {
        format!("list_keys holds {listed:?}")
    })
}

/// The decisions `take_hit` must make when hits are taken one at a time:
/// admitted iff fewer than `limit` admitted hits lie within
/// [`counted_range`] of the hit.
fn model(limit: usize, hits: &[i64]) -> Vec<bool> {
    let mut admitted: Vec<i64> = Vec::new();
    hits.iter()
        .map(|&t| {
            let (after, before) = counted_range(Timestamp(t));
            let counted = admitted
                .iter()
                .filter(|&&a| a > after.0 && a < before.0)
                .count();
            let ok = counted < limit;
            if ok {
                admitted.push(t);
            }
            ok
        })
        .collect()
}

/// One at a time, alternating handles, the decisions are exactly the
/// sliding window's: at the window's exclusive edge, a millisecond either
/// side of it, and with hits later than `now` (a replica whose clock runs
/// ahead) counted. Refused hits are not counted; `rate_hits` reads what
/// `take_hit` counts without taking one.
pub async fn rate_limit_decisions_are_the_sliding_window(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let key = format!("key_rate_{prefix}");
    const LIMIT: u32 = 3;
    let w = RATE_WINDOW_MS;
    // (when, admitted): the sliding window's decisions, spelled out.
    let steps = [
        (T0, true),
        (T0 + 10_000, true),
        (T0 + 10_000, true),     // two hits in one millisecond are two hits
        (T0 + 20_000, false),    // three in the window
        (T0 + w - 1, false),     // T0 is still inside
        (T0 + w, true),          // T0 has left: the window is open at its start
        (T0 + w, false),         // three again
        (T0 + w + 10_001, true), // both hits at T0 + 10 s have left
        (T0 + w + 10_001, true), // one at T0 + w, two now
        // A replica whose clock runs 40 s behind: the hits above lie in
        // its future, within a window, and count.
        (T0 + 30_000, false),
        (T0 + w + 50_000, false), // the latest three are within a window
        (T0 + 10 * w, true),      // long after: the window is empty
    ];
    let times: Vec<i64> = steps.iter().map(|(t, _)| *t).collect();
    let want: Vec<bool> = steps.iter().map(|(_, ok)| *ok).collect();
    ensure(model(LIMIT as usize, &times) == want, || {
        "the check's own steps disagree with the sliding window".into()
    })?;
    let mut got = Vec::new();
    for (i, &t) in times.iter().enumerate() {
        let (taker, reader) = if i % 2 == 0 { (a, b) } else { (b, a) };
        let before = reader
            .rate_hits(&key, Timestamp(t))
            .await
            .map_err(store_err)?;
        let taken = taker
            .take_hit(&key, Timestamp(t), LIMIT)
            .await
            .map_err(store_err)?;
        let after = reader
            .rate_hits(&key, Timestamp(t))
            .await
            .map_err(store_err)?;
        let mut expected = before.clone();
        if taken.admitted {
            expected.push(Timestamp(t));
            expected.sort();
        }
        ensure(taken.hits == expected && after == expected, || {
            format!(
                "hit {i} at T0 + {} ms: counted before {before:?}, take_hit returned {taken:?}, \
                 counted after {after:?}",
                t - T0
            )
        })?;
        got.push(taken.admitted);
    }
    ensure(got == want, || {
        format!("decisions {got:?}, the sliding window decides {want:?}")
    })
}

/// Many hits at once through both handles never admit more than the limit,
/// and the refused ones leave no trace: taken one at a time afterwards, hits
/// are admitted up to exactly the limit (whatever the race admitted).
pub async fn rate_limit_holds_under_concurrent_handles(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let key = format!("key_race_{prefix}");
    const LIMIT: u32 = 5;
    let now = |i: i64| Timestamp(T0 + i * 100);
    let takes: Vec<_> = (0..40)
        .map(|i| {
            let client = if i % 2 == 0 { a } else { b };
            let key = key.clone();
            async move { client.take_hit(&key, now(i), LIMIT).await }
        })
        .collect();
    let mut admitted = 0;
    for (i, taken) in join_all(takes).await.into_iter().enumerate() {
        let taken = taken.map_err(store_err)?;
        ensure(
            !taken.admitted || taken.hits.len() <= LIMIT as usize,
            || {
                format!(
                    "hit {i} was admitted counting {} hits: {taken:?}",
                    taken.hits.len()
                )
            },
        )?;
        admitted += usize::from(taken.admitted);
    }
    // Racers may all withdraw (the contract allows it), never overshoot.
    ensure(admitted <= LIMIT as usize, || {
        format!("40 concurrent hits with a limit of {LIMIT}: {admitted} admitted")
    })?;
    let counted = b.rate_hits(&key, now(40)).await.map_err(store_err)?;
    ensure(counted.len() == admitted, || {
        format!(
            "{admitted} admitted, but {} counted: {counted:?}",
            counted.len()
        )
    })?;
    let mut more = 0;
    for i in 0..LIMIT as i64 {
        let client = if i % 2 == 0 { b } else { a };
        let taken = client
            .take_hit(&key, now(41 + i), LIMIT)
            .await
            .map_err(store_err)?;
        more += usize::from(taken.admitted);
    }
    ensure(admitted + more == LIMIT as usize, || {
        format!("after {admitted} admitted in the race, {more} more were admitted one by one")
    })
}

/// Polls every future to completion, concurrently (on the calling task).
pub(crate) async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (future, out) in pending.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    done.into_iter()
        .map(|o| o.expect("polled to completion"))
        .collect()
}
