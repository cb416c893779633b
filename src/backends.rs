//! The one place that chooses implementations: the embedded SQLite log or
//! Kafka, the embedded SQLite store or the CQL store, and where Kafka's
//! idempotency keys live (the CQL store when there is one, shared by every
//! ingest replica; else `idempotency.db` in the data directory). Everything
//! above this module sees only the traits of `hindsight-contracts`.

use anyhow::{anyhow, Context};
use hindsight_contracts::{
    ConsumerSource, EventLog, ExportJobStore, IdempotencyStore, ProjectionStore, Store,
};
use hindsight_kafka::{KafkaConfig, KafkaLog, KafkaSource};
use hindsight_scylla::{ScyllaConfig, ScyllaStore};
use hindsight_sqlite::{EmbeddedSource, IdempotencyFile, SqliteLog, SqliteStore};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long a starting service waits for Kafka to describe its topics.
const TOPIC_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping service waits for Kafka to confirm what it sent.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// The read store and the same backend as the export jobs' store.
type StoreViews = (Option<Arc<dyn Store>>, Option<Arc<dyn ExportJobStore>>);

/// Which parts of the deployment a command uses; only those are connected,
/// so `api` needs no brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uses {
    /// Appends to the event log (ingest, backfill).
    pub append: bool,
    /// Consumes the log into the store (projector, rebuild).
    pub consume: bool,
    /// Reads the store: its catalog (ingest, backfill), keys and rate
    /// windows (api, keys).
    pub read: bool,
}

impl Uses {
    /// Appends, checking lines against the store's catalog (ingest,
    /// backfill).
    pub const INGEST: Uses = Uses {
        append: true,
        consume: false,
        read: true,
    };
    pub const CONSUME: Uses = Uses {
        append: false,
        consume: true,
        read: false,
    };
    pub const READ: Uses = Uses {
        append: false,
        consume: false,
        read: true,
    };
    pub const ALL: Uses = Uses {
        append: true,
        consume: true,
        read: true,
    };
}

/// Kafka as the event log.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    pub config: KafkaConfig,
    /// How long a record is retried before its batch fails.
    pub delivery_timeout: Duration,
}

/// Everything [`Backends::connect`] needs to decide and connect.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// The embedded log and store, Kafka's idempotency file, and the
    /// projector lock live here.
    pub data_dir: PathBuf,
    /// `Some`: the event log is Kafka; `None`: the embedded log.
    pub kafka: Option<KafkaSettings>,
    /// `Some`: the read store is CQL; `None`: the embedded store. With
    /// Kafka, it also holds the idempotency keys of appending commands.
    pub scylla: Option<ScyllaConfig>,
    pub uses: Uses,
}

impl BackendConfig {
    /// Every part, embedded, in `dir` (dev, tests, benchmarks).
    pub fn embedded(dir: &Path) -> Self {
        BackendConfig {
            data_dir: dir.to_path_buf(),
            kafka: None,
            scylla: None,
            uses: Uses::ALL,
        }
    }
}

/// The connected backends of one process, as trait objects.
pub struct Backends {
    log: Option<Arc<dyn EventLog>>,
    source: Option<Arc<dyn ConsumerSource>>,
    store: Option<Arc<dyn Store>>,
    /// Export jobs: `exports.db` beside the embedded store, or the CQL
    /// store's tables.
    export_jobs: Option<Arc<dyn ExportJobStore>>,
    /// The Kafka producer, flushed by [`Backends::close`].
    kafka: Option<Arc<KafkaLog>>,
    /// The embedded log, when it is the log: dev asks whether it is empty.
    embedded_log: Option<Arc<SqliteLog>>,
    /// Held while an embedded projector runs (see [`lock_projector`]).
    _projector_lock: Option<File>,
}

impl Backends {
    /// Connects what `cfg.uses` asks for. One embedded log is shared by the
    /// appending and the consuming side, so an in-process projector wakes as
    /// soon as ingest appends.
    pub async fn connect(cfg: &BackendConfig) -> anyhow::Result<Backends> {
        // Adapters record metrics as they open (the log's head): the
        // registry must exist first.
        hindsight_telemetry::install();
        let dir = &cfg.data_dir;
        let uses = cfg.uses;
        // One CQL session serves the store and, for a Kafka ingest, the
        // idempotency keys.
        let needs_store = uses.read || uses.consume;
        let needs_cql_keys = uses.append && cfg.kafka.is_some();
        let cql = match &cfg.scylla {
            Some(config) if needs_store || needs_cql_keys => Some(Arc::new(
                ScyllaStore::connect(config.clone())
                    .await
                    .context("connecting to the CQL store")?,
            )),
            _ => None,
        };
        let (store, export_jobs): StoreViews = match (&cql, needs_store) {
            (_, false) => (None, None),
            (Some(cql), true) => (Some(cql.clone()), Some(cql.clone())),
            (None, true) => {
                let embedded = Arc::new(SqliteStore::open(dir)?);
                (Some(embedded.clone()), Some(embedded))
            }
        };
        let mut backends = Backends {
            log: None,
            source: None,
            store: store.clone(),
            export_jobs,
            kafka: None,
            embedded_log: None,
            _projector_lock: None,
        };
        if !(uses.append || uses.consume) {
            return Ok(backends);
        }
        match &cfg.kafka {
            Some(kafka) => {
                hindsight_kafka::topics::verify(&kafka.config, TOPIC_CHECK_TIMEOUT)?;
                if uses.append {
                    hindsight_kafka::topics::verify_markers(&kafka.config, TOPIC_CHECK_TIMEOUT)?;
                    // Kafka cannot record a key atomically with an append:
                    // keys are claimed in a store every replica shares.
                    let idempotency: Arc<dyn IdempotencyStore> = match &cql {
                        Some(cql) => cql.clone(),
                        // Safe for the processes sharing this data directory.
                        None => Arc::new(IdempotencyFile::open(dir)?),
                    };
                    let log = Arc::new(KafkaLog::new(
                        kafka.config.clone(),
                        Some(idempotency),
                        kafka.delivery_timeout,
                    )?);
                    backends.log = Some(log.clone());
                    backends.kafka = Some(log);
                }
                if uses.consume {
                    backends.source = Some(Arc::new(KafkaSource {
                        config: kafka.config.clone(),
                        store: store.clone().map(|s| s as Arc<dyn ProjectionStore>),
                    }));
                }
            }
            None => {
                if uses.consume {
                    backends._projector_lock = Some(lock_projector(dir)?);
                }
                let log = Arc::new(SqliteLog::open(dir)?);
                if uses.append {
                    backends.log = Some(log.clone());
                }
                if let (true, Some(store)) = (uses.consume, &store) {
                    backends.source = Some(Arc::new(EmbeddedSource {
                        log: log.clone(),
                        store: store.clone(),
                    }));
                }
                backends.embedded_log = Some(log);
            }
        }
        Ok(backends)
    }

    /// The log to append to.
    pub fn log(&self) -> anyhow::Result<Arc<dyn EventLog>> {
        self.log
            .clone()
            .ok_or_else(|| not_connected("the event log"))
    }

    /// Where a projector reads.
    pub fn source(&self) -> anyhow::Result<Arc<dyn ConsumerSource>> {
        self.source
            .clone()
            .ok_or_else(|| not_connected("a log consumer"))
    }

    /// The read store (projections, keys and rate windows).
    pub fn store(&self) -> anyhow::Result<Arc<dyn Store>> {
        self.store
            .clone()
            .ok_or_else(|| not_connected("the read store"))
    }

    /// Where export jobs are kept: the read store's backend.
    pub fn export_jobs(&self) -> anyhow::Result<Arc<dyn ExportJobStore>> {
        self.export_jobs
            .clone()
            .ok_or_else(|| not_connected("the export job store"))
    }

    /// The embedded log, when the log is embedded.
    pub fn embedded_log(&self) -> Option<&Arc<SqliteLog>> {
        self.embedded_log.as_ref()
    }

    /// True when the log has never held an event. Only the embedded log can
    /// say so cheaply; a Kafka log is never taken as empty.
    pub async fn log_is_empty(&self) -> anyhow::Result<bool> {
        match &self.embedded_log {
            Some(log) => Ok(log.head().await? == 0),
            None => Ok(false),
        }
    }

    /// Waits for Kafka to confirm what this process sent (at exit).
    pub async fn close(self) {
        if let Some(kafka) = self.kafka {
            let _ = tokio::task::spawn_blocking(move || kafka.flush(FLUSH_TIMEOUT)).await;
        }
    }
}

fn not_connected(what: &str) -> anyhow::Error {
    anyhow!("{what} was not connected: BackendConfig::uses does not ask for it")
}

/// Only one projector may write an embedded read store: a second one would
/// fold the same events into the same rows.
fn lock_projector(dir: &Path) -> anyhow::Result<File> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("projector.lock");
    let file = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    file.try_lock().map_err(|_| ProjectorLocked(path))?;
    Ok(file)
}

/// Another process holds the projector lock of an embedded data directory:
/// [`Backends::connect`] fails with it (a backfill then only appends).
#[derive(Debug)]
pub struct ProjectorLocked(PathBuf);

impl std::fmt::Display for ProjectorLocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "another projector holds {} (is `hindsight dev`, `projector`, `rebuild` or `backfill` running on this data dir?)",
            self.0.display()
        )
    }
}

impl std::error::Error for ProjectorLocked {}
