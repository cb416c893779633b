//! `hindsight ingest`: `POST /ingest/v1/events` over the event log.

use super::ops::{self, Readiness};
use super::{Listeners, Service};
use crate::backends::Backends;
use axum::Router;
use hindsight_contracts::{EventLog, ReadStore};
use hindsight_ingest::catalog::CatalogView;
use hindsight_ingest::http::{IngestLimits, IngestState};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// The bearer token pipelines must send.
    pub token: String,
    /// Largest body, compressed or decompressed.
    pub max_body_bytes: usize,
    pub limits: IngestLimits,
}

/// The ingest routes alone, appending to `log` and checking lines against
/// the catalog of `store` (dev serves them beside the API).
pub fn router(cfg: &IngestConfig, log: Arc<dyn EventLog>, store: Arc<dyn ReadStore>) -> Router {
    hindsight_ingest::http::router(IngestState {
        log,
        token: cfg.token.as_str().into(),
        max_body_bytes: cfg.max_body_bytes,
        limits: cfg.limits,
        catalog: Arc::new(CatalogView::new(store, cfg.limits.catalog_max_age)),
    })
}

pub fn build(
    cfg: &IngestConfig,
    backends: &Backends,
    listeners: Listeners,
) -> anyhow::Result<Service> {
    let (log, store) = (backends.log()?, backends.store()?);
    // Ready when the log is: a read store that cannot be read only leaves
    // the catalog view as it was, it does not stop acknowledging.
    let ops = ops::router(Readiness {
        log: Some(log.clone()),
        store: None,
    });
    Ok(Service::new(
        "ingest",
        listeners,
        router(cfg, log, store),
        ops,
    ))
}
