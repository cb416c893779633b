//! Deterministic failures, injected by wrappers around the real embedded
//! log and store: an append that fails before or after it is durable, and a
//! projector step that dies between its rows and its position. Beside the
//! random SIGKILLs of `tests/projector_crash.rs`, each of these lands on
//! exactly the step it names.

use crate::helpers::*;
use hindsight::backends::{BackendConfig, Backends, Uses};
use hindsight::services::ingest::IngestConfig;
use hindsight_contracts::faults::{FaultyLog, FaultyStore, LogFault, StoreFault};
use hindsight_contracts::{AppendBatch, EventLog, ReadStore};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::{Event, PriceTick, Timestamp};
use std::sync::Arc;

const DAY: i64 = 1_756_684_800;

fn log_events(dir: &std::path::Path) -> i64 {
    scalar(
        &dir.join("log.db"),
        "SELECT COALESCE(SUM(count), 0) FROM log_batches",
    )
}

/// Ingest over `log` (checking lines against `store`'s catalog), served on
/// port 0 for the test's lifetime.
async fn serve_ingest(log: Arc<dyn EventLog>, store: Arc<dyn ReadStore>) -> String {
    let cfg = IngestConfig {
        token: INGEST_TOKEN.into(),
        max_body_bytes: 1 << 20,
        limits: Default::default(),
    };
    let router = hindsight::services::ingest::router(&cfg, log, store);
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

async fn failing_ingest(name: &str, fault: LogFault) -> (std::path::PathBuf, String) {
    let dir = temp_dir(name);
    let backends = Backends::connect(&BackendConfig {
        uses: Uses::INGEST,
        ..BackendConfig::embedded(&dir)
    })
    .await
    .unwrap();
    let log = Arc::new(FaultyLog::new(backends.log().unwrap(), fault));
    (dir, serve_ingest(log, backends.store().unwrap()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_is_503_acknowledges_nothing_and_its_retry_lands_once() {
    let (dir, base) = failing_ingest("append-fails-before", LogFault::FailAppend(2)).await;
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
    let (dir, base) = failing_ingest("append-fails-after", LogFault::LoseAck(2)).await;
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
            .collect::<Vec<_>>();
        log.append(AppendBatch {
            events: events.into(),
            idempotency: None,
        })
        .await
        .unwrap();
    }
    let cfg = ProjectorConfig {
        batch_max: 150,
        backlog_batch_max: 150,
        ..ProjectorConfig::default()
    };
    let store = backends.store().unwrap();
    let dying = Arc::new(FaultyStore::new(
        store.clone(),
        StoreFault::CrashBeforePositions(3),
    ));
    let mut first = Projector::new(backends.source().unwrap(), dying.clone(), cfg.clone());
    let died = first.catch_up().await.unwrap_err();
    assert!(
        died.to_string().contains("between rows and positions"),
        "{died}"
    );
    assert_eq!(dying.applies(), 3);
    let store_db = dir.join("store.db");
    let committed = || scalar(&store_db, "SELECT MAX(next_offset) FROM consumed");
    let before = committed();
    assert!(
        before > 0 && before < ticks,
        "two steps durable, the third's rows without its position: {before}"
    );
    let folded = scalar(
        &store_db,
        "SELECT SUM(ticks) FROM price_bucket_blocks WHERE res = 1",
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
    // `res` is stored as the resolution's width in minutes.
    for res in [1, 5, 10, 15, 60, 360, 1440] {
        let counted = scalar(
            &store_db,
            &format!("SELECT SUM(ticks) FROM price_bucket_blocks WHERE res = {res}"),
        );
        assert_eq!(counted, ticks, "res {res}: every tick exactly once");
    }
}
