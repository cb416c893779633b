//! The embedded deployment as concrete parts, for the benchmarks, which
//! reach past the contracts (the log's head, the store's tables): the log
//! and store of a data directory, and the same routers and projector the
//! services are built from.

use crate::services::api::ApiConfig;
use crate::services::ingest::IngestConfig;
use axum::Router;
use hindsight_api::cursor::CursorKeys;
use hindsight_api::plans::Plans;
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::time::SystemClock;
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::path::Path;
use std::sync::Arc;

#[derive(Clone)]
pub struct Embedded {
    pub log: Arc<SqliteLog>,
    pub store: Arc<SqliteStore>,
}

impl Embedded {
    pub fn open(dir: &Path) -> hindsight_contracts::Result<Self> {
        hindsight_telemetry::install();
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

    /// The API's routes; their usage meter (flushing every second) and
    /// export job worker run until `stop` says true (or its sender is
    /// dropped), as the service's do.
    pub async fn api_router(
        &self,
        plans: Plans,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<Router> {
        let cfg = ApiConfig {
            plans: Arc::new(plans),
            clock: Arc::new(SystemClock),
            // A secret of this router's own: nothing else continues its cursors.
            cursors: CursorKeys::new(&[hindsight_api::keys::random_hex(32)])
                .map_err(anyhow::Error::msg)?,
            dashboard: Default::default(),
            export_jobs: Default::default(),
            page_cache_bytes: hindsight_api::cache::DEFAULT_PAGE_BYTES,
        };
        let (routes, workers) =
            crate::services::api::router(&cfg, self.store.clone(), self.store.clone()).await?;
        workers.spawn(stop);
        Ok(routes)
    }

    pub fn ingest_router(&self, token: &str, max_body_bytes: usize) -> Router {
        let cfg = IngestConfig {
            token: token.to_string(),
            max_body_bytes,
            limits: Default::default(),
        };
        crate::services::ingest::router(&cfg, self.log.clone(), self.store.clone())
    }
}
