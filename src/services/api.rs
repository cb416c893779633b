//! `hindsight api`: `/v1` over the read store.

use super::ops::{self, Readiness};
use super::{Listeners, Service};
use crate::backends::{BackendConfig, Backends};
use anyhow::{anyhow, bail, Context};
use axum::Router;
use hindsight_api::cache::{Cache, KEY_BYTES, TOKEN_BYTES};
use hindsight_api::catalog::Catalog;
use hindsight_api::cursor::CursorKeys;
use hindsight_api::dashboard::DashboardConfig;
use hindsight_api::jobs::{self, JobConfig, Jobs};
use hindsight_api::plans::Plans;
use hindsight_api::usage::UsageMeter;
use hindsight_api::{ApiParts, ApiState};
use hindsight_contracts::{ExportJobStore, Store};
use hindsight_schemas::time::Clock;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How often the API picks up catalog changes for its discovery lists.
const CATALOG_REFRESH: Duration = Duration::from_millis(250);

#[derive(Clone)]
pub struct ApiConfig {
    pub plans: Arc<Plans>,
    /// "Now" for rate-limit windows and plan lookback.
    pub clock: Arc<dyn Clock>,
    /// Signs pagination cursors ([`cursor_keys`]).
    pub cursors: CursorKeys,
    pub dashboard: DashboardConfig,
    /// How export jobs run (`--export-*` flags).
    pub export_jobs: JobConfig,
    /// Bytes of history pages kept encoded (`--page-cache-mb`; 0: none).
    pub page_cache_bytes: usize,
}

/// File of the data directory holding the generated cursor secret.
pub const CURSOR_SECRET_FILE: &str = "cursor.secret";

/// The keys that sign pagination cursors: the configured secrets; without
/// any, a secret generated once and kept in the data directory, so that a
/// restarted API, and every API process on that directory, continues the
/// cursors it handed out. With the CQL store, API replicas have no
/// directory in common: a secret is required, or each replica would refuse
/// the others' cursors.
pub fn cursor_keys(secrets: &[String], backends: &BackendConfig) -> anyhow::Result<CursorKeys> {
    let keys = if !secrets.is_empty() {
        CursorKeys::new(secrets)
    } else if backends.scylla.is_some() {
        bail!(
            "HINDSIGHT_CURSOR_SECRET (or --cursor-secret) is required with the CQL store: every \
             API replica must sign pagination cursors with the same secret. Generate one with \
             `openssl rand -hex 32` and give it to every replica"
        );
    } else {
        CursorKeys::new(&[data_dir_secret(&backends.data_dir)?])
    };
    keys.map_err(|e| anyhow!("HINDSIGHT_CURSOR_SECRET: {e}"))
}

/// The secret in `dir`, created (random, readable by its owner only) if
/// absent. Processes starting together agree: each writes its own file and
/// links it into place, and a process that finds the place taken reads the
/// winner's.
fn data_dir_secret(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join(CURSOR_SECRET_FILE);
    if !path.exists() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!("{CURSOR_SECRET_FILE}.{}.tmp", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        file.write_all(hindsight_api::keys::random_hex(32).as_bytes())?;
        file.sync_all()?;
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
    let secret =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(secret.trim().to_string())
}

/// The `/v1` routes alone over `store`, with the in-memory catalog loaded
/// and refreshing (dev serves them beside ingest); and what must run beside
/// them ([`Workers`]).
pub async fn router(
    cfg: &ApiConfig,
    store: Arc<dyn Store>,
    jobs: Arc<dyn ExportJobStore>,
) -> anyhow::Result<(Router, Workers)> {
    let catalog = Catalog::new(store.clone());
    catalog.refresh().await?;
    catalog.spawn_refresher(CATALOG_REFRESH);
    let state: ApiState = ApiParts {
        store: store.clone(),
        keys: store.clone(),
        accounts: store.clone(),
        usage: UsageMeter::new(store),
        dashboard: cfg.dashboard.clone(),
        plans: cfg.plans.clone(),
        catalog,
        clock: cfg.clock.clone(),
        cursors: cfg.cursors.clone(),
        pages: Arc::new(Cache::new("pages", cfg.page_cache_bytes)),
        known_keys: Arc::new(Cache::new("keys", KEY_BYTES)),
        tokens: Arc::new(Cache::new("tokens", TOKEN_BYTES)),
        exports: Default::default(),
        jobs: Jobs::new(jobs, cfg.export_jobs.clone()),
    }
    .into();
    let workers = Workers {
        state: state.clone(),
    };
    Ok((hindsight_api::router(state), workers))
}

/// What runs beside the `/v1` routes: the meter writing the requests it
/// counted into keys' usage every second, and the export job worker. Both
/// stop with the routes' service: a worker left running would hold the
/// stores, their files and their page caches, after the service is gone.
pub struct Workers {
    state: ApiState,
}

impl Workers {
    /// Runs both while `service` runs; the last usage counts are written
    /// once its servers have answered their last request.
    pub fn attach(self, service: &mut Service) {
        let usage = self.state.usage.clone();
        let periodic = usage.clone();
        service.spawn_with(move |stop| periodic.run(stop));
        service.spawn_with(move |stop| jobs::work(self.state, stop));
        service.after_stop(async move {
            if let Err(e) = usage.flush().await {
                tracing::error!(error = %e, "writing the last usage counts failed");
            }
        });
    }

    /// Runs both until `stop` turns true (or its sender is dropped).
    pub fn spawn(self, stop: tokio::sync::watch::Receiver<bool>) {
        tokio::spawn(self.state.usage.clone().run(stop.clone()));
        tokio::spawn(jobs::work(self.state, stop));
    }
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
    let (routes, workers) = router(cfg, store, backends.export_jobs()?).await?;
    let mut service = Service::new("api", listeners, routes, ops);
    workers.attach(&mut service);
    Ok(service)
}
