//! One embedded deployment: the log and read store in a data directory, and
//! the routers and projector over them.

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use hindsight_api::catalog::Catalog;
use hindsight_api::{plans::Plans, ApiState};
use hindsight_contracts::{EventLog, ProjectionStore, Store};
use hindsight_ingest::http::IngestState;
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_sqlite::EmbeddedSource;
use hindsight_sqlite::{SqliteLog, SqliteStore};
use metrics_exporter_prometheus::PrometheusHandle;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How often the API picks up catalog changes for its discovery lists.
const CATALOG_REFRESH: Duration = Duration::from_millis(250);

#[derive(Clone)]
pub struct Embedded {
    pub log: Arc<SqliteLog>,
    pub store: Arc<SqliteStore>,
}

impl Embedded {
    pub fn open(dir: &Path) -> hindsight_contracts::Result<Self> {
        Ok(Embedded {
            log: Arc::new(SqliteLog::open(dir)?),
            store: Arc::new(SqliteStore::open(dir)?),
        })
    }

    pub fn projector(&self, config: ProjectorConfig) -> Projector {
        Projector::new(
            Arc::new(EmbeddedSource {
                log: self.log.clone(),
                store: self.store.clone(),
            }),
            self.store.clone(),
            config,
        )
    }

    pub async fn api_router(&self, plans: Plans) -> hindsight_contracts::Result<Router> {
        api_router(self.store.clone(), plans).await
    }

    pub fn ingest_router(&self, token: &str, max_body_bytes: usize) -> Router {
        hindsight_ingest::http::router(IngestState {
            log: self.log.clone(),
            token: token.into(),
            max_body_bytes,
        })
    }
}

/// The `/v1` router over any read store, with its in-memory catalog loaded
/// and refreshing.
pub async fn api_router(
    store: Arc<dyn Store>,
    plans: Plans,
) -> hindsight_contracts::Result<Router> {
    let catalog = Catalog::new(store.clone());
    catalog.refresh().await?;
    catalog.spawn_refresher(CATALOG_REFRESH);
    Ok(hindsight_api::router(ApiState {
        store: store.clone(),
        keys: store,
        plans: Arc::new(plans),
        catalog,
    }))
}

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

/// `/metrics` for Prometheus, and for orchestrators `/livez` (the process
/// answers) and `/readyz` (its log and store answer too; 503 otherwise).
/// Unauthenticated, unlike `/v1/health`.
pub fn ops_router(handle: PrometheusHandle, readiness: Readiness) -> Router {
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
