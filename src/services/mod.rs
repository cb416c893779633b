//! The services, each built over [`Backends`](crate::backends::Backends)
//! and already bound listeners, and run until a shutdown future completes.
//!
//! Every service is a [`Service`]: HTTP servers on listeners the caller bound
//! (so tests bind port 0 and ask [`Service::local_addr`]) and background
//! workers (the projector, the demo feed), all stopped by one shutdown
//! future. `ingest`, `projector` and `api` each have a `build`; `dev` builds
//! the same pieces and serves them on one listener.

pub mod api;
pub mod dev;
pub mod http;
pub mod ingest;
pub mod ops;
pub mod projector;

use anyhow::Context;
use axum::Router;
use http::HttpLimits;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A background task of a service; it returns once the receiver turns true.
type Worker = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The listeners of a service: its own address, and optionally a separate
/// one for `/metrics`, `/livez` and `/readyz` (else those share the first;
/// when they have their own, the service address does not serve them).
pub struct Listeners {
    pub service: TcpListener,
    pub ops: Option<TcpListener>,
}

impl Listeners {
    /// Binds `service` and, when given, `ops`.
    pub async fn bind(service: SocketAddr, ops: Option<SocketAddr>) -> anyhow::Result<Self> {
        let ops = match ops {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(Listeners {
            service: bind(service).await?,
            ops,
        })
    }
}

pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))
}

/// A built service, ready to run.
pub struct Service {
    name: &'static str,
    service: (TcpListener, Router),
    ops: Option<(TcpListener, Router)>,
    limits: HttpLimits,
    workers: Vec<Worker>,
    /// Run once every server and worker has stopped.
    after_stop: Vec<Worker>,
    stop: watch::Sender<bool>,
}

impl Service {
    /// `router` on the service listener; `ops` beside it, or on the ops
    /// listener when there is one.
    fn new(name: &'static str, listeners: Listeners, router: Router, ops: Router) -> Self {
        let (service, ops) = match listeners.ops {
            None => ((listeners.service, router.merge(ops)), None),
            Some(ops_listener) => ((listeners.service, router), Some((ops_listener, ops))),
        };
        Service {
            name,
            service,
            ops,
            limits: HttpLimits::default(),
            workers: Vec::new(),
            after_stop: Vec::new(),
            stop: watch::Sender::new(false),
        }
    }

    /// Bounds every connection of every listener of the service (each
    /// listener has its own connection cap, so a flood on the public address
    /// never starves the ops listener).
    pub fn with_http_limits(mut self, limits: HttpLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Adds a background task, given the signal that tells it to stop.
    fn spawn_with<F, Fut>(&mut self, worker: F)
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.workers.push(Box::pin(worker(self.stop.subscribe())));
    }

    /// Adds a task to run once every server has answered its last request
    /// and every worker has stopped (a last flush of what they left).
    fn after_stop(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.after_stop.push(Box::pin(task));
    }

    /// The service's own address (for the projector: its ops address).
    pub fn local_addr(&self) -> SocketAddr {
        self.service
            .0
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Where `/metrics`, `/livez` and `/readyz` are served.
    pub fn ops_addr(&self) -> SocketAddr {
        self.ops.as_ref().map_or_else(
            || self.local_addr(),
            |(l, _)| l.local_addr().expect("a bound listener has an address"),
        )
    }

    /// Serves and runs the workers until `shutdown` completes (or a server
    /// fails), then stops everything gracefully: servers finish the requests
    /// in progress, workers their current step. Each listener's metrics are
    /// registered by this call, before the future runs (see
    /// [`http::serve`]): a caller that spawns several services finds every
    /// listener's series on `/metrics` as soon as any of them answers.
    pub fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = anyhow::Result<()>> + Send {
        let mut line = format!(
            "hindsight {} listening on http://{}",
            self.name,
            self.local_addr()
        );
        if self.ops.is_some() {
            line += &format!(" (metrics and probes on http://{})", self.ops_addr());
        }
        let servers: Vec<_> = std::iter::once((self.name, self.service))
            .chain(self.ops.map(|ops| ("ops", ops)))
            .map(|(name, (listener, router))| {
                http::serve(name, listener, router, self.limits, self.stop.subscribe())
            })
            .collect();
        let (name, workers, after_stop, stop) =
            (self.name, self.workers, self.after_stop, self.stop);
        async move {
            tracing::info!(target: "hindsight::lifecycle", "{line}");
            let mut tasks = tokio::task::JoinSet::new();
            for server in servers {
                tasks.spawn(async move { server.await.context("serving HTTP") });
            }
            for worker in workers {
                tasks.spawn(async move {
                    worker.await;
                    Ok(())
                });
            }
            let mut result = Ok(());
            tokio::select! {
                () = shutdown => {}
                ended = tasks.join_next() => {
                    // Nothing ends on its own before the stop signal.
                    if let Some(ended) = ended {
                        result = flatten(ended);
                    }
                }
            }
            tracing::info!(target: "hindsight::lifecycle", "hindsight {name} shutting down");
            let _ = stop.send(true);
            while let Some(ended) = tasks.join_next().await {
                if result.is_ok() {
                    result = flatten(ended);
                }
            }
            for task in after_stop {
                task.await;
            }
            result
        }
    }
}

fn flatten(ended: Result<anyhow::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    ended.context("a service task panicked")?
}
