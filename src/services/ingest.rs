//! `hindsight ingest`: `POST /ingest/v1/events` over the event log.

use super::ops::{self, Readiness};
use super::{Listeners, Service};
use crate::backends::Backends;
use axum::Router;
use hindsight_contracts::EventLog;
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

/// The ingest routes alone, over `log` (dev serves them beside the API).
pub fn router(cfg: &IngestConfig, log: Arc<dyn EventLog>) -> Router {
    hindsight_ingest::http::router(IngestState {
        log,
        token: cfg.token.as_str().into(),
        max_body_bytes: cfg.max_body_bytes,
        limits: cfg.limits,
    })
}

pub fn build(
    cfg: &IngestConfig,
    backends: &Backends,
    listeners: Listeners,
) -> anyhow::Result<Service> {
    let log = backends.log()?;
    let ops = ops::router(Readiness {
        log: Some(log.clone()),
        store: None,
    });
    Ok(Service::new("ingest", listeners, router(cfg, log), ops))
}
