//! Deterministic crash tests: the projector fails at a chosen step — an
//! apply that writes nothing, or one cut between its rows and its consumed
//! positions — is dropped as a crash would drop it, and a fresh projector
//! over the same store catches up. The read tables must then equal a clean
//! single-pass projection of the same log, row for row (sums compared
//! exactly: an event counted twice or lost shows).
//!
//! Beside them, the random SIGKILL tests (`tests/`) kill the real binary
//! wherever the scheduler lands; these hit every kind of step boundary on
//! every run.

mod common;

use common::{all_keys, tables, Tables};
use hindsight_contracts::conformance::log::sample_events;
use hindsight_contracts::faults::{FaultyLog, FaultyStore, LogFault, StoreFault};
use hindsight_contracts::{AppendBatch, AppendOutcome, EventLog, Idempotency, ProjectionStore};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::Event;
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Events per append: a few markets' worth, as an ingest batch.
const BATCH: usize = 40;
/// Events per projector step: small, so the log takes dozens of steps.
const STEP: usize = 23;

fn events() -> Vec<Event> {
    sample_events("crash", 8, 30)
}

/// Appends every event in batches, each under an idempotency key, retrying
/// a failed batch as an ingest client does.
async fn feed(log: &dyn EventLog, events: &[Event]) -> usize {
    let mut failures = 0;
    for (i, chunk) in events.chunks(BATCH).enumerate() {
        let batch = || AppendBatch {
            events: chunk.to_vec(),
            idempotency: Some(Idempotency {
                key: format!("batch-{i}"),
                response: b"ok".to_vec(),
            }),
        };
        loop {
            match log.append(batch()).await {
                Ok(AppendOutcome::Appended { .. } | AppendOutcome::Duplicate { .. }) => break,
                Err(_) => failures += 1,
            }
        }
    }
    failures
}

fn config() -> ProjectorConfig {
    ProjectorConfig {
        batch_max: STEP,
        idle_wait: Duration::from_millis(5),
        ..ProjectorConfig::default()
    }
}

async fn project(
    log: Arc<SqliteLog>,
    store: Arc<dyn ProjectionStore>,
) -> hindsight_contracts::Result<u64> {
    let source = Arc::new(EmbeddedSource {
        log,
        store: store.clone(),
    });
    Projector::new(source, store, config()).catch_up().await
}

/// The log of `events` in `dir`, and the tables of one clean pass over it.
async fn clean(dir: &Path, events: &[Event]) -> (Arc<SqliteLog>, Tables) {
    let log = Arc::new(SqliteLog::open(dir).unwrap());
    assert_eq!(feed(log.as_ref(), events).await, 0);
    let store_dir = dir.join("clean");
    let store = Arc::new(SqliteStore::open(&store_dir).unwrap());
    let projected = project(log.clone(), store.clone()).await.unwrap();
    assert_eq!(projected, events.len() as u64);
    let tables = tables(&store, events).await;
    assert!(tables.rows.len() > 300, "{} rows", tables.rows.len());
    (log, tables)
}

/// Projects through a store failing as `fault` says, then restarts a fresh
/// projector on the same store, and compares with the clean pass.
async fn crash_and_restart(
    log: &Arc<SqliteLog>,
    dir: &Path,
    fault: StoreFault,
    events: &[Event],
    want: &Tables,
) {
    let faulty = Arc::new(FaultyStore::new(SqliteStore::open(dir).unwrap(), fault));
    let failed = project(log.clone(), faulty.clone()).await;
    assert!(failed.is_err(), "{fault:?}: the projection did not fail");
    let n = match fault {
        StoreFault::FailApply(n) | StoreFault::CrashBeforePositions(n) => n,
    };
    assert_eq!(faulty.applies(), n, "{fault:?}: failed at another step");
    drop(faulty);

    // The restart: a new process's store handle and a new projector.
    let store = Arc::new(SqliteStore::open(dir).unwrap());
    let behind = store.committed().await.unwrap();
    let head = log.head().await.unwrap();
    assert!(
        behind.first().map_or(0, |p| p.offset) < head,
        "{fault:?}: nothing left to project after the failure"
    );
    if let StoreFault::CrashBeforePositions(_) = fault {
        // The crash really left rows ahead of the positions.
        let next = behind.first().map_or(0, |p| p.offset);
        let rows = store.load(all_keys(events)).await.unwrap();
        assert!(
            rows.iter().any(|r| r.last_offset >= next),
            "{fault:?}: no row is ahead of the committed position {next}"
        );
    }
    project(log.clone(), store.clone()).await.unwrap();
    let got = tables(&store, events).await;
    assert_eq!(got.committed, want.committed, "{fault:?}: positions");
    assert_eq!(got.catalog, want.catalog, "{fault:?}: catalog");
    assert_eq!(got.markets, want.markets, "{fault:?}: markets");
    assert_eq!(got.rows.len(), want.rows.len(), "{fault:?}: row count");
    for (g, w) in got.rows.iter().zip(&want.rows) {
        assert_eq!(g, w, "{fault:?}: row differs from the clean projection");
    }
}

/// Steps to fail at: the first, early, middle and late ones (the log takes
/// about 33 steps of 23 events).
const STEPS: [u64; 5] = [1, 2, 7, 16, 30];

#[tokio::test]
async fn a_failed_apply_then_a_restart_equals_a_clean_projection() {
    let dir = tempfile::tempdir().unwrap();
    let events = events();
    let (log, want) = clean(dir.path(), &events).await;
    for n in STEPS {
        let store_dir = dir.path().join(format!("fail-{n}"));
        crash_and_restart(&log, &store_dir, StoreFault::FailApply(n), &events, &want).await;
    }
}

#[tokio::test]
async fn a_crash_between_rows_and_positions_then_a_restart_equals_a_clean_projection() {
    let dir = tempfile::tempdir().unwrap();
    let events = events();
    let (log, want) = clean(dir.path(), &events).await;
    for n in STEPS {
        let store_dir = dir.path().join(format!("cut-{n}"));
        crash_and_restart(
            &log,
            &store_dir,
            StoreFault::CrashBeforePositions(n),
            &events,
            &want,
        )
        .await;
    }
}

/// A failed append retried under its idempotency key leaves the log, and so
/// the projection, as if it had succeeded the first time.
#[tokio::test]
async fn a_failed_append_retried_leaves_the_projection_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let events = events();
    let (_, want) = clean(&dir.path().join("clean-log"), &events).await;
    let faulty_dir = dir.path().join("faulty-log");
    let faulty = FaultyLog::new(
        SqliteLog::open(&faulty_dir).unwrap(),
        LogFault::FailAppend(3),
    );
    assert_eq!(feed(&faulty, &events).await, 1);
    assert_eq!(faulty.calls(), events.chunks(BATCH).count() as u64 + 1);
    let log = Arc::new(SqliteLog::open(&faulty_dir).unwrap());
    assert_eq!(log.head().await.unwrap(), events.len() as u64);
    let store = Arc::new(SqliteStore::open(&faulty_dir.join("store")).unwrap());
    project(log, store.clone()).await.unwrap();
    assert_eq!(tables(&store, &events).await, want);
}
