//! `hindsight projector`: rolls the log into the read store, with its
//! `/metrics`, `/livez` and `/readyz` on its own listener.

use super::ops::{self, Readiness};
use super::{Listeners, Service};
use crate::backends::Backends;
use axum::Router;
use hindsight_projector::{Projector, ProjectorConfig};
use tokio::net::TcpListener;

/// The projector as a worker of `service` (dev runs it beside its routes).
pub fn attach(
    service: &mut Service,
    cfg: &ProjectorConfig,
    backends: &Backends,
) -> anyhow::Result<()> {
    let projector = Projector::new(backends.source()?, backends.store()?, cfg.clone());
    service.spawn_with(|stop| projector.run(stop));
    Ok(())
}

/// `ops_listener` serves the projector's metrics and probes.
pub fn build(
    cfg: &ProjectorConfig,
    backends: &Backends,
    ops_listener: TcpListener,
) -> anyhow::Result<Service> {
    let store = backends.store()?;
    let ops = ops::router(Readiness {
        log: None,
        store: Some(store),
    });
    let listeners = Listeners {
        service: ops_listener,
        ops: None,
    };
    let mut service = Service::new("projector", listeners, Router::new(), ops);
    attach(&mut service, cfg, backends)?;
    Ok(service)
}
