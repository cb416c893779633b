//! A failure on our side is a 500 with a fixed body, and its cause is
//! logged and counted exactly once, by the layer around the router —
//! whether a handler or the auth middleware hit it.

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use hindsight_api::{keys, router, ApiState};
use hindsight_contracts::*;
use hindsight_schemas::{MarketRecord, Timestamp};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::io::Write;
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

mod common;

const KEY: &str = "hsk_error_layer_test";

/// A read store whose every read fails as an unreachable backend would.
struct DownStore;

fn down() -> Error {
    Error::unavailable("sqlite", "database is locked")
}

#[async_trait]
impl ReadStore for DownStore {
    async fn prices(&self, _: &str, _: Range) -> Result<Vec<PricePoint>> {
        Err(down())
    }
    async fn candles(&self, _: &str, _: Range) -> Result<Vec<CandlePoint>> {
        Err(down())
    }
    async fn metrics(&self, _: &str, _: Range) -> Result<Vec<MetricsPoint>> {
        Err(down())
    }
    async fn books(&self, _: &str, _: Range) -> Result<Vec<BookPoint>> {
        Err(down())
    }
    async fn count(&self, _: Table, _: &str, _: Range) -> Result<u64> {
        Err(down())
    }
    async fn count_ticks(&self, _: TickKind, _: &str, _: Timestamp, _: Timestamp) -> Result<u64> {
        Err(down())
    }
    async fn ticks(&self, _: TickKind, _: &str, _: TickRange) -> Result<Vec<Tick>> {
        Err(down())
    }
    async fn book_at(&self, _: &str, _: Timestamp, _: Timestamp) -> Result<Option<Tick>> {
        Err(down())
    }
    async fn token(&self, _: &str) -> Result<Option<TokenRef>> {
        Err(down())
    }
    async fn market(&self, _: &str) -> Result<Option<MarketRecord>> {
        Err(down())
    }
    async fn catalog_changes(
        &self,
        _: Option<&CatalogCursor>,
    ) -> Result<(Vec<hindsight_schemas::Event>, CatalogCursor)> {
        Err(down())
    }
}

/// One enterprise key (no rate window to count); `fail` makes every
/// lookup fail instead.
struct Keys {
    key: ApiKeyRecord,
    fail: bool,
}

#[async_trait]
impl AuthStore for Keys {
    async fn put_key(&self, _: ApiKeyRecord) -> Result<()> {
        Ok(())
    }
    async fn key_by_hash(&self, hash: [u8; 32]) -> Result<Option<ApiKeyRecord>> {
        if self.fail {
            return Err(down());
        }
        Ok((hash == self.key.hash).then(|| self.key.clone()))
    }
    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>> {
        Ok(vec![self.key.clone()])
    }
    async fn take_hit(&self, _: &str, _: Timestamp, _: u32) -> Result<RateHits> {
        unreachable!("the key's plan is unlimited")
    }
    async fn rate_hits(&self, _: &str, _: Timestamp) -> Result<Vec<Timestamp>> {
        unreachable!("the key's plan is unlimited")
    }
}

/// Log lines, captured by a subscriber installed for this thread only.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Outcome {
    status: StatusCode,
    body: serde_json::Value,
    log_lines: Vec<String>,
    metrics: String,
}

/// Runs one request through the real router with the store failing where
/// `fail_keys` says, capturing the logs and metrics it produced.
async fn request(path: &str, fail_keys: bool) -> Outcome {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _log_guard = tracing::subscriber::set_default(subscriber);
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _metrics_guard = metrics::set_default_local_recorder(&recorder);

    let store: Arc<dyn ReadStore> = Arc::new(DownStore);
    let accounts_dir = tempfile::tempdir().unwrap();
    let accounts = Arc::new(hindsight_sqlite::SqliteStore::open(accounts_dir.path()).unwrap());
    let auth = Arc::new(Keys {
        key: keys::record_for(KEY, "org", "enterprise"),
        fail: fail_keys,
    });
    let state: ApiState = common::parts(store, auth, accounts).into();
    let response = router(state)
        .oneshot(
            Request::get(path)
                .header("x-api-key", KEY)
                .header("x-request-id", "req-42")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let log_lines = String::from_utf8(logs.0.lock().unwrap().clone())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    Outcome {
        status,
        body: serde_json::from_slice(&bytes).unwrap(),
        log_lines,
        metrics: handle.render(),
    }
}

fn internal_errors(metrics: &str, route: &str) -> Vec<String> {
    metrics
        .lines()
        .filter(|l| l.starts_with("hindsight_api_internal_errors_total{"))
        .inspect(|l| assert!(l.contains(&format!("route=\"{route}\"")), "{l}"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_store_failure_in_a_handler_is_one_500_one_log_line_one_count() {
    let out = request("/v1/markets/m1", false).await;
    assert_eq!(out.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        out.body,
        serde_json::json!({"detail": "failed to fetch data"})
    );
    assert_eq!(out.log_lines.len(), 1, "{:?}", out.log_lines);
    let line = &out.log_lines[0];
    for part in [
        "ERROR",
        "request failed",
        "route=/v1/markets/{id_or_slug}",
        "request_id=\"req-42\"",
        "sqlite unavailable: database is locked",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    let counted = internal_errors(&out.metrics, "/v1/markets/{id_or_slug}");
    assert_eq!(counted.len(), 1, "{}", out.metrics);
    assert!(
        counted[0].contains("cause=\"store\"") && counted[0].ends_with(" 1"),
        "{}",
        counted[0]
    );
}

#[tokio::test]
async fn a_store_failure_in_the_auth_middleware_is_reported_the_same_way() {
    let out = request("/v1/health", true).await;
    assert_eq!(out.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(out.body["detail"], "failed to fetch data");
    assert_eq!(out.log_lines.len(), 1, "{:?}", out.log_lines);
    assert!(out.log_lines[0].contains("route=/v1/health"));
    assert_eq!(internal_errors(&out.metrics, "/v1/health").len(), 1);
}

#[tokio::test]
async fn a_refusal_that_is_not_our_failure_is_neither_logged_nor_counted() {
    let out = request("/v1/markets/", false).await;
    assert_eq!(out.status, StatusCode::NOT_FOUND);
    assert!(out.log_lines.is_empty(), "{:?}", out.log_lines);
    assert!(internal_errors(&out.metrics, "unmatched").is_empty());
}
