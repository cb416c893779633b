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
use hindsight_contracts::conformance::{self, T0};
use hindsight_contracts::faults::{FaultyLog, FaultyStore, LogFault, StoreFault};
use hindsight_contracts::{
    AppendBatch, AppendOutcome, EventLog, Idempotency, ProjectionStore, ReadStore, RowKey, Table,
};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::{Event, PriceTick, Resolution, Timestamp};
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Events per append: a few markets' worth, as an ingest batch.
const BATCH: usize = 40;
/// Events per projector step: small, so the log takes dozens of steps.
const STEP: usize = 23;

/// The sample log with what the catalog rule decides on spread through it
/// (`hindsight_schemas::claims`): markets listing a token or taking a slug
/// another market has (not stored), a market releasing a token that another
/// then takes (whose owner's later versions listing it again are refused),
/// a refusal and the release of its token close together (one step holds
/// both), and ticks under another market than their token's (not folded).
fn events() -> Vec<Event> {
    let mut events = sample_events("crash", 8, 30);
    let market = |id: &str, round: i64, slug: &str, tokens: &[&str]| {
        let tokens: Vec<(&str, &str)> = tokens.iter().map(|t| (*t, *t)).collect();
        let updated = T0 + round * 7_000 + 500;
        Event::Market(Box::new(conformance::store::market(
            id, slug, "q", updated, &tokens,
        )))
    };
    let tick = |market: &str, token: &str, round: i64| {
        Event::Price(PriceTick {
            market_id: market.into(),
            token_id: token.into(),
            ts: Timestamp(T0 + round * 7_000 + 100),
            p: 0.99,
        })
    };
    // Where round `r` starts (the sample's events of one round share a ts
    // range), latest insertion first so the indices hold.
    let round_start = |events: &[Event], r: i64| {
        events
            .iter()
            .position(|e| match e {
                Event::Price(p) => p.ts.0 >= T0 + r * 7_000,
                _ => false,
            })
            .unwrap()
    };
    let inserts = [
        (
            5,
            vec![
                market("crash-w", 5, "crash-w-slug", &["crash-m4-yes"]),
                market("crash-m4", 5, "crash-m4-slug", &["crash-m4-no"]),
                tick("crash-w", "crash-m4-yes", 5),
            ],
        ),
        (
            2,
            vec![
                market("crash-y", 2, "crash-m2-slug", &["crash-y-yes"]),
                market("crash-m3", 2, "crash-m3-slug", &["crash-m3-yes"]),
                market("crash-z", 2, "crash-z-slug", &["crash-m3-no"]),
            ],
        ),
        (
            1,
            vec![
                market(
                    "crash-x",
                    1,
                    "crash-x-slug",
                    &["crash-x-yes", "crash-m0-yes"],
                ),
                tick("crash-x", "crash-m1-no", 1),
            ],
        ),
    ];
    for (round, insert) in inserts {
        let at = round_start(&events, round);
        events.splice(at..at, insert);
    }
    events
}

/// Appends every event in batches, each under an idempotency key, retrying
/// a failed batch as an ingest client does.
async fn feed(log: &dyn EventLog, events: &[Event]) -> usize {
    let mut failures = 0;
    for (i, chunk) in events.chunks(BATCH).enumerate() {
        let batch = || AppendBatch {
            events: chunk.to_vec().into(),
            idempotency: Some(Idempotency::for_body(
                format!("batch-{i}"),
                format!("{chunk:?}").as_bytes(),
                b"ok".to_vec(),
            )),
        };
        loop {
            match log.append(batch()).await {
                Ok(AppendOutcome::Appended { .. } | AppendOutcome::Duplicate { .. }) => break,
                Ok(other) => panic!("batch {i} retried with its own body: {other:?}"),
                Err(_) => failures += 1,
            }
        }
    }
    failures
}

fn config() -> ProjectorConfig {
    ProjectorConfig {
        batch_max: STEP,
        // Steps stay this size: the faults are planned by step number.
        backlog_batch_max: STEP,
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
    assert_the_rule_held(&store).await;
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
    rows_ahead: bool,
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
    if let (StoreFault::CrashBeforePositions(_), true) = (fault, rows_ahead) {
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
/// about 33 polls of 23 events; a poll where a market record decides a
/// later tick is written in two).
const STEPS: [u64; 5] = [1, 2, 7, 16, 30];

/// How many `apply`s a clean pass over `log` makes.
async fn applies_of_a_clean_pass(log: &Arc<SqliteLog>, dir: &Path) -> u64 {
    let counting = Arc::new(FaultyStore::new(
        SqliteStore::open(dir).unwrap(),
        StoreFault::FailApply(u64::MAX),
    ));
    project(log.clone(), counting.clone()).await.unwrap();
    counting.applies()
}

/// The catalog rule decided each record and tick of the sample's conflicts
/// (see [`events`]) as written: the first market keeps a token or slug, a
/// released token is taken, ticks under another market are not folded.
async fn assert_the_rule_held(store: &SqliteStore) {
    for refused in ["crash-x", "crash-y", "crash-w"] {
        let got = store.market(refused).await.unwrap();
        assert!(got.is_none(), "{refused} is stored: {got:?}");
    }
    let token =
        |id: &'static str| async move { store.token(id).await.unwrap().map(|t| t.market_id) };
    assert_eq!(token("crash-m0-yes").await.as_deref(), Some("crash-m0"));
    assert_eq!(token("crash-m3-no").await.as_deref(), Some("crash-z"));
    assert_eq!(token("crash-m4-yes").await.as_deref(), Some("crash-m4"));
    let by_slug = store.market("crash-m2-slug").await.unwrap().unwrap();
    assert_eq!(by_slug.id, "crash-m2");
    // crash-m1-no's day row counts crash-m1's ticks, not crash-x's.
    let rows = store
        .load(vec![RowKey {
            table: Table::Prices,
            id: "crash-m1-no".into(),
            res: Resolution::D1,
            bucket: Resolution::D1.bucket_start(Timestamp(T0)),
        }])
        .await
        .unwrap();
    let ticks_of_m1_no = events()
        .iter()
        .filter(|e| matches!(e, Event::Price(p) if p.token_id == "crash-m1-no" && p.market_id == "crash-m1"))
        .count() as u64;
    match &rows[..] {
        [row] => match row.value {
            hindsight_contracts::RowValue::Price { count, .. } => {
                assert_eq!(
                    count, ticks_of_m1_no,
                    "crash-x's tick was folded into crash-m1-no"
                )
            }
            _ => unreachable!(),
        },
        other => panic!("crash-m1-no's day row: {other:?}"),
    }
}

/// Which writes to fail at.
enum Steps {
    These(&'static [u64]),
    /// Every write a clean pass makes.
    EveryWrite,
}

/// Projects the log once cleanly, then again failing at each step as
/// `fault` says (each time on a store of its own) and restarting: every
/// restart must equal the clean pass. `rows_ahead`: the failed write left
/// rows ahead of the positions (checked, so the fault is known to bite).
async fn fail_at_each(steps: Steps, fault: fn(u64) -> StoreFault, rows_ahead: bool) {
    let dir = tempfile::tempdir().unwrap();
    let events = events();
    let (log, want) = clean(dir.path(), &events).await;
    let steps: Vec<u64> = match steps {
        Steps::These(steps) => steps.to_vec(),
        Steps::EveryWrite => {
            (1..=applies_of_a_clean_pass(&log, &dir.path().join("count")).await).collect()
        }
    };
    for n in steps {
        let store_dir = dir.path().join(format!("step-{n}"));
        crash_and_restart(&log, &store_dir, fault(n), &events, &want, rows_ahead).await;
    }
}

#[tokio::test]
async fn a_failed_apply_then_a_restart_equals_a_clean_projection() {
    fail_at_each(Steps::These(&STEPS), StoreFault::FailApply, true).await;
}

#[tokio::test]
async fn a_crash_between_rows_and_positions_then_a_restart_equals_a_clean_projection() {
    fail_at_each(Steps::These(&STEPS), StoreFault::CrashBeforePositions, true).await;
}

/// A crash between the catalog and the positions at every write of the
/// log: each restart replays a step whose catalog records were decided
/// already, and must not decide them again (a refused market stays refused
/// though a later record of the step released its token). Every restart
/// equals the clean pass, which kept the catalog rule. (A write may hold
/// only catalog records: no row need be ahead.)
#[tokio::test]
async fn a_crash_at_any_write_leaves_the_catalog_rule_deciding_as_one_clean_pass() {
    fail_at_each(Steps::EveryWrite, StoreFault::CrashBeforePositions, false).await;
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
