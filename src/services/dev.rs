//! `hindsight dev`: the ingest and API routes on one listener (with the ops
//! routes, unless they have their own listener), the projector and (optionally) the demo feed as workers, all over one set of
//! embedded backends.

use super::api::{self, ApiConfig};
use super::ingest::{self, IngestConfig};
use super::ops::{self, Readiness};
use super::{projector, Listeners, Service};
use crate::backends::Backends;
use crate::demo::{self, DemoConfig, Sink};
use hindsight_projector::ProjectorConfig;

pub struct DevConfig {
    pub ingest: IngestConfig,
    pub api: ApiConfig,
    pub projector: ProjectorConfig,
    /// `None`: no demo data.
    pub demo: Option<DemoConfig>,
}

pub async fn build(
    cfg: &DevConfig,
    backends: &Backends,
    listeners: Listeners,
) -> anyhow::Result<Service> {
    let (log, store) = (backends.log()?, backends.store()?);
    let (routes, workers) = api::router(&cfg.api, store.clone(), backends.export_jobs()?).await?;
    let routes = routes.merge(ingest::router(&cfg.ingest, log.clone(), store.clone()));
    let ops = ops::router(Readiness {
        log: Some(log.clone()),
        store: Some(store),
    });
    let mut service = Service::new("dev", listeners, routes, ops);
    workers.attach(&mut service);
    projector::attach(&mut service, &cfg.projector, backends)?;
    if let Some(demo) = &cfg.demo {
        // History only into a log that has never held anything: a restart
        // keeps its data instead of generating another 48 hours beside it.
        let history = backends.log_is_empty().await?;
        let (demo, sink) = (demo.clone(), Sink::Log(log));
        service.spawn_with(move |stop| async move {
            if let Err(e) = demo::run(&demo, &sink, history, stop).await {
                tracing::error!(error = %e, "demo feed stopped");
            }
        });
    }
    Ok(service)
}
