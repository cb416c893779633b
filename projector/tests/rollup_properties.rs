//! Property tests of the rollup, run through the real projector over the
//! embedded SQLite log and store (on tmpfs when the machine has one).
//!
//! - Any split of the log into projector steps, with any number of
//!   restarts that re-deliver any suffix of what was already projected
//!   (with the in-memory rows kept, or dropped as by a crash), leaves the
//!   tables — rows, catalog, positions — equal to one pass over the log.
//! - Any interleaving of late events (the same events, appended in any
//!   order) serves the same buckets as the events appended in time order.
//! - Every row, and every point the read side serves from it, equals a
//!   naive model computed here: per bucket, the sums of the values in log
//!   order and their count (served as their average), the latest book
//!   snapshot by `(ts, log position)`, the last log position folded in.
//!
//! Case counts: proptest's default of 256 per property, or
//! `PROPTEST_CASES`; each property prints its count.

mod common;

use async_trait::async_trait;
use common::{row_key, tables};
use hindsight_contracts::{
    AppendBatch, Candle, Delivered, EventLog, LogConsumer, Mark, Position, ProjectionStore, Range,
    ReadStore, Row, RowKey, RowValue, Table,
};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::{
    BookLevel, BookSnapshot, Event, MarketRecord, MetricsSample, PriceTick, Resolution, Timestamp,
    Token,
};
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const T0: i64 = 1_756_684_800_000; // 2025-09-01T00:00:00Z
const TOKENS: [&str; 3] = ["t0", "t1", "t2"];
const MARKETS: [&str; 2] = ["m0", "m1"];

fn market_of(token: usize) -> &'static str {
    MARKETS[token / 2]
}

// ---- generated logs --------------------------------------------------------

/// Event times: often whole seconds of the first two minutes (events at
/// the same instant: ties between book snapshots), mostly within two hours
/// (many events share 1m and 5m buckets), some anywhere in three days
/// (coarse buckets, and events far out of order).
fn ts() -> impl Strategy<Value = Timestamp> {
    prop_oneof![
        2 => (0i64..120).prop_map(|s| s * 1000),
        3 => 0i64..7_200_000,
        1 => 0i64..3 * 86_400_000,
    ]
    .prop_map(|ms| Timestamp(T0 + ms))
}

/// Values for the rollup's sums. `dyadic` values (multiples of a power of
/// two, small) add exactly in any order, so that logs in different orders
/// can be compared bit for bit; otherwise any float in range.
#[derive(Clone, Copy)]
struct Values {
    dyadic: bool,
}

impl Values {
    fn scaled(self, max: f64, steps: u32) -> BoxedStrategy<f64> {
        if self.dyadic {
            (0..=steps)
                .prop_map(move |k| f64::from(k) * (max / f64::from(steps)))
                .boxed()
        } else {
            prop_oneof![1 => Just(0.0), 1 => Just(max), 8 => 0.0..=max].boxed()
        }
    }

    fn probability(self) -> BoxedStrategy<f64> {
        self.scaled(1.0, 256)
    }

    fn metric(self) -> BoxedStrategy<f64> {
        self.scaled(4096.0, 1 << 14)
    }
}

fn levels() -> impl Strategy<Value = Vec<BookLevel>> {
    prop::collection::vec((0.0..=1.0f64, 0.0..1e6f64), 0..3).prop_map(|levels| {
        levels
            .into_iter()
            .map(|(price, size)| BookLevel { price, size })
            .collect()
    })
}

fn market_data(values: Values) -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..TOKENS.len(), ts(), values.probability()).prop_map(|(t, ts, p)| {
            Event::Price(PriceTick {
                market_id: market_of(t).into(),
                token_id: TOKENS[t].into(),
                ts,
                p,
            })
        }),
        2 => (0..TOKENS.len(), ts(), levels(), levels()).prop_map(|(t, ts, bids, asks)| {
            Event::Book(Box::new(BookSnapshot {
                market_id: market_of(t).into(),
                token_id: TOKENS[t].into(),
                ts,
                bids,
                asks,
            }))
        }),
        2 => (0..MARKETS.len(), ts(), values.metric(), values.metric(), values.metric()).prop_map(
            |(m, ts, volume, liquidity, spread)| {
                Event::Metrics(MetricsSample {
                    market_id: MARKETS[m].into(),
                    ts,
                    volume,
                    liquidity,
                    spread,
                })
            }
        ),
    ]
}

/// A market upsert, so that the catalog goes through the same steps.
fn market_record() -> impl Strategy<Value = Event> {
    (
        0..MARKETS.len(),
        ts(),
        prop::sample::select(vec!["open", "closed"]),
    )
        .prop_map(|(m, updated_at, status)| {
            let tokens = (0..TOKENS.len()).filter(|t| market_of(*t) == MARKETS[m]);
            Event::Market(Box::new(MarketRecord {
                id: MARKETS[m].into(),
                slug: format!("{}-slug", MARKETS[m]),
                event_id: None,
                question: Some(format!("as of {updated_at}")),
                description: None,
                status: status.into(),
                start_date: None,
                end_date: None,
                closed_at: None,
                resolved_token_id: None,
                resolved_token_label: None,
                tokens: tokens
                    .map(|t| Token {
                        id: TOKENS[t].into(),
                        label: format!("label-{t}"),
                    })
                    .collect(),
                created_at: Timestamp(T0),
                updated_at,
            }))
        })
}

// ---- the naive model ---------------------------------------------------------

/// The rows a log must produce, computed without the rollup: every event
/// folded into its bucket at every resolution, in log order.
fn model(log: &[Event]) -> Vec<Row> {
    let mut rows: BTreeMap<RowKey, Row> = BTreeMap::new();
    for (offset, event) in log.iter().enumerate() {
        let offset = offset as u64;
        for res in Resolution::ALL {
            let Some(key) = row_key(event, res) else {
                continue;
            };
            let value = match (event, rows.get(&key).map(|r| &r.value)) {
                (Event::Price(e), None) => {
                    let m = Mark {
                        ts: e.ts,
                        offset,
                        p: e.p,
                    };
                    RowValue::Price {
                        sum: e.p,
                        count: 1,
                        candle: Some(Candle {
                            open: m,
                            close: m,
                            high: e.p,
                            low: e.p,
                        }),
                    }
                }
                (
                    Event::Price(e),
                    Some(RowValue::Price {
                        sum,
                        count,
                        candle: Some(c),
                    }),
                ) => {
                    // Earliest (ts, offset) opens, latest closes.
                    let m = Mark {
                        ts: e.ts,
                        offset,
                        p: e.p,
                    };
                    let before = |a: &Mark, b: &Mark| (a.ts, a.offset) < (b.ts, b.offset);
                    RowValue::Price {
                        sum: sum + e.p,
                        count: count + 1,
                        candle: Some(Candle {
                            open: if before(&m, &c.open) { m } else { c.open },
                            close: if before(&c.close, &m) { m } else { c.close },
                            high: if e.p > c.high { e.p } else { c.high },
                            low: if e.p < c.low { e.p } else { c.low },
                        }),
                    }
                }
                (Event::Metrics(e), None) => RowValue::Metrics {
                    volume_sum: e.volume,
                    liquidity_sum: e.liquidity,
                    spread_sum: e.spread,
                    count: 1,
                },
                (
                    Event::Metrics(e),
                    Some(RowValue::Metrics {
                        volume_sum,
                        liquidity_sum,
                        spread_sum,
                        count,
                    }),
                ) => RowValue::Metrics {
                    volume_sum: volume_sum + e.volume,
                    liquidity_sum: liquidity_sum + e.liquidity,
                    spread_sum: spread_sum + e.spread,
                    count: count + 1,
                },
                (Event::Book(e), held) => match held {
                    Some(RowValue::Book { ts, offset: o, .. }) if (*ts, *o) > (e.ts, offset) => {
                        held.unwrap().clone()
                    }
                    _ => RowValue::Book {
                        ts: e.ts,
                        offset,
                        bids: levels_json(&e.bids),
                        asks: levels_json(&e.asks),
                    },
                },
                (event, held) => unreachable!("{event:?} into {held:?}"),
            };
            rows.insert(
                key.clone(),
                Row {
                    key,
                    value,
                    last_offset: offset,
                },
            );
        }
    }
    rows.into_values().collect()
}

/// `[[price,size],…]`: how the API serves book sides.
fn levels_json(levels: &[BookLevel]) -> String {
    let pairs: Vec<[f64; 2]> = levels.iter().map(|l| [l.price, l.size]).collect();
    serde_json::to_string(&pairs).unwrap()
}

/// What the read side serves, per table, id and resolution: every bucket
/// as the API reads it (averages, latest book).
type Served = BTreeMap<(Table, &'static str, Resolution), Vec<String>>;

/// The points the model's rows must be served as.
fn served_from(rows: &[Row]) -> Served {
    let mut out = Served::new();
    for row in rows {
        let id = TOKENS
            .iter()
            .chain(&MARKETS)
            .find(|id| **id == &*row.key.id)
            .unwrap();
        let t = row.key.bucket;
        let point = match &row.value {
            RowValue::Price { sum, count, .. } => format!("{t} p={:?}", sum / *count as f64),
            RowValue::Metrics {
                volume_sum,
                liquidity_sum,
                spread_sum,
                count,
            } => {
                let n = *count as f64;
                format!(
                    "{t} volume={:?} liquidity={:?} spread={:?}",
                    volume_sum / n,
                    liquidity_sum / n,
                    spread_sum / n
                )
            }
            RowValue::Book { bids, asks, .. } => format!("{t} bids={bids} asks={asks}"),
        };
        out.entry((row.key.table, *id, row.key.res))
            .or_default()
            .push(point);
    }
    out
}

/// Reads every bucket of every series back through `ReadStore`.
async fn served(store: &SqliteStore) -> Served {
    let range = |res| Range {
        res,
        start: Timestamp(T0 - 86_400_000),
        end: Timestamp(T0 + 10 * 86_400_000),
        limit: 100_000,
    };
    let mut out = Served::new();
    for res in Resolution::ALL {
        for id in TOKENS {
            let prices = store.prices(id, range(res)).await.unwrap();
            let points = prices.iter().map(|p| format!("{} p={:?}", p.t, p.p));
            let points: Vec<String> = points.collect();
            if !points.is_empty() {
                out.insert((Table::Prices, id, res), points);
            }
            let books = store.books(id, range(res)).await.unwrap();
            let points: Vec<String> = books
                .iter()
                .map(|b| format!("{} bids={} asks={}", b.t, b.bids, b.asks))
                .collect();
            if !points.is_empty() {
                out.insert((Table::Books, id, res), points);
            }
        }
        for id in MARKETS {
            let metrics = store.metrics(id, range(res)).await.unwrap();
            let points: Vec<String> = metrics
                .iter()
                .map(|m| {
                    format!(
                        "{} volume={:?} liquidity={:?} spread={:?}",
                        m.t, m.volume, m.liquidity, m.spread
                    )
                })
                .collect();
            if !points.is_empty() {
                out.insert((Table::Metrics, id, res), points);
            }
        }
    }
    out
}

// ---- driving the projector ----------------------------------------------------

/// A consumer whose polls return at most the planned number of events,
/// so the projector's steps cut the log where the plan says.
struct Chunked<'a, C> {
    inner: C,
    sizes: std::slice::Iter<'a, usize>,
}

#[async_trait]
impl<C: LogConsumer> LogConsumer for Chunked<'_, C> {
    async fn poll(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> hindsight_contracts::Result<Vec<Delivered>> {
        let max = self.sizes.next().map_or(max, |size| max.min(*size));
        self.inner.poll(max, wait).await
    }

    async fn commit(&mut self, upto: &[Position]) -> hindsight_contracts::Result<()> {
        self.inner.commit(upto).await
    }

    async fn lag(&mut self) -> hindsight_contracts::Result<Vec<(u32, u64)>> {
        self.inner.lag().await
    }

    fn assignment_changed(&mut self) -> bool {
        self.inner.assignment_changed()
    }
}

/// After projector step `after_step`, a new consumer starts `back` events
/// before the durable position (re-delivering them), under a new projector
/// when `crash` (its in-memory rows lost) or the same one.
#[derive(Debug, Clone)]
struct Restart {
    after_step: usize,
    back: usize,
    crash: bool,
}

fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// A log holding `events`, appended in batches of the given sizes.
async fn log_of(dir: &Path, events: &[Event], appends: &[usize]) -> Arc<SqliteLog> {
    let log = Arc::new(SqliteLog::open(dir).unwrap());
    let mut rest = events;
    let mut sizes = appends.iter().copied().cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        let (batch, tail) = rest.split_at(n);
        log.append(AppendBatch {
            events: batch.to_vec().into(),
            idempotency: None,
        })
        .await
        .unwrap();
        rest = tail;
    }
    log
}

fn projector(log: &Arc<SqliteLog>, store: &Arc<SqliteStore>) -> Projector {
    let source = Arc::new(EmbeddedSource {
        log: log.clone(),
        store: store.clone(),
    });
    let config = ProjectorConfig {
        // Steps of 3 events, doubled after each full poll (up to the whole
        // log) and back to 3 after one that is not, as behind a backlog.
        batch_max: 3,
        backlog_batch_max: 1_000,
        idle_wait: Duration::from_millis(1),
        // Small, so that rows are forgotten and loaded again mid-log, with
        // a write in flight.
        max_cached_rows: 40,
        ..Default::default()
    };
    Projector::new(source, store.clone(), config)
}

/// Projects the whole log into `store`: steps cut by `polls`, with the
/// planned restarts.
async fn project(
    log: &Arc<SqliteLog>,
    store: &Arc<SqliteStore>,
    polls: &[usize],
    restarts: &[Restart],
) {
    // The store is new: as `hindsight rebuild` does, the projector empties
    // it first, and so skips loading the rows past its store's frontier
    // until a planned crash starts a projector that knows nothing.
    let mut projector = projector(log, store);
    projector.reset_store().await.unwrap();
    let chunked = |from| Chunked {
        inner: log.consumer(from).unwrap(),
        sizes: polls.iter(),
    };
    let mut consumer = chunked(0);
    let mut pending: Vec<&Restart> = restarts.iter().collect();
    pending.sort_by_key(|r| r.after_step);
    let mut pending = pending.into_iter().peekable();
    for step in 0.. {
        // Steps run as the projector runs them, a write in flight while
        // the next is folded, except before a planned restart, which
        // starts from the durable position.
        let restart = pending.next_if(|r| r.after_step <= step);
        let stats = match restart {
            Some(_) => projector.step(&mut consumer).await.unwrap(),
            None => projector.advance(&mut consumer).await.unwrap(),
        };
        if let Some(restart) = restart {
            let durable = store.committed().await.unwrap();
            let durable = durable.first().map_or(0, |p| p.offset);
            consumer = chunked(durable.saturating_sub(restart.back as u64));
            if restart.crash {
                projector = self::projector(log, store);
            }
            continue;
        }
        let caught_up = consumer.lag().await.unwrap().iter().all(|(_, n)| *n == 0);
        if stats.events == 0 && caught_up && pending.peek().is_none() {
            projector.settle(&mut consumer).await.unwrap();
            return;
        }
        assert!(step < 10_000, "the projection does not end");
    }
}

/// Checks `property` on proptest's number of cases (256, or
/// `PROPTEST_CASES`), printing that number past the test harness's output
/// capture, so that every run (CI included) shows it.
fn run_property<S, F, Fut>(property: &str, strategy: S, check: F)
where
    S: Strategy,
    F: Fn(S::Value) -> Fut,
    Fut: std::future::Future<Output = Result<(), TestCaseError>>,
{
    let config = ProptestConfig::default();
    let _ = writeln!(
        std::io::stderr(),
        "proptest {property}: {} cases (PROPTEST_CASES overrides)",
        config.cases
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    TestRunner::new(config)
        .run(&strategy, |value| rt.block_on(check(value)))
        .unwrap();
}

// ---- the properties --------------------------------------------------------------

#[derive(Debug, Clone)]
struct SplitPlan {
    events: Vec<Event>,
    appends: Vec<usize>,
    polls: Vec<usize>,
    restarts: Vec<Restart>,
}

fn split_plan() -> impl Strategy<Value = SplitPlan> {
    let event = prop_oneof![9 => market_data(Values { dyadic: false }), 1 => market_record()];
    (
        prop::collection::vec(event, 1..80),
        prop::collection::vec(1..40usize, 1..6),
        prop::collection::vec(1..30usize, 0..40),
        prop::collection::vec(
            (0..25usize, 0..100usize, any::<bool>()).prop_map(|(after_step, back, crash)| {
                Restart {
                    after_step,
                    back,
                    crash,
                }
            }),
            0..4,
        ),
    )
        .prop_map(|(events, appends, polls, restarts)| SplitPlan {
            events,
            appends,
            polls,
            restarts,
        })
}

async fn check_split(plan: SplitPlan) -> Result<(), TestCaseError> {
    let dir = scratch_dir();
    let log = log_of(&dir.path().join("log"), &plan.events, &plan.appends).await;

    let one_pass = Arc::new(SqliteStore::open(&dir.path().join("one-pass")).unwrap());
    project(&log, &one_pass, &[plan.events.len()], &[]).await;
    let want = tables(&one_pass, &plan.events).await;
    prop_assert_eq!(
        &want.rows,
        &model(&plan.events),
        "one pass against the model"
    );
    prop_assert_eq!(&served(&one_pass).await, &served_from(&want.rows));

    let split = Arc::new(SqliteStore::open(&dir.path().join("split")).unwrap());
    project(&log, &split, &plan.polls, &plan.restarts).await;
    let got = tables(&split, &plan.events).await;
    prop_assert_eq!(got.rows.len(), want.rows.len());
    for (g, w) in got.rows.iter().zip(&want.rows) {
        prop_assert_eq!(g, w);
    }
    prop_assert_eq!(got, want);
    Ok(())
}

#[test]
fn any_split_and_any_redelivery_give_the_tables_of_one_pass_and_the_model() {
    run_property(
        "any_split_and_any_redelivery_give_the_tables_of_one_pass_and_the_model",
        split_plan(),
        check_split,
    );
}

#[derive(Debug, Clone)]
struct Interleaving {
    /// In time order.
    events: Vec<Event>,
    /// The same events in the order they reach the log.
    arrival: Vec<Event>,
    polls: Vec<usize>,
}

fn time_of(event: &Event) -> Timestamp {
    match event {
        Event::Price(e) => e.ts,
        Event::Book(e) => e.ts,
        Event::Metrics(e) => e.ts,
        _ => unreachable!("market data only"),
    }
}

fn interleaving() -> impl Strategy<Value = Interleaving> {
    prop::collection::vec(market_data(Values { dyadic: true }), 1..80)
        .prop_map(|mut events| {
            // Two snapshots of one token at one instant are ordered by log
            // position, which an interleaving changes: keep instants unique.
            let mut seen = BTreeSet::new();
            for e in &mut events {
                if let Event::Book(b) = e {
                    while !seen.insert((b.token_id.clone(), b.ts)) {
                        b.ts.0 += 1;
                    }
                }
            }
            events.sort_by_key(time_of);
            events
        })
        .prop_flat_map(|events| {
            (
                Just(events.clone()),
                Just(events).prop_shuffle(),
                prop::collection::vec(1..30usize, 0..40),
            )
        })
        .prop_map(|(events, arrival, polls)| Interleaving {
            events,
            arrival,
            polls,
        })
}

async fn check_interleaving(plan: Interleaving) -> Result<(), TestCaseError> {
    let dir = scratch_dir();
    let in_order = log_of(&dir.path().join("in-order"), &plan.events, &[64]).await;
    let late = log_of(&dir.path().join("late"), &plan.arrival, &[7]).await;
    let want_store = Arc::new(SqliteStore::open(&dir.path().join("in-order-store")).unwrap());
    project(&in_order, &want_store, &[plan.events.len()], &[]).await;
    let got_store = Arc::new(SqliteStore::open(&dir.path().join("late-store")).unwrap());
    project(&late, &got_store, &plan.polls, &[]).await;

    let rows = tables(&got_store, &plan.arrival).await.rows;
    prop_assert_eq!(
        &rows,
        &model(&plan.arrival),
        "late arrivals against the model"
    );
    let want = served(&want_store).await;
    let got = served(&got_store).await;
    prop_assert_eq!(&got, &served_from(&rows));
    prop_assert_eq!(got, want, "served buckets depend on arrival order");
    Ok(())
}

#[test]
fn any_interleaving_of_late_events_serves_the_buckets_of_time_order() {
    run_property(
        "any_interleaving_of_late_events_serves_the_buckets_of_time_order",
        interleaving(),
        check_interleaving,
    );
}

/// The model is not the rollup restated: hand-computed buckets.
#[test]
fn the_model_folds_by_hand_computed_rules() {
    let tick = |ms: i64, p: f64| {
        Event::Price(PriceTick {
            market_id: "m0".into(),
            token_id: "t0".into(),
            ts: Timestamp(T0 + ms),
            p,
        })
    };
    let book = |ms: i64, bid: f64| {
        Event::Book(Box::new(BookSnapshot {
            market_id: "m0".into(),
            token_id: "t0".into(),
            ts: Timestamp(T0 + ms),
            bids: vec![BookLevel {
                price: bid,
                size: 2.0,
            }],
            asks: vec![],
        }))
    };
    let rows = model(&[
        tick(70_000, 0.5),
        tick(10_000, 0.25),
        book(50_000, 0.4),
        book(50_000, 0.3),
        book(20_000, 0.2),
    ]);
    let row = |table, res, bucket_ms: i64| {
        rows.iter()
            .find(|r| {
                r.key.table == table
                    && r.key.res == res
                    && r.key.bucket == Timestamp(T0 + bucket_ms)
            })
            .unwrap()
    };
    let at = |ms: i64, offset: u64, p: f64| Mark {
        ts: Timestamp(T0 + ms),
        offset,
        p,
    };
    assert_eq!(
        row(Table::Prices, Resolution::M1, 0).value,
        RowValue::Price {
            sum: 0.25,
            count: 1,
            candle: Some(Candle {
                open: at(10_000, 1, 0.25),
                close: at(10_000, 1, 0.25),
                high: 0.25,
                low: 0.25
            })
        }
    );
    // The late tick (offset 1) opens the hour; the first one closes it.
    assert_eq!(
        row(Table::Prices, Resolution::H1, 0).value,
        RowValue::Price {
            sum: 0.75,
            count: 2,
            candle: Some(Candle {
                open: at(10_000, 1, 0.25),
                close: at(70_000, 0, 0.5),
                high: 0.5,
                low: 0.25
            })
        }
    );
    let books = row(Table::Books, Resolution::M1, 0);
    assert_eq!(
        books.value,
        RowValue::Book {
            ts: Timestamp(T0 + 50_000),
            offset: 3,
            bids: "[[0.3,2.0]]".into(),
            asks: "[]".into()
        },
        "latest instant, the later of two at that instant"
    );
    assert_eq!(books.last_offset, 4);
    assert_eq!(
        served_from(&rows)[&(Table::Prices, "t0", Resolution::H1)],
        ["2025-09-01T00:00:00Z p=0.375"]
    );
}
