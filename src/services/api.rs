//! `hindsight api`: `/v1` over the read store.

use super::ops::{self, Readiness};
use super::{Listeners, Service};
use crate::backends::Backends;
use axum::Router;
use hindsight_api::catalog::Catalog;
use hindsight_api::plans::Plans;
use hindsight_api::ApiState;
use hindsight_contracts::Store;
use hindsight_schemas::time::Clock;
use std::sync::Arc;
use std::time::Duration;

/// How often the API picks up catalog changes for its discovery lists.
const CATALOG_REFRESH: Duration = Duration::from_millis(250);

#[derive(Clone)]
pub struct ApiConfig {
    pub plans: Arc<Plans>,
    /// "Now" for rate-limit windows and plan lookback.
    pub clock: Arc<dyn Clock>,
}

/// The `/v1` routes alone over `store`, with the in-memory catalog loaded
/// and refreshing (dev serves them beside ingest).
pub async fn router(cfg: &ApiConfig, store: Arc<dyn Store>) -> anyhow::Result<Router> {
    let catalog = Catalog::new(store.clone());
    catalog.refresh().await?;
    catalog.spawn_refresher(CATALOG_REFRESH);
    Ok(hindsight_api::router(ApiState {
        store: store.clone(),
        keys: store,
        plans: cfg.plans.clone(),
        catalog,
        clock: cfg.clock.clone(),
    }))
}

pub async fn build(
    cfg: &ApiConfig,
    backends: &Backends,
    listeners: Listeners,
) -> anyhow::Result<Service> {
    let store = backends.store()?;
    let ops = ops::router(Readiness {
        log: None,
        store: Some(store.clone()),
    });
    Ok(Service::new(
        "api",
        listeners,
        router(cfg, store).await?,
        ops,
    ))
}
