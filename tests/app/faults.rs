//! Deterministic failures, injected by wrappers around the real embedded
//! log and store: an append that fails before or after it is durable, and a
//! projector step that dies between its rows and its position. Beside the
//! random SIGKILLs of `tests/projector_crash.rs`, each of these lands on
//! exactly the step it names.

use crate::helpers::*;
use async_trait::async_trait;
use hindsight::backends::{BackendConfig, Backends, Uses};
use hindsight::services::ingest::IngestConfig;
use hindsight_contracts::{
    AppendBatch, AppendOutcome, Error, EventLog, Position, ProjectionStore, ProjectionWrite,
    Result, Row, RowKey,
};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::{Event, PriceTick, Timestamp};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const DAY: i64 = 1_756_684_800;

/// Where the failing append fails.
#[derive(Clone, Copy)]
enum Fail {
    /// Before the log sees the batch: nothing appended.
    Before,
    /// After the batch is durable: the acknowledgement is lost.
    After,
}

/// The real log, whose `nth` append (1-based) fails.
struct FailingLog {
    inner: Arc<dyn EventLog>,
    nth: usize,
    fail: Fail,
    appends: AtomicUsize,
}

#[async_trait]
impl EventLog for FailingLog {
    async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome> {
        let n = self.appends.fetch_add(1, Ordering::SeqCst) + 1;
        if n != self.nth {
            return self.inner.append(batch).await;
        }
        if let Fail::After = self.fail {
            self.inner.append(batch).await?;
        }
        Err(Error::unavailable("injected", format!("append {n} fails")))
    }

    async fn ready(&self) -> Result<()> {
        self.inner.ready().await
    }
}

/// The real store, whose `nth` apply (1-based) writes the rows and catalog
/// but not the positions, then fails: a process dying between the two, as
/// a store that cannot write them atomically (CQL) allows.
struct DiesBetweenRowsAndPosition {
    inner: Arc<dyn ProjectionStore>,
    nth: usize,
    applies: AtomicUsize,
}

#[async_trait]
impl ProjectionStore for DiesBetweenRowsAndPosition {
    async fn committed(&self) -> Result<Vec<Position>> {
        self.inner.committed().await
    }

    async fn load(&self, keys: Vec<RowKey>) -> Result<Vec<Row>> {
        self.inner.load(keys).await
    }

    async fn apply(&self, write: ProjectionWrite) -> Result<()> {
        let n = self.applies.fetch_add(1, Ordering::SeqCst) + 1;
        if n != self.nth {
            return self.inner.apply(write).await;
        }
        let rows_only = ProjectionWrite {
            consumed: Vec::new(),
            ..write
        };
        self.inner.apply(rows_only).await?;
        Err(Error::unavailable("injected", "died before the position"))
    }

    async fn reset(&self) -> Result<()> {
        self.inner.reset().await
    }
}

fn log_events(dir: &std::path::Path) -> i64 {
    scalar(
        &dir.join("log.db"),
        "SELECT COALESCE(SUM(count), 0) FROM log_batches",
    )
}

/// Ingest over `log`, served on port 0 for the test's lifetime.
async fn serve_ingest(log: Arc<dyn EventLog>) -> String {
    let cfg = IngestConfig {
        token: INGEST_TOKEN.into(),
        max_body_bytes: 1 << 20,
    };
    let router = hindsight::services::ingest::router(&cfg, log);
    let listener = port0().await;
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

async fn post(base: &str, key: &str, body: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/ingest/v1/events"))
        .bearer_auth(INGEST_TOKEN)
        .header("Idempotency-Key", key)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn failing_ingest(name: &str, fail: Fail) -> (std::path::PathBuf, String) {
    let dir = temp_dir(name);
    let backends = Backends::connect(&BackendConfig {
        uses: Uses::APPEND,
        ..BackendConfig::embedded(&dir)
    })
    .await
    .unwrap();
    let log = Arc::new(FailingLog {
        inner: backends.log().unwrap(),
        nth: 2,
        fail,
        appends: AtomicUsize::new(0),
    });
    (dir, serve_ingest(log).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_is_503_acknowledges_nothing_and_its_retry_lands_once() {
    let (dir, base) = failing_ingest("append-fails-before", Fail::Before).await;
    let a = price_line("f1", "f1-yes", DAY, 0.5);
    let b = format!("{a}\n{}", price_line("f1", "f1-yes", DAY + 1, 0.6));
    assert_eq!(post(&base, "a", &a).await.status(), 200);
    let refused = post(&base, "b", &b).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(log_events(&dir), 1, "nothing of the refused batch");
    let retried = post(&base, "b", &b).await;
    assert_eq!(retried.status(), 200);
    assert!(!retried.headers().contains_key("idempotent-replayed"));
    let again = post(&base, "b", &b).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(log_events(&dir), 3, "the retried batch, once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acknowledgement_is_answered_from_the_idempotency_record_on_retry() {
    let (dir, base) = failing_ingest("append-fails-after", Fail::After).await;
    let a = price_line("f2", "f2-yes", DAY, 0.5);
    let b = format!("{a}\n{}", price_line("f2", "f2-yes", DAY + 1, 0.6));
    assert_eq!(post(&base, "a", &a).await.status(), 200);
    // Durable, but the pipeline hears 503 and retries under the same key.
    assert_eq!(post(&base, "b", &b).await.status(), 503);
    assert_eq!(log_events(&dir), 3);
    let retried = post(&base, "b", &b).await;
    assert_eq!(retried.status(), 200);
    assert_eq!(retried.headers()["idempotent-replayed"], "true");
    let body: serde_json::Value = retried.json().await.unwrap();
    assert_eq!(
        (body["accepted"].as_u64(), body["rejected_count"].as_u64()),
        (Some(2), Some(0)),
        "the first append's answer"
    );
    assert_eq!(log_events(&dir), 3, "appended once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projector_dying_between_rows_and_position_neither_loses_nor_double_counts() {
    let dir = temp_dir("dies-between-rows-and-position");
    let backends = Backends::connect(&BackendConfig {
        uses: Uses {
            append: true,
            consume: true,
            read: false,
        },
        ..BackendConfig::embedded(&dir)
    })
    .await
    .unwrap();
    // 1 000 ticks over 4 tokens and 10 minutes, appended in 10 batches.
    let log = backends.log().unwrap();
    let ticks: i64 = 1_000;
    for batch in 0..10 {
        let events = (batch * 100..(batch + 1) * 100)
            .map(|i| {
                Event::Price(PriceTick {
                    market_id: "d1".into(),
                    token_id: format!("d1-{}", i % 4),
                    ts: Timestamp::from_secs(DAY + (i as i64 * 600) / ticks),
                    p: (i % 10) as f64 / 10.0,
                })
            })
            .collect();
        log.append(AppendBatch {
            events,
            idempotency: None,
        })
        .await
        .unwrap();
    }
    let cfg = ProjectorConfig {
        batch_max: 150,
        ..ProjectorConfig::default()
    };
    let store = backends.store().unwrap();
    let dying = Arc::new(DiesBetweenRowsAndPosition {
        inner: store.clone(),
        nth: 3,
        applies: AtomicUsize::new(0),
    });
    let mut first = Projector::new(backends.source().unwrap(), dying.clone(), cfg.clone());
    let died = first.catch_up().await.unwrap_err();
    assert!(
        died.to_string().contains("died before the position"),
        "{died}"
    );
    assert_eq!(dying.applies.load(Ordering::SeqCst), 3);
    let store_db = dir.join("store.db");
    let committed = || scalar(&store_db, "SELECT MAX(next_offset) FROM consumed");
    let before = committed();
    assert!(
        before > 0 && before < ticks,
        "two steps durable, the third's rows without its position: {before}"
    );
    let folded = scalar(
        &store_db,
        "SELECT SUM(count) FROM price_buckets WHERE res = '1m'",
    );
    assert!(
        folded > before,
        "the dying step's rows are there: {folded} > {before}"
    );

    // A new projector (as after a restart) replays from the position.
    drop(first);
    let mut second = Projector::new(backends.source().unwrap(), store, cfg);
    second.catch_up().await.unwrap();
    assert_eq!(committed(), ticks);
    for res in ["1m", "5m", "10m", "15m", "1h", "6h", "1d"] {
        let counted = scalar(
            &store_db,
            &format!("SELECT SUM(count) FROM price_buckets WHERE res = '{res}'"),
        );
        assert_eq!(counted, ticks, "{res}: every tick exactly once");
    }
}
