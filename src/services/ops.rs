//! `/metrics` for Prometheus, and for orchestrators `/livez` (the process
//! answers) and `/readyz` (its log and store answer too; 503 otherwise).
//! Unauthenticated, unlike `/v1/health`.

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use hindsight_contracts::{EventLog, ProjectionStore};
use std::sync::Arc;

/// What a service needs to be ready: its log, its store, or both.
#[derive(Clone, Default)]
pub struct Readiness {
    pub log: Option<Arc<dyn EventLog>>,
    pub store: Option<Arc<dyn ProjectionStore>>,
}

impl Readiness {
    async fn check(&self) -> Result<(), String> {
        if let Some(log) = &self.log {
            log.ready().await.map_err(|e| format!("event log: {e}"))?;
        }
        if let Some(store) = &self.store {
            store
                .committed()
                .await
                .map_err(|e| format!("read store: {e}"))?;
        }
        Ok(())
    }
}

/// The ops routes over the process's one metrics registry (installed here
/// on first use).
pub fn router(readiness: Readiness) -> Router {
    let handle = hindsight_telemetry::install();
    Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    match readiness.check().await {
                        Ok(()) => (StatusCode::OK, "ok".to_string()),
                        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e),
                    }
                }
            }),
        )
}
