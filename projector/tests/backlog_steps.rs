//! Behind a backlog the projector's steps grow: each full poll doubles the
//! next, up to `backlog_batch_max`, and only as far as the last step's rows
//! per event let a step stay within `step_rows_max` rows — over many tokens
//! a step's rows, not its events, are what it holds in memory. A poll that
//! finds fewer events than it asked for sizes the next one to what it
//! found: the log had caught up, and about as many arrive during the next
//! step.

mod common;

use hindsight_contracts::{AppendBatch, EventLog};
use hindsight_projector::{Projector, ProjectorConfig, StepStats};
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::sync::Arc;

/// The steps that project `n` ticks over `tokens` tokens from the start of
/// a log, with `config`'s step sizes.
async fn steps(n: i64, tokens: i64, config: ProjectorConfig) -> Vec<StepStats> {
    let mut feed = Feed::new(config);
    feed.append(n, tokens).await;
    feed.project().await
}

/// A log, a store and a projector stepping through what is appended.
struct Feed {
    _dir: tempfile::TempDir,
    log: Arc<SqliteLog>,
    projector: Projector,
    consumer: Box<dyn hindsight_contracts::LogConsumer>,
    appended: i64,
    projected: i64,
}

impl Feed {
    fn new(config: ProjectorConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(SqliteLog::open(dir.path()).unwrap());
        let store = Arc::new(SqliteStore::open(dir.path()).unwrap());
        let source = Arc::new(EmbeddedSource {
            log: log.clone(),
            store: store.clone(),
        });
        Feed {
            projector: Projector::new(source, store, config),
            consumer: Box::new(log.consumer(0).unwrap()),
            log,
            _dir: dir,
            appended: 0,
            projected: 0,
        }
    }

    async fn append(&mut self, n: i64, tokens: i64) {
        self.log
            .append(AppendBatch {
                events: common::ticks(self.appended, n, tokens).into(),
                idempotency: None,
            })
            .await
            .unwrap();
        self.appended += n;
    }

    /// Steps until everything appended is projected.
    async fn project(&mut self) -> Vec<StepStats> {
        let mut steps = Vec::new();
        while self.projected < self.appended {
            let step = self.projector.step(self.consumer.as_mut()).await.unwrap();
            self.projected += step.events as i64;
            steps.push(step);
        }
        steps
    }
}

fn config(step_rows_max: usize) -> ProjectorConfig {
    ProjectorConfig {
        batch_max: 10,
        backlog_batch_max: 1_000,
        step_rows_max,
        ..Default::default()
    }
}

#[tokio::test]
async fn steps_double_up_to_the_backlog_bound_while_their_rows_are_few() {
    // Three tokens: a step of 640 ticks touches a few dozen rows.
    let steps = steps(3_000, 3, config(1_000)).await;
    let events: Vec<usize> = steps.iter().map(|s| s.events).collect();
    assert_eq!(events[..8], [10, 20, 40, 80, 160, 320, 640, 1_000]);
    assert!(steps.iter().all(|s| s.rows < 100), "{:?}", rows(&steps));
}

#[tokio::test]
async fn steps_grow_only_as_far_as_their_rows_allow() {
    // Every tick a new token: each touches 7 rows, one per resolution, so
    // 350 rows allow steps of 50 events.
    let steps = steps(2_000, 2_000, config(350)).await;
    let events: Vec<usize> = steps.iter().map(|s| s.events).collect();
    assert_eq!(events[..6], [10, 20, 40, 50, 50, 50], "{events:?}");
    assert!(steps.iter().all(|s| s.rows <= 350), "{:?}", rows(&steps));
}

#[tokio::test]
async fn steps_never_shrink_below_the_batch_for_their_rows() {
    // 35 rows would allow 5 events: steps stay at the 10 of `batch_max`.
    let steps = steps(200, 200, config(35)).await;
    assert!(steps.iter().all(|s| s.events == 10), "{:?}", rows(&steps));
}

#[tokio::test]
async fn a_poll_that_finds_fewer_events_sizes_the_next_to_what_it_found() {
    // 300 events: 10, 20, 40, 80, then 150 of the 160 asked for.
    let mut feed = Feed::new(config(1_000));
    feed.append(300, 3).await;
    let events: Vec<usize> = feed.project().await.iter().map(|s| s.events).collect();
    assert_eq!(events, [10, 20, 40, 80, 150]);
    // More arrive: the next step takes 150 of them, not the 10 of
    // `batch_max`, and grows from there.
    feed.append(1_000, 3).await;
    let events: Vec<usize> = feed.project().await.iter().map(|s| s.events).collect();
    assert_eq!(events, [150, 300, 550]);
    // Fewer again: the steps follow them down.
    feed.append(40, 3).await;
    let events: Vec<usize> = feed.project().await.iter().map(|s| s.events).collect();
    assert_eq!(events, [40]);
    // An empty poll (the projector idle) returns to `batch_max`.
    let idle = feed.projector.step(feed.consumer.as_mut()).await.unwrap();
    assert_eq!(idle.events, 0);
    feed.append(100, 3).await;
    let events: Vec<usize> = feed.project().await.iter().map(|s| s.events).collect();
    assert_eq!(events, [10, 20, 40, 30]);
}

fn rows(steps: &[StepStats]) -> Vec<(usize, usize)> {
    steps.iter().map(|s| (s.events, s.rows)).collect()
}
