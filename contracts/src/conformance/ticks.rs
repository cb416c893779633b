//! Tick-level checks: [`ReadStore::ticks`], [`ReadStore::book_at`] and the
//! tick clauses of [`ProjectionStore::apply`] (keyed ticks, a trade id
//! counting once). Run by the store suite (re-exported from
//! [`super::store`]).

use super::{ensure, store_err, Backend, Check, T0};
use crate::store::*;
use crate::Position;
use hindsight_schemas::{Timestamp, TradeSide};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

fn partition_of(prefix: &str) -> u32 {
    let h = prefix.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    1_000 + (h % 1_000_000) * 8
}

fn tick(token: &str, ts: i64, p: u32, offset: u64, value: TickValue) -> Tick {
    Tick {
        token_id: token.into(),
        key: TickKey::of(
            Timestamp(ts),
            Position {
                partition: p,
                offset,
            },
        ),
        value,
    }
}

fn price(p: f64) -> TickValue {
    TickValue::Price { p }
}

fn book(bid: f64) -> TickValue {
    TickValue::Book {
        bids: format!("[[{bid},10.0]]").into(),
        asks: "[[0.9,1.5]]".into(),
    }
}

fn trade(price: f64, side: TradeSide, id: Option<&str>) -> TickValue {
    TickValue::Trade {
        price,
        size: 2.5,
        side,
        trade_id: id.map(Box::from),
    }
}

async fn apply(store: &dyn Backend, ticks: Vec<Tick>) -> Check {
    store
        .apply(ProjectionWrite {
            ticks,
            ..Default::default()
        })
        .await
        .map(|_| ())
        .map_err(store_err)
}

async fn read(
    store: &dyn Backend,
    kind: TickKind,
    token: &str,
    from: TickKey,
    end: i64,
    limit: usize,
) -> Result<Vec<Tick>, String> {
    store
        .ticks(
            kind,
            token,
            TickRange {
                from,
                end: Timestamp(end),
                limit,
            },
        )
        .await
        .map_err(store_err)
}

/// Pages through a token's ticks `per` at a time, as the API does.
async fn read_all(
    store: &dyn Backend,
    kind: TickKind,
    token: &str,
    end: i64,
    per: usize,
) -> Result<Vec<Tick>, String> {
    let mut out: Vec<Tick> = Vec::new();
    let mut from = TickKey::at(Timestamp(0));
    loop {
        let page = read(store, kind, token, from, end, per).await?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        from = TickKey {
            offset: last.key.offset + 1,
            ..last.key
        };
        let full = page.len() == per;
        out.extend(page);
        if !full {
            return Ok(out);
        }
    }
}

/// Every tick of each kind reads back exactly, in (ts, position) order —
/// ticks sharing a millisecond included — over years of empty time, paged
/// from a key without losing or repeating one; `end` is exclusive; a
/// replayed write leaves one row per tick.
pub async fn ticks_round_trip_in_key_order_and_page(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let p = partition_of(prefix);
    let tok = format!("{prefix}-tok");
    let times = [
        T0,
        T0 + 1,
        T0 + 1,
        T0 + 1,
        T0 + HOUR - 1,
        T0 + 5 * HOUR,
        T0 + 900 * DAY,
        T0 + 3650 * DAY,
    ];
    let mut written = Vec::new();
    // Written out of time order, and the three at T0+1 by falling offsets
    // within one write: order comes from the key, not from arrival.
    for (i, ts) in times.iter().enumerate().rev() {
        let offset = 100 - i as u64;
        written.push(tick(&tok, *ts, p, offset, price(i as f64 / 10.0)));
        written.push(tick(&tok, *ts, p, 200 + offset, book(i as f64 / 100.0)));
        let side = if i % 2 == 0 {
            TradeSide::Buy
        } else {
            TradeSide::Sell
        };
        let id = (i % 3 == 0).then(|| format!("{prefix}-x{i}"));
        written.push(tick(
            &tok,
            *ts,
            p,
            400 + offset,
            trade(0.5, side, id.as_deref()),
        ));
    }
    let (first, second) = written.split_at(7);
    apply(a, first.to_vec()).await?;
    apply(a, second.to_vec()).await?;
    // A replay of the first write.
    apply(a, first.to_vec()).await?;
    let end = T0 + 3650 * DAY;
    for kind in TickKind::ALL {
        let mut expected: Vec<Tick> = written
            .iter()
            .filter(|t| t.kind() == kind && t.key.ts.0 < end)
            .cloned()
            .collect();
        expected.sort_by_key(|t| t.key);
        let whole = read(b, kind, &tok, TickKey::at(Timestamp(0)), end, 100).await?;
        ensure(whole == expected, || {
            format!("{kind:?}: read {whole:#?}, wrote {expected:#?}")
        })?;
        for per in [1, 2, 3] {
            let paged = read_all(b, kind, &tok, end, per).await?;
            ensure(paged == expected, || {
                format!("{kind:?} paged by {per}: {paged:#?}, wrote {expected:#?}")
            })?;
        }
        // From the middle of the millisecond holding three ticks.
        let mid = expected[2].key;
        let rest = read(b, kind, &tok, mid, end, 100).await?;
        ensure(rest[..] == expected[2..], || {
            format!("{kind:?} from {mid:?}: {rest:#?}")
        })?;
        let other = read(
            b,
            kind,
            &format!("{prefix}-other"),
            TickKey::at(Timestamp(0)),
            end,
            10,
        )
        .await?;
        ensure(other.is_empty(), || {
            format!("another token reads ticks: {other:?}")
        })?;
    }
    Ok(())
}

/// `count_ticks` is the number of ticks `ticks` serves over a span, for
/// every kind: over partition edges and years of empty time, a replayed
/// write and a repeated trade id counted once, `end` exclusive, an empty or
/// reversed span 0, another token's ticks never.
pub async fn tick_counts_are_the_ticks_a_span_holds(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let p = partition_of(prefix);
    let tok = format!("{prefix}-tok");
    let times = [
        T0,
        T0 + 1,
        T0 + 1,
        T0 + HOUR - 1,
        T0 + HOUR,
        T0 + 5 * HOUR,
        T0 + 900 * DAY,
        T0 + 3650 * DAY,
    ];
    let mut written = Vec::new();
    for (i, ts) in times.iter().enumerate() {
        let offset = 10 * i as u64;
        written.push(tick(&tok, *ts, p, offset, price(0.5)));
        written.push(tick(&tok, *ts, p, offset + 1, book(0.4)));
        written.push(tick(
            &tok,
            *ts,
            p,
            offset + 2,
            trade(0.5, TradeSide::Buy, Some(&format!("{prefix}-t{}", i % 5))),
        ));
    }
    written.push(tick(&format!("{prefix}-other"), T0 + 2, p, 500, price(0.1)));
    apply(a, written.clone()).await?;
    apply(a, written[..9].to_vec()).await?;
    let spans = [
        (0, T0 + 3650 * DAY + 1),
        (T0, T0 + 3650 * DAY),
        (T0 + 1, T0 + HOUR),
        (T0 + HOUR - 1, T0 + 5 * HOUR + 1),
        (T0 + 2, T0 + 900 * DAY),
        (T0 + 5 * HOUR, T0 + 5 * HOUR),
        (T0 + 5 * HOUR, T0),
    ];
    for kind in TickKind::ALL {
        for (start, end) in spans {
            let counted = b
                .count_ticks(kind, &tok, Timestamp(start), Timestamp(end))
                .await
                .map_err(store_err)?;
            let served = if end > start {
                read(b, kind, &tok, TickKey::at(Timestamp(start)), end, 1_000)
                    .await?
                    .len() as u64
            } else {
                0
            };
            ensure(counted == served, || {
                format!("{kind:?} in [{start}, {end}): counted {counted}, ticks serves {served}")
            })?;
            // Independently of `ticks`: prices and books one per time;
            // trades once per id (ids repeat every 5 times).
            let in_span = times.iter().filter(|t| (start..end).contains(*t)).count() as u64;
            let firsts = times
                .iter()
                .take(5)
                .filter(|t| (start..end).contains(*t))
                .count() as u64;
            let want = if kind == TickKind::Trade {
                firsts
            } else {
                in_span
            };
            ensure(counted == want, || {
                format!("{kind:?} in [{start}, {end}): counted {counted}, wrote {want}")
            })?;
        }
    }
    Ok(())
}

/// A trade id counts once per token: repeated in the same write, in a later
/// write, or replayed at its first position, one trade is stored — the
/// first; trades without an id all count; another token's equal id is its
/// own.
pub async fn trade_ids_count_once_whatever_write_they_come_in(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let p = partition_of(prefix);
    let tok = format!("{prefix}-tok");
    let other = format!("{prefix}-other");
    let id = Some("T-1");
    let first = tick(&tok, T0 + 10, p, 1, trade(0.4, TradeSide::Buy, id));
    let anonymous = tick(&tok, T0 + 10, p, 2, trade(0.4, TradeSide::Buy, None));
    let repeated_in_write = tick(&tok, T0 + 20, p, 3, trade(0.41, TradeSide::Sell, id));
    let anonymous_again = tick(&tok, T0 + 10, p, 4, trade(0.4, TradeSide::Buy, None));
    let elsewhere = tick(&other, T0 + 30, p, 5, trade(0.6, TradeSide::Sell, id));
    let batch_one = vec![
        first.clone(),
        anonymous.clone(),
        repeated_in_write,
        anonymous_again.clone(),
        elsewhere.clone(),
    ];
    apply(a, batch_one.clone()).await?;
    // Later writes: the id again (earlier in time, too), then a replay of
    // the first write.
    let repeated_later = tick(&tok, T0 + 5, p, 9, trade(0.39, TradeSide::Buy, id));
    apply(a, vec![repeated_later]).await?;
    apply(a, batch_one).await?;
    let end = T0 + DAY;
    let got = read(
        b,
        TickKind::Trade,
        &tok,
        TickKey::at(Timestamp(0)),
        end,
        100,
    )
    .await?;
    let expected = vec![first, anonymous, anonymous_again];
    ensure(got == expected, || {
        format!("trades of {tok}: {got:#?}, expected {expected:#?}")
    })?;
    let got = read(
        b,
        TickKind::Trade,
        &other,
        TickKey::at(Timestamp(0)),
        end,
        100,
    )
    .await?;
    ensure(got == vec![elsewhere], || {
        format!("another token's trade with the same id: {got:#?}")
    })
}

/// Trade totals are the sums and counts of the stored (deduplicated)
/// trades per bucket, computed here from the trades written: a trade id
/// repeated in a later write counts once, a replay changes nothing, whole
/// buckets are summed where the range's ends cut them, buckets without
/// trades are absent, `limit` counts buckets, and a paged read (more trades
/// than one `ticks` page) sums the same.
pub async fn trade_totals_sum_the_deduplicated_trades_per_bucket(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    use hindsight_schemas::Resolution;
    const MIN: i64 = 60_000;
    let p = partition_of(prefix);
    let tok = format!("{prefix}-tok");
    let sized = |ts: i64, offset: u64, size: f64, id: Option<&str>| {
        tick(
            &tok,
            ts,
            p,
            offset,
            TickValue::Trade {
                price: 0.5,
                size,
                side: TradeSide::Buy,
                trade_id: id.map(Box::from),
            },
        )
    };
    // Bucket 0 (minute): three trades, one with an id; bucket 1: the last
    // millisecond of it only; bucket 3: a trade at its first millisecond;
    // bucket 60 (the next hour): one. Sizes whose sum depends on order.
    let kept = vec![
        sized(T0, 1, 0.1, Some("A")),
        sized(T0 + 10, 2, 0.2, None),
        sized(T0 + 10, 3, 0.3, None),
        sized(T0 + 2 * MIN - 1, 4, 1e16, Some("B")),
        sized(T0 + 3 * MIN, 5, 1.0, None),
        sized(T0 + 60 * MIN + 7, 6, 2.5, Some("C")),
    ];
    // The same ids at later positions (in the same write and a later one).
    let repeated_now = sized(T0 + 30, 7, 100.0, Some("B"));
    let repeated_later = sized(T0 + 3 * MIN + 1, 8, 200.0, Some("A"));
    let mut first = kept.clone();
    first.push(repeated_now);
    apply(a, first.clone()).await?;
    apply(a, vec![repeated_later]).await?;
    apply(a, first).await?;
    // Independently: the kept trades, bucketed, summed in key order.
    let expect = |res: Resolution, from: i64, end: i64, limit: usize| {
        let w = res.width_ms();
        let mut sorted = kept.clone();
        sorted.sort_by_key(|t| t.key);
        let mut out: Vec<(Timestamp, TradeTotals)> = Vec::new();
        for t in sorted {
            let bucket = t.key.ts.0.div_euclid(w) * w;
            let TickValue::Trade { size, .. } = t.value else {
                unreachable!()
            };
            if bucket < from || bucket >= end {
                continue;
            }
            match out.last_mut() {
                Some((b, tot)) if b.0 == bucket => {
                    tot.volume += size;
                    tot.count += 1;
                }
                _ => out.push((
                    Timestamp(bucket),
                    TradeTotals {
                        volume: size,
                        count: 1,
                    },
                )),
            }
        }
        out.truncate(limit);
        out
    };
    let cases = [
        (Resolution::M1, T0, T0 + DAY, 100),
        (Resolution::H1, T0, T0 + DAY, 100),
        (Resolution::D1, T0, T0 + DAY, 100),
        // Ends inside buckets: from bucket 1's middle (bucket 2 on), to
        // bucket 60's first millisecond (bucket 60 whole).
        (Resolution::M1, T0 + MIN + 5, T0 + 60 * MIN + 1, 100),
        (Resolution::M1, T0, T0 + DAY, 2),
    ];
    for (res, start, end, limit) in cases {
        let range = Range {
            res,
            start: Timestamp(start),
            end: Timestamp(end),
            limit,
        };
        let got = b.trade_totals(&tok, range).await.map_err(store_err)?;
        let w = res.width_ms();
        let from = start.div_euclid(w) * w + if start.rem_euclid(w) == 0 { 0 } else { w };
        let want = expect(res, from, end, limit);
        ensure(got == want, || {
            format!("totals of {range:?}: {got:#?}, expected {want:#?}")
        })?;
    }
    ensure(
        expect(Resolution::M1, T0, T0 + DAY, 100)
            .iter()
            .map(|(_, t)| t.count)
            .sum::<u64>()
            == 6,
        || "the check's own expectation lost a trade".into(),
    )?;
    // More trades than one ticks page: summed across pages alike.
    let many = format!("{prefix}-many");
    let n = TRADE_TOTALS_PAGE + 5;
    let bulk: Vec<Tick> = (0..n)
        .map(|i| {
            tick(
                &many,
                T0 + (i as i64 % 3) * MIN,
                p,
                1_000 + i as u64,
                TickValue::Trade {
                    price: 0.5,
                    size: 0.1 * (i % 7) as f64,
                    side: TradeSide::Sell,
                    trade_id: None,
                },
            )
        })
        .collect();
    apply(a, bulk.clone()).await?;
    let mut want: Vec<(Timestamp, TradeTotals)> = Vec::new();
    let mut sorted = bulk;
    sorted.sort_by_key(|t| t.key);
    for t in sorted {
        let TickValue::Trade { size, .. } = t.value else {
            unreachable!()
        };
        match want.last_mut() {
            Some((b, tot)) if *b == t.key.ts => {
                tot.volume += size;
                tot.count += 1;
            }
            _ => want.push((
                t.key.ts,
                TradeTotals {
                    volume: size,
                    count: 1,
                },
            )),
        }
    }
    let range = Range {
        res: Resolution::M1,
        start: Timestamp(T0),
        end: Timestamp(T0 + DAY),
        limit: 100,
    };
    let got = b.trade_totals(&many, range).await.map_err(store_err)?;
    ensure(got == want, || {
        format!("totals over several pages: {got:?}, expected {want:?}")
    })
}

/// The book at a moment is the snapshot with the greatest key at or before
/// it (of two at one instant, the later log position), however many empty
/// time partitions lie between; none before the first, none before `since`.
pub async fn book_at_is_the_latest_snapshot_at_or_before(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let p = partition_of(prefix);
    let tok = format!("{prefix}-tok");
    let s0 = tick(&tok, T0, p, 1, book(0.1));
    let s1 = tick(&tok, T0 + HOUR, p, 3, book(0.2));
    let s1_same_instant_earlier_in_log = tick(&tok, T0 + HOUR, p, 2, book(0.3));
    let s2 = tick(&tok, T0 + 400 * DAY, p, 4, book(0.4));
    // Price ticks and trades of the token are not snapshots.
    let noise = vec![
        tick(&tok, T0 + 2 * HOUR, p, 5, price(0.5)),
        tick(&tok, T0 + 2 * HOUR, p, 6, trade(0.5, TradeSide::Buy, None)),
    ];
    let mut all = vec![
        s2.clone(),
        s1.clone(),
        s1_same_instant_earlier_in_log,
        s0.clone(),
    ];
    all.extend(noise);
    apply(a, all).await?;
    let since = Timestamp(T0 - 1000 * DAY);
    let cases = [
        (T0 - 1, None),
        (T0, Some(&s0)),
        (T0 + HOUR - 1, Some(&s0)),
        (T0 + HOUR, Some(&s1)),
        (T0 + 399 * DAY, Some(&s1)),
        (T0 + 400 * DAY, Some(&s2)),
        (T0 + 4000 * DAY, Some(&s2)),
    ];
    for (at, want) in cases {
        let got = b
            .book_at(&tok, since, Timestamp(at))
            .await
            .map_err(store_err)?;
        ensure(got.as_ref() == want, || {
            format!("book at {at}: {got:?}, expected {want:?}")
        })?;
    }
    let got = b
        .book_at(&tok, Timestamp(T0 + HOUR + 1), Timestamp(T0 + 399 * DAY))
        .await
        .map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("a snapshot before `since` was answered: {got:?}")
    })?;
    let got = b
        .book_at(&format!("{prefix}-none"), since, Timestamp(T0 + DAY))
        .await
        .map_err(store_err)?;
    ensure(got.is_none(), || {
        format!("a token without snapshots has a book: {got:?}")
    })
}

/// For the reset check: ticks and trade ids written before a reset are
/// gone after it, and the same trade id is stored again.
pub(crate) async fn ticks_and_trade_ids_do_not_survive_reset(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let p = partition_of(prefix);
    let tok = format!("{prefix}-ticks");
    let before = vec![
        tick(&tok, T0, p, 1, price(0.5)),
        tick(&tok, T0, p, 2, book(0.5)),
        tick(&tok, T0, p, 3, trade(0.5, TradeSide::Buy, Some("R"))),
    ];
    apply(a, before).await?;
    a.reset().await.map_err(store_err)?;
    for kind in TickKind::ALL {
        let got = read(b, kind, &tok, TickKey::at(Timestamp(0)), T0 + DAY, 10).await?;
        ensure(got.is_empty(), || {
            format!("{kind:?} survive reset: {got:?}")
        })?;
    }
    let again = tick(&tok, T0 + 1, p, 7, trade(0.5, TradeSide::Buy, Some("R")));
    apply(a, vec![again.clone()]).await?;
    let got = read(
        b,
        TickKind::Trade,
        &tok,
        TickKey::at(Timestamp(0)),
        T0 + DAY,
        10,
    )
    .await?;
    ensure(got == vec![again], || {
        format!("a trade id stored before reset is still taken after it: {got:?}")
    })?;
    a.reset().await.map_err(store_err)
}
