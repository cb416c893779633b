//! A running projector releases free memory once, when it finds the log
//! caught up after a backlog grew its steps, and not after steps that
//! kept up.

mod common;

use hindsight_contracts::{AppendBatch, EventLog, ProjectionStore};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::Event;
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static RELEASED: AtomicUsize = AtomicUsize::new(0);

fn count_release() {
    RELEASED.fetch_add(1, Ordering::SeqCst);
}

async fn append(log: &SqliteLog, events: Vec<Event>) {
    log.append(AppendBatch {
        events: events.into(),
        idempotency: None,
    })
    .await
    .unwrap();
}

/// Waits until the store's committed position reaches `offset`.
async fn committed(store: &SqliteStore, offset: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let at = store.committed().await.unwrap();
        if at.first().is_some_and(|p| p.offset >= offset) {
            return;
        }
        assert!(Instant::now() < deadline, "not projected: {at:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn free_memory_is_released_once_a_backlog_is_drained() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SqliteLog::open(dir.path()).unwrap());
    let store = Arc::new(SqliteStore::open(dir.path()).unwrap());
    // A backlog: 500 events, polled 10, 20, 40, … at a time.
    append(&log, common::ticks(0, 500, 3)).await;
    let source = Arc::new(EmbeddedSource {
        log: log.clone(),
        store: store.clone(),
    });
    let config = ProjectorConfig {
        batch_max: 10,
        backlog_batch_max: 1_000,
        idle_wait: Duration::from_millis(5),
        release_memory: Some(count_release),
        ..Default::default()
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(Projector::new(source, store.clone(), config).run(stopped));
    committed(&store, 499).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while RELEASED.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "never released after the backlog"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Steps that keep up (polls of fewer than `batch_max`) release nothing.
    for from in [500, 505, 510] {
        append(&log, common::ticks(from, 5, 3)).await;
        committed(&store, from as u64 + 4).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(RELEASED.load(Ordering::SeqCst), 1, "released once");
    // A second backlog, a second release.
    append(&log, common::ticks(515, 100, 3)).await;
    committed(&store, 614).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while RELEASED.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "never released after the second backlog"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.send(true).unwrap();
    running.await.unwrap();
    assert_eq!(RELEASED.load(Ordering::SeqCst), 2);
}
