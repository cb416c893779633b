//! While the store writes one step, the projector folds into the next what
//! the log gains meanwhile (`Projector::top_up`): an event appended after
//! the next step's poll goes out with that step, not a step later, and
//! the tables are what a replay of the whole log makes; it stops at the
//! rows a step may touch; a poll that finds nothing beside the write
//! does not wait for it; and the write has begun before the next step's
//! poll.

mod common;

use common::{Hooked, Hooks};

use async_trait::async_trait;
use hindsight_contracts::{
    AppendBatch, Applied, EventLog, LogConsumer, Position, ProjectionStore, ProjectionWrite, Result,
};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::{Event, PriceTick, Resolution, Timestamp};
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, Semaphore};

/// Each `apply` held until the test lets one through, and each
/// `lookup_tokens` told to the test: the projector looks a token up when
/// it first meets it, so the test knows which events it has polled.
struct Gated {
    gate: Semaphore,
    applies: AtomicUsize,
    /// Each write's rows, in order.
    rows: std::sync::Mutex<Vec<usize>>,
    looked_up: mpsc::UnboundedSender<Vec<String>>,
}

#[async_trait]
impl Hooks for Gated {
    async fn apply(&self, inner: &SqliteStore, write: ProjectionWrite) -> Result<Applied> {
        self.applies.fetch_add(1, Ordering::SeqCst);
        self.rows.lock().unwrap().push(write.rows.len());
        self.gate.acquire().await.expect("never closed").forget();
        inner.apply(write).await
    }

    fn looking_up(&self, token_ids: &[String]) {
        let _ = self.looked_up.send(token_ids.to_vec());
    }
}

/// A log and store in `dir`, the store behind a [`Gated`] one, and a
/// projector with `config` reading partition 0.
struct Harness {
    log: Arc<SqliteLog>,
    inner: Arc<SqliteStore>,
    store: Arc<Hooked<Gated>>,
    /// What the projector looks up, as [`Gated`] tells it.
    lookups: mpsc::UnboundedReceiver<Vec<String>>,
    projector: Projector,
    consumer: Box<dyn LogConsumer>,
}

impl Harness {
    fn open(dir: &std::path::Path, config: ProjectorConfig) -> Self {
        let log = Arc::new(SqliteLog::open(dir).unwrap());
        let inner = Arc::new(SqliteStore::open(dir).unwrap());
        let (looked_up, lookups) = mpsc::unbounded_channel();
        let store = Arc::new(Hooked {
            inner: inner.clone(),
            hooks: Gated {
                gate: Semaphore::new(0),
                applies: AtomicUsize::new(0),
                rows: Default::default(),
                looked_up,
            },
        });
        let source = Arc::new(EmbeddedSource {
            log: log.clone(),
            store: inner.clone(),
        });
        let projector = Projector::new(source, store.clone(), config);
        let consumer = Box::new(log.consumer(0).unwrap());
        Harness {
            log,
            inner,
            store,
            lookups,
            projector,
            consumer,
        }
    }
}

/// One price tick for each of `tokens`, at tick number `at`.
fn one_each(tokens: impl IntoIterator<Item = String>, at: i64) -> Vec<Event> {
    tokens.into_iter().flat_map(|t| ticks(&t, at, 1)).collect()
}

/// `n` price ticks of token `token`, from tick number `from` (a second
/// apart).
fn ticks(token: &str, from: i64, n: i64) -> Vec<Event> {
    (from..from + n)
        .map(|i| {
            Event::Price(PriceTick {
                market_id: "m".into(),
                token_id: token.into(),
                ts: Timestamp(1_756_684_800_000 + i * 1_000),
                p: 0.25 + (i % 7) as f64 / 100.0,
            })
        })
        .collect()
}

async fn append(log: &SqliteLog, events: &[Event]) {
    log.append(AppendBatch {
        events: events.to_vec().into(),
        idempotency: None,
    })
    .await
    .unwrap();
}

impl Harness {
    /// Hands a step of `first` to the store, which holds it; polls
    /// `second` in the next step, and appends `during` while the first is
    /// still being written. Returns the tokens the projector looked up
    /// next (what it met of `during`), and lets the writes through only
    /// then: before the first write's end, unless the projector never
    /// met them (within 10 s; the writes go through anyway, so that a
    /// failure is reported, not a hang).
    async fn during_a_write(
        &mut self,
        first: &[Event],
        second: &[Event],
        during: &[Event],
    ) -> Vec<String> {
        append(&self.log, first).await;
        self.projector
            .advance(self.consumer.as_mut())
            .await
            .unwrap();
        self.lookups.recv().await.unwrap();
        append(&self.log, second).await;
        let step = async {
            self.projector
                .advance(self.consumer.as_mut())
                .await
                .unwrap();
            self.projector.settle(self.consumer.as_mut()).await.unwrap();
        };
        let feed = async {
            self.lookups.recv().await.unwrap();
            append(&self.log, during).await;
            let met = tokio::time::timeout(Duration::from_secs(10), self.lookups.recv()).await;
            self.store.hooks.gate.add_permits(10);
            met
        };
        let ((), met) = tokio::join!(step, feed);
        met.expect("the projector met them while the first write ran")
            .unwrap()
    }

    /// The store's tables, after checking that the whole of `all` is
    /// committed.
    async fn tables(&self, all: &[Event]) -> common::Tables {
        let got = common::tables(&self.inner, all).await;
        let offset = all.len() as u64;
        assert_eq!(
            got.committed,
            [Position {
                partition: 0,
                offset
            }]
        );
        got
    }
}

/// A step's write has begun by the time the projector turns to the next
/// step: the store writes while the projector polls and folds, rather than
/// after (`Projector::next_segment` yields once it hands the write over).
/// On one thread, a spawned task runs only when the test's task yields, so
/// the check does not depend on another worker picking the write up.
#[tokio::test]
async fn a_steps_write_has_begun_when_the_projector_turns_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::open(dir.path(), ProjectorConfig::default());
    append(&h.log, &ticks("a", 0, 30)).await;
    h.projector.advance(h.consumer.as_mut()).await.unwrap();
    // Nothing awaited since: only a write already running counted itself.
    assert_eq!(h.store.hooks.applies.load(Ordering::SeqCst), 1);
    h.store.hooks.gate.add_permits(1);
    h.projector.settle(h.consumer.as_mut()).await.unwrap();
    // Written and committed as before.
    h.tables(&ticks("a", 0, 30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_appended_while_a_write_runs_go_out_with_the_next_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::open(dir.path(), ProjectorConfig::default());
    // `c` is appended after step 2's poll of `b`, while step 1 is still
    // being written.
    let (a, b, c) = (ticks("a", 0, 30), ticks("b", 30, 20), ticks("c", 50, 10));
    assert_eq!(h.during_a_write(&a, &b, &c).await, ["c"]);

    // Two writes took all three batches: `c` went out with step 2.
    assert_eq!(h.store.hooks.applies.load(Ordering::SeqCst), 2);
    let all: Vec<Event> = [a, b, c].concat();
    let got = h.tables(&all).await;

    // What a replay of the whole log into a fresh store makes.
    let fresh = tempfile::tempdir().unwrap();
    let replay_log = Arc::new(SqliteLog::open(fresh.path()).unwrap());
    let replay = Arc::new(SqliteStore::open(fresh.path()).unwrap());
    append(&replay_log, &all).await;
    let source = Arc::new(EmbeddedSource {
        log: replay_log.clone(),
        store: replay.clone(),
    });
    let mut projector = Projector::new(source, replay.clone(), ProjectorConfig::rebuild());
    projector.catch_up().await.unwrap();
    assert_eq!(got, common::tables(&replay, &all).await);
}

/// A top-up stops where the step would pass `step_rows_max` rows, at the
/// rows per event it has touched so far, and leaves the rest of what the
/// log gained to the next step: a step's rows are most of its memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_up_keeps_the_step_within_its_rows() {
    // A price tick of a token not seen before dirties one row at each
    // resolution.
    const PER_TOKEN: usize = Resolution::ALL.len();
    let config = ProjectorConfig {
        step_rows_max: 25 * PER_TOKEN,
        ..ProjectorConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::open(dir.path(), config);
    // Step 2 polls 10 tokens' ticks; 40 more tokens' arrive while step 1
    // is held: room for 15 of them.
    let a = one_each(["a".to_string()], 0);
    let b = one_each((0..10).map(|i| format!("b{i}")), 1);
    let c = one_each((0..40).map(|i| format!("c{i}")), 2);
    let met = h.during_a_write(&a, &b, &c).await;
    assert_eq!(met.len(), 15, "what room was left for");
    // The rest goes out with the next step.
    h.projector.step(h.consumer.as_mut()).await.unwrap();

    let rows = h.store.hooks.rows.lock().unwrap().clone();
    assert_eq!(rows, [PER_TOKEN, 25 * PER_TOKEN, 25 * PER_TOKEN]);
    h.tables(&[a, b, c].concat()).await;
}

/// Run as a service ([`Projector::run`]), a projector whose poll finds
/// nothing while the store writes a step polls again instead of waiting
/// for the write: what the log gains meanwhile is folded beside it, and
/// goes out with the next step as soon as the write is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_poll_beside_a_write_does_not_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let Harness {
        log,
        inner,
        store,
        mut lookups,
        projector,
        ..
    } = Harness::open(dir.path(), ProjectorConfig::default());
    let (stop, shutdown) = watch::channel(false);
    let running = tokio::spawn(projector.run(shutdown));
    let (a, c) = (ticks("a", 0, 30), ticks("c", 30, 10));
    append(&log, &a).await;
    assert_eq!(lookups.recv().await.unwrap(), ["a"]);
    // Step 1 is with the store, held; the polls beside it find nothing
    // (each waits at most `TOP_UP_WAIT`, 5 ms, while the write runs).
    while store.hooks.applies.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    append(&log, &c).await;
    let met = tokio::time::timeout(Duration::from_secs(10), lookups.recv()).await;
    store.hooks.gate.add_permits(10);
    assert_eq!(
        met.expect("the projector polled `c` while step 1 was held")
            .unwrap(),
        ["c"]
    );

    let all: Vec<Event> = [a, c].concat();
    let everything = [Position {
        partition: 0,
        offset: all.len() as u64,
    }];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while common::tables(&inner, &all).await.committed != everything {
        assert!(tokio::time::Instant::now() < deadline, "both steps written");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.send(true).unwrap();
    running.await.unwrap();
    assert_eq!(store.hooks.applies.load(Ordering::SeqCst), 2);
}
