//! The command line: every subcommand with its own flags, each flag with a
//! `HINDSIGHT_*` variable.
//!
//! Flag groups are split by who uses them, so that each subcommand shows only
//! what it reads: [`KafkaArgs`] (where the log is) for everything touching
//! Kafka, [`KafkaProducerArgs`] for commands that append, [`KafkaGroupArgs`]
//! for commands that consume, [`KafkaTopicArgs`] for `kafka init` alone;
//! [`ScyllaArgs`] (where the store is) for everything touching the CQL store,
//! `--scylla-write-concurrency` for the writers, `--scylla-replication` for
//! `scylla migrate` alone. Group flags are `global` so they may also follow a
//! nested subcommand (`hindsight keys list --data-dir D`).
//!
//! Booleans read from the environment accept `1/0`, `true/false`, `yes/no`
//! (and `on/off`), as operators write them in unit files and compose files.

use crate::backends::{BackendConfig, KafkaSettings, Uses};
use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The default log filter: warnings from everything, and the lifecycle lines
/// of the binary itself (each service's "listening on" line, "shutting
/// down"), which an operator starting a service always wants to see.
pub const DEFAULT_LOG: &str = "warn,hindsight::lifecycle=info";

#[derive(Parser, Debug)]
#[command(
    name = "hindsight",
    version,
    about = "History of prediction markets: ingest, projector and /v1 API"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `hindsight=debug`.
    /// The default shows warnings and each service's "listening on" line.
    #[arg(long, env = "HINDSIGHT_LOG", default_value = DEFAULT_LOG, global = true)]
    pub log: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Everything in one process on the embedded backends, with demo data.
    Dev(DevArgs),
    /// HTTP ingest alone: validates NDJSON batches and appends them to the log.
    Ingest(IngestArgs),
    /// The projector alone: rolls the log into the read tables.
    Projector(ProjectorArgs),
    /// The /v1 API alone, reading the read store.
    Api(ApiArgs),
    /// Appends NDJSON files (plain or gzip) to the log; with `--project`,
    /// also rolls them into the read tables as it goes.
    Backfill(BackfillArgs),
    /// Drops every read table and replays the whole log into them.
    Rebuild(RebuildArgs),
    /// Manages API keys (only hashes are stored).
    Keys(KeysArgs),
    /// Manages dashboard accounts: organizations and their users.
    Accounts(AccountsArgs),
    /// Sends demo market data to an ingest endpoint, as a pipeline would.
    Feed(FeedArgs),
    /// Prints the OpenAPI document of the /v1 API.
    Openapi,
    /// Kafka administration.
    Kafka(KafkaCommand),
    /// ScyllaDB administration.
    Scylla(ScyllaCommand),
}

impl Command {
    /// How the allocators are tuned for it (`crate::allocator`): the
    /// operator commands that run steps back to back and exit are batch
    /// work; everything else, services and short commands alike, keeps a
    /// service's prompt return of memory.
    pub fn workload(&self) -> crate::allocator::Workload {
        use crate::allocator::Workload;
        match self {
            Command::Backfill(_) | Command::Rebuild(_) => Workload::Batch,
            _ => Workload::Service,
        }
    }
}

// ---- backend flag groups ------------------------------------------------------

const DEFAULT_KAFKA_GROUP: &str = "hindsight-projector";
const DEFAULT_KAFKA_PARTITIONS: i32 = 6;
const DEFAULT_KAFKA_REPLICATION: i32 = 1;
const DEFAULT_KAFKA_MAX_IN_FLIGHT: usize = 200_000;
const DEFAULT_KAFKA_DELIVERY_TIMEOUT_MS: u64 = 10_000;
const DEFAULT_SCYLLA_REPLICATION: &str =
    "{'class': 'NetworkTopologyStrategy', 'replication_factor': 3}";
const DEFAULT_SCYLLA_WRITE_CONCURRENCY: usize = 32;

#[derive(Args, Clone, Debug)]
pub struct DataArgs {
    /// Directory of the embedded log and read store.
    #[arg(
        long,
        env = "HINDSIGHT_DATA_DIR",
        default_value = "./hindsight-data",
        global = true
    )]
    pub data_dir: PathBuf,
}

/// Where the event log is: every command that appends to or reads Kafka.
#[derive(Args, Clone, Debug)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers (`host:port,…`). When set, the event log is
    /// Kafka; otherwise it is the embedded log in the data directory.
    #[arg(long, env = "HINDSIGHT_KAFKA_BROKERS", global = true)]
    pub kafka_brokers: Option<String>,
    /// Topics are `{prefix}.prices`, `.books`, `.metrics` and `.catalog`.
    #[arg(
        long,
        env = "HINDSIGHT_KAFKA_TOPIC_PREFIX",
        default_value = "hindsight",
        global = true
    )]
    pub kafka_topic_prefix: String,
}

/// How an appending command (ingest, backfill) produces to Kafka.
#[derive(Args, Clone, Debug)]
pub struct KafkaProducerArgs {
    /// Events an ingest process may have sent but not yet seen confirmed;
    /// beyond it, ingest answers 503.
    #[arg(long, env = "HINDSIGHT_KAFKA_MAX_IN_FLIGHT", default_value_t = DEFAULT_KAFKA_MAX_IN_FLIGHT)]
    pub kafka_max_in_flight: usize,
    /// How long a record is retried before its batch fails (503).
    #[arg(long, env = "HINDSIGHT_KAFKA_DELIVERY_TIMEOUT_MS", default_value_t = DEFAULT_KAFKA_DELIVERY_TIMEOUT_MS)]
    pub kafka_delivery_timeout_ms: u64,
}

impl Default for KafkaProducerArgs {
    fn default() -> Self {
        KafkaProducerArgs {
            kafka_max_in_flight: DEFAULT_KAFKA_MAX_IN_FLIGHT,
            kafka_delivery_timeout_ms: DEFAULT_KAFKA_DELIVERY_TIMEOUT_MS,
        }
    }
}

/// The consumer group a projector (or a rebuild, derived from it) joins.
#[derive(Args, Clone, Debug)]
pub struct KafkaGroupArgs {
    /// Consumer group of the projectors.
    #[arg(long, env = "HINDSIGHT_KAFKA_GROUP", default_value = DEFAULT_KAFKA_GROUP)]
    pub kafka_group: String,
}

/// Topic layout, for `kafka init` alone.
#[derive(Args, Clone, Debug)]
pub struct KafkaTopicArgs {
    /// Partitions per topic, for `kafka init`.
    #[arg(long, env = "HINDSIGHT_KAFKA_PARTITIONS", default_value_t = DEFAULT_KAFKA_PARTITIONS, global = true)]
    pub kafka_partitions: i32,
    /// Replication factor, for `kafka init`.
    #[arg(long, env = "HINDSIGHT_KAFKA_REPLICATION", default_value_t = DEFAULT_KAFKA_REPLICATION, global = true)]
    pub kafka_replication: i32,
}

impl KafkaArgs {
    /// The Kafka settings when brokers are configured. Flags a command does
    /// not show keep their defaults: they are never read on its path.
    fn settings(
        &self,
        producer: &KafkaProducerArgs,
        group: Option<&str>,
        instance_id: Option<String>,
        topics: Option<&KafkaTopicArgs>,
    ) -> Option<KafkaSettings> {
        let brokers = self.kafka_brokers.clone()?;
        Some(KafkaSettings {
            config: hindsight_kafka::KafkaConfig {
                brokers,
                topic_prefix: self.kafka_topic_prefix.clone(),
                partitions: topics.map_or(DEFAULT_KAFKA_PARTITIONS, |t| t.kafka_partitions),
                replication: topics.map_or(DEFAULT_KAFKA_REPLICATION, |t| t.kafka_replication),
                group: group.unwrap_or(DEFAULT_KAFKA_GROUP).to_string(),
                instance_id,
                max_in_flight: producer.kafka_max_in_flight.max(1),
            },
            delivery_timeout: Duration::from_millis(producer.kafka_delivery_timeout_ms),
        })
    }
}

/// Where the CQL read store is: every command that reads or writes it.
#[derive(Args, Clone, Debug)]
pub struct ScyllaArgs {
    /// ScyllaDB nodes (`host:port,…`). When set, the read store is ScyllaDB;
    /// otherwise it is the embedded store in the data directory.
    #[arg(
        long,
        env = "HINDSIGHT_SCYLLA_NODES",
        global = true,
        value_delimiter = ','
    )]
    pub scylla_nodes: Vec<String>,
    #[arg(
        long,
        env = "HINDSIGHT_SCYLLA_KEYSPACE",
        default_value = "hindsight",
        global = true
    )]
    pub scylla_keyspace: String,
    /// Consistency of reads and writes (LOCAL_QUORUM, QUORUM, ONE, …).
    #[arg(
        long,
        env = "HINDSIGHT_SCYLLA_CONSISTENCY",
        default_value = "LOCAL_QUORUM",
        global = true
    )]
    pub scylla_consistency: String,
    #[arg(
        long,
        env = "HINDSIGHT_SCYLLA_TIMEOUT_MS",
        default_value_t = 5_000,
        global = true
    )]
    pub scylla_timeout_ms: u64,
}

/// How hard a writer (projector, rebuild) drives the CQL store.
#[derive(Args, Clone, Debug)]
pub struct ScyllaWriteArgs {
    /// Unlogged batches a projector has in flight at once.
    #[arg(long, env = "HINDSIGHT_SCYLLA_WRITE_CONCURRENCY", default_value_t = DEFAULT_SCYLLA_WRITE_CONCURRENCY)]
    pub scylla_write_concurrency: usize,
}

impl ScyllaArgs {
    /// The CQL settings when nodes are configured. `replication` is read by
    /// `scylla migrate` only, `write_concurrency` by writers only.
    fn config(
        &self,
        write: Option<&ScyllaWriteArgs>,
        replication: Option<&str>,
    ) -> anyhow::Result<Option<hindsight_scylla::ScyllaConfig>> {
        if self.scylla_nodes.is_empty() {
            return Ok(None);
        }
        let consistency = hindsight_scylla::store::parse_consistency(&self.scylla_consistency)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown consistency {:?} (ONE, TWO, THREE, QUORUM, ALL, LOCAL_QUORUM, EACH_QUORUM, LOCAL_ONE)",
                    self.scylla_consistency
                )
            })?;
        Ok(Some(hindsight_scylla::ScyllaConfig {
            nodes: self.scylla_nodes.clone(),
            keyspace: self.scylla_keyspace.clone(),
            replication: replication
                .unwrap_or(DEFAULT_SCYLLA_REPLICATION)
                .to_string(),
            consistency,
            request_timeout: Duration::from_millis(self.scylla_timeout_ms),
            write_concurrency: write.map_or(DEFAULT_SCYLLA_WRITE_CONCURRENCY, |w| {
                w.scylla_write_concurrency
            }),
        }))
    }
}

#[derive(Args, Clone, Debug)]
pub struct PlanArgs {
    /// JSON file of plans, added to (or replacing) free, pro and enterprise.
    #[arg(long, env = "HINDSIGHT_PLANS_FILE", global = true)]
    pub plans_file: Option<PathBuf>,
}

/// The address browsers reach the service at (`api`, `dev`, `accounts`):
/// sign-in links are printed on it, and an `https` one marks the session
/// cookie `Secure`.
#[derive(Args, Clone, Debug)]
pub struct PublicUrlArgs {
    /// Public base URL of the API service, e.g. `https://data.example.com`
    /// behind a TLS proxy (default: `http://` and the listen address).
    #[arg(long, env = "HINDSIGHT_PUBLIC_URL", global = true)]
    pub public_url: Option<String>,
}

impl PublicUrlArgs {
    pub fn url(&self, listen: SocketAddr) -> String {
        self.public_url
            .clone()
            .unwrap_or_else(|| format!("http://{listen}"))
            .trim_end_matches('/')
            .to_string()
    }

    pub fn dashboard(&self, listen: SocketAddr) -> hindsight_api::dashboard::DashboardConfig {
        hindsight_api::dashboard::DashboardConfig {
            secure_cookies: self.url(listen).starts_with("https://"),
            // Unset: the request's own address (a listen address may be
            // 0.0.0.0 or port 0).
            public_url: self
                .public_url
                .as_deref()
                .map(|u| u.trim_end_matches('/').to_string()),
        }
    }
}

/// How the API runs bulk exports too large for one response (`api`, `dev`).
#[derive(Args, Clone, Debug)]
pub struct ExportJobArgs {
    /// Largest export, in rows, `GET /v1/export/{kind}` streams; a larger
    /// one is refused with 413 and its detail names `POST /v1/exports`,
    /// which runs it as a job.
    #[arg(
        long,
        env = "HINDSIGHT_EXPORT_MAX_SYNC_ROWS",
        default_value_t = 50_000_000
    )]
    pub export_max_sync_rows: u64,
    /// Days a finished export job and its file are kept before deletion.
    #[arg(long, env = "HINDSIGHT_EXPORT_JOB_RETENTION_DAYS", default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..))]
    pub export_job_retention_days: u64,
    /// Seconds a replica's claim on a job stands without renewal (renewed
    /// with every 1 MB chunk): a job whose replica died runs again this
    /// long after its last chunk.
    #[arg(long, env = "HINDSIGHT_EXPORT_JOB_LEASE_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub export_job_lease_secs: u64,
    /// Milliseconds an idle replica waits between looks for a queued job.
    #[arg(long, env = "HINDSIGHT_EXPORT_JOB_POLL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub export_job_poll_ms: u64,
}

impl ExportJobArgs {
    pub fn config(&self) -> hindsight_api::jobs::JobConfig {
        hindsight_api::jobs::JobConfig {
            max_sync_rows: self.export_max_sync_rows,
            retention: Duration::from_secs(self.export_job_retention_days * 86_400),
            lease: Duration::from_secs(self.export_job_lease_secs),
            poll: Duration::from_millis(self.export_job_poll_ms),
            chunk_bytes: hindsight_api::jobs::CHUNK_BYTES,
        }
    }
}

/// The API's page cache (`api`, `dev`; docs/DESIGN.md, "Caching history").
#[derive(Args, Clone, Debug)]
pub struct PageCacheArgs {
    /// Mebibytes of encoded history pages the API keeps, served again
    /// while the embedded store is unchanged (any write empties it; the
    /// CQL store keeps none). 0 turns it off.
    #[arg(long, env = "HINDSIGHT_PAGE_CACHE_MB", default_value_t = 64)]
    pub page_cache_mb: usize,
}

/// How the API signs its pagination cursors (`api`, `dev`).
#[derive(Args, Clone, Debug)]
pub struct CursorArgs {
    /// Secret that signs pagination cursors (at least 32 bytes, e.g.
    /// `openssl rand -hex 32`), the same on every API replica. Several,
    /// comma-separated, for rotation: the first signs, all are accepted.
    /// Unset: one generated once and kept in the data directory
    /// (`cursor.secret`); required with the CQL store.
    #[arg(
        long,
        env = "HINDSIGHT_CURSOR_SECRET",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub cursor_secret: Vec<String>,
}

#[derive(Args, Clone, Debug)]
pub struct IngestOpts {
    /// Bearer token pipelines must send to /ingest/v1 (dev: generated when unset).
    #[arg(long, env = "HINDSIGHT_INGEST_TOKEN", hide_env_values = true)]
    pub ingest_token: Option<String>,
    /// Largest ingest body in bytes, compressed or decompressed.
    #[arg(long, env = "HINDSIGHT_INGEST_MAX_BODY_BYTES", default_value_t = 64 << 20)]
    pub ingest_max_body_bytes: usize,
    #[command(flatten)]
    pub wire: WireLimitsOpts,
    /// Most refused lines listed in one ingest response; the rest are only
    /// counted (`rejected_count`).
    #[arg(
        long,
        env = "HINDSIGHT_INGEST_MAX_LISTED_REJECTS",
        default_value_t = 1000
    )]
    pub ingest_max_listed_rejects: usize,
}

impl IngestOpts {
    pub fn limits(&self) -> hindsight_ingest::http::IngestLimits {
        hindsight_ingest::http::IngestLimits {
            wire: self.wire.limits(),
            max_listed_rejects: self.ingest_max_listed_rejects,
            ..Default::default()
        }
    }
}

/// What every line must satisfy beyond its shape, over HTTP and in
/// backfills alike.
#[derive(Args, Clone, Debug)]
pub struct WireLimitsOpts {
    /// How far past now (seconds) a `ts` or catalog `updated_at` may lie
    /// before the line is refused as `in_the_future`.
    #[arg(
        long,
        env = "HINDSIGHT_INGEST_MAX_FUTURE_SKEW_SECS",
        default_value_t = 300
    )]
    pub ingest_max_future_skew_secs: u32,
    /// Most levels on one side of a book snapshot.
    #[arg(long, env = "HINDSIGHT_INGEST_MAX_BOOK_LEVELS", default_value_t = 1000)]
    pub ingest_max_book_levels: usize,
}

impl WireLimitsOpts {
    pub fn limits(&self) -> hindsight_schemas::wire::Limits {
        hindsight_schemas::wire::Limits {
            max_future_skew_ms: i64::from(self.ingest_max_future_skew_secs) * 1000,
            max_book_levels: self.ingest_max_book_levels,
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct ProjectorOpts {
    /// Most events folded into one durable projector step [default: 20000;
    /// 250000 for `rebuild`].
    #[arg(long, env = "HINDSIGHT_PROJECTOR_BATCH_MAX")]
    pub projector_batch_max: Option<usize>,
    /// Most events in one step while the log is behind: each full poll
    /// doubles the next, up to this (a short one sizes the next to what it
    /// found), and larger steps drain a backlog with fewer writes but hold
    /// more in memory [default: 640000; 250000 for `rebuild`].
    #[arg(long, env = "HINDSIGHT_PROJECTOR_BACKLOG_BATCH_MAX")]
    pub projector_backlog_batch_max: Option<usize>,
    /// Most bucket rows a grown step may touch: over many tokens a step's
    /// rows, not its events, are most of the projector's memory, and a
    /// step grows only as far as its rows per event allow. Larger drains a
    /// backlog over many tokens faster, with more memory [default: 300000].
    #[arg(long, env = "HINDSIGHT_PROJECTOR_STEP_ROWS_MAX")]
    pub projector_step_rows_max: Option<usize>,
}

impl ProjectorOpts {
    /// The running projector's: small steps keep the time from an event's
    /// append to its buckets short, and once a backlog is drained its
    /// steps' memory goes back to the system.
    pub fn config(&self) -> hindsight_projector::ProjectorConfig {
        hindsight_projector::ProjectorConfig {
            release_memory: Some(crate::allocator::release_free_memory),
            ..self.with_default(hindsight_projector::ProjectorConfig::default())
        }
    }

    /// `rebuild`'s: the whole log is behind, nobody waits on one event,
    /// and every step rewrites each coarse bucket it touched — so steps
    /// are large (see `ProjectorConfig::rebuild`).
    pub fn rebuild_config(&self) -> hindsight_projector::ProjectorConfig {
        self.with_default(hindsight_projector::ProjectorConfig::rebuild())
    }

    fn with_default(
        &self,
        config: hindsight_projector::ProjectorConfig,
    ) -> hindsight_projector::ProjectorConfig {
        hindsight_projector::ProjectorConfig {
            batch_max: self.projector_batch_max.unwrap_or(config.batch_max).max(1),
            backlog_batch_max: self
                .projector_backlog_batch_max
                .unwrap_or(config.backlog_batch_max),
            step_rows_max: self.projector_step_rows_max.unwrap_or(config.step_rows_max),
            ..config
        }
    }
}

/// Bounds on every connection of a serving command's listeners (see
/// `services::http`): without them one client can hold connections open for
/// ever and exhaust the process's file descriptors.
#[derive(Args, Clone, Debug)]
pub struct HttpArgs {
    /// Seconds a client has to send a request's whole head (from the moment
    /// the connection is ready for one); slower connections are closed.
    #[arg(long, env = "HINDSIGHT_HTTP_HEADER_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_secs: u64,
    /// Seconds a connection may move no byte, with no request being handled,
    /// before it is closed (idle keep-alive, readers that stopped reading).
    #[arg(long, env = "HINDSIGHT_HTTP_IDLE_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_secs: u64,
    /// Seconds a request (its body read included) may take before it is
    /// answered 408.
    #[arg(long, env = "HINDSIGHT_HTTP_REQUEST_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_request_timeout_secs: u64,
    /// Connections served at once per listener; further ones wait to be
    /// accepted. Keep it well under the process's file limit (`ulimit -n`).
    #[arg(long, env = "HINDSIGHT_HTTP_MAX_CONNECTIONS", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub http_max_connections: u32,
}

impl HttpArgs {
    pub fn limits(&self) -> crate::services::http::HttpLimits {
        crate::services::http::HttpLimits {
            header_timeout: Duration::from_secs(self.http_header_timeout_secs),
            idle_timeout: Duration::from_secs(self.http_idle_timeout_secs),
            request_timeout: Duration::from_secs(self.http_request_timeout_secs),
            max_connections: self.http_max_connections,
        }
    }
}

// ---- subcommands --------------------------------------------------------------

#[derive(Args, Clone, Debug)]
pub struct DevArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Address of /v1, /ingest/v1 (and /metrics, /livez and /readyz unless
    /// --metrics-listen is given).
    #[arg(long, env = "HINDSIGHT_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of /metrics, /livez and /readyz (default: the listen
    /// address); when set, the listen address does not serve them.
    #[arg(long, env = "HINDSIGHT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub ingest: IngestOpts,
    #[command(flatten)]
    pub projector: ProjectorOpts,
    #[command(flatten)]
    pub plans: PlanArgs,
    #[command(flatten)]
    pub cursor: CursorArgs,
    #[command(flatten)]
    pub exports: ExportJobArgs,
    #[command(flatten)]
    pub page_cache: PageCacheArgs,
    #[command(flatten)]
    pub public: PublicUrlArgs,
    /// The API key dev accepts (generated and printed when unset).
    #[arg(long, env = "HINDSIGHT_DEMO_API_KEY", hide_env_values = true)]
    pub demo_api_key: Option<String>,
    /// Plan of the demo key.
    #[arg(long, env = "HINDSIGHT_DEMO_PLAN", default_value = "enterprise")]
    pub demo_plan: String,
    /// Start without generated demo data.
    #[arg(long, env = "HINDSIGHT_NO_DEMO", value_parser = BoolishValueParser::new())]
    pub no_demo: bool,
    #[command(flatten)]
    pub demo: DemoArgs,
}

/// What the demo generator produces (dev and feed).
#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Seed of the demo generator.
    #[arg(long, env = "HINDSIGHT_DEMO_SEED", default_value_t = 2025)]
    pub demo_seed: u64,
    /// Hours of demo history generated first.
    #[arg(long, env = "HINDSIGHT_DEMO_HISTORY_HOURS", default_value_t = 48)]
    pub demo_history_hours: u32,
}

impl DevArgs {
    /// Dev always runs on the embedded backends, every part in one process.
    pub fn backends(&self) -> BackendConfig {
        BackendConfig {
            data_dir: self.data.data_dir.clone(),
            kafka: None,
            scylla: None,
            uses: Uses::ALL,
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct IngestArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub producer: KafkaProducerArgs,
    /// The store whose catalog lines are checked against. With Kafka, it
    /// also holds the idempotency keys every ingest replica shares (a CQL
    /// store; with the embedded store, keys live in this data directory's
    /// `idempotency.db`, and only retries reaching this host are safe).
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[arg(long, env = "HINDSIGHT_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// Address of /metrics, /livez and /readyz (default: the listen
    /// address); when set, the listen address does not serve them.
    #[arg(long, env = "HINDSIGHT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub ingest: IngestOpts,
}

impl IngestArgs {
    pub fn backends(&self) -> anyhow::Result<BackendConfig> {
        Ok(BackendConfig {
            data_dir: self.data.data_dir.clone(),
            kafka: self.kafka.settings(&self.producer, None, None, None),
            scylla: self.scylla.config(None, None)?,
            uses: Uses::INGEST,
        })
    }
}

#[derive(Args, Clone, Debug)]
pub struct ProjectorArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub group: KafkaGroupArgs,
    /// Static group membership for a projector: a stable name (pod or
    /// replica name). A restarted projector with the same name takes over
    /// its predecessor's partitions at once.
    #[arg(long, env = "HINDSIGHT_KAFKA_INSTANCE_ID")]
    pub kafka_instance_id: Option<String>,
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(flatten)]
    pub scylla_write: ScyllaWriteArgs,
    /// Address of the projector's /metrics, /livez and /readyz.
    #[arg(
        long,
        env = "HINDSIGHT_METRICS_LISTEN",
        default_value = "127.0.0.1:9464"
    )]
    pub metrics_listen: SocketAddr,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub projector: ProjectorOpts,
}

impl ProjectorArgs {
    pub fn backends(&self) -> anyhow::Result<BackendConfig> {
        Ok(BackendConfig {
            data_dir: self.data.data_dir.clone(),
            kafka: self.kafka.settings(
                &KafkaProducerArgs::default(),
                Some(&self.group.kafka_group),
                self.kafka_instance_id.clone(),
                None,
            ),
            scylla: self.scylla.config(Some(&self.scylla_write), None)?,
            uses: Uses::CONSUME,
        })
    }
}

#[derive(Args, Clone, Debug)]
pub struct ApiArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(flatten)]
    pub plans: PlanArgs,
    #[command(flatten)]
    pub cursor: CursorArgs,
    #[command(flatten)]
    pub exports: ExportJobArgs,
    #[command(flatten)]
    pub page_cache: PageCacheArgs,
    #[command(flatten)]
    pub public: PublicUrlArgs,
    #[arg(long, env = "HINDSIGHT_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of /metrics, /livez and /readyz (default: the listen
    /// address); when set, the listen address does not serve them.
    #[arg(long, env = "HINDSIGHT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub http: HttpArgs,
}

impl ApiArgs {
    pub fn backends(&self) -> anyhow::Result<BackendConfig> {
        Ok(BackendConfig {
            data_dir: self.data.data_dir.clone(),
            kafka: None,
            scylla: self.scylla.config(None, None)?,
            uses: Uses::READ,
        })
    }
}

#[derive(Args, Clone, Debug)]
pub struct BackfillArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub producer: KafkaProducerArgs,
    /// The store whose catalog lines are checked against, and with Kafka
    /// the idempotency keys (as ingest).
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    /// NDJSON files; gzip is detected by content.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub wire: WireLimitsOpts,
    /// No progress line (for logs and CI).
    #[arg(long, env = "HINDSIGHT_NO_PROGRESS", value_parser = BoolishValueParser::new())]
    pub no_progress: bool,
    /// Also roll what is appended into the read tables, while appending
    /// (embedded log only): the files are queryable when the command
    /// returns. It takes the data directory's projector, so `dev` or
    /// `projector` cannot start on it meanwhile; when one already runs, the
    /// backfill only appends and that one rolls the files in.
    #[arg(long, env = "HINDSIGHT_BACKFILL_PROJECT", value_parser = BoolishValueParser::new())]
    pub project: bool,
    /// The steps of the projector `--project` runs (as `rebuild`'s).
    #[command(flatten)]
    pub projector: ProjectorOpts,
}

impl BackfillArgs {
    pub fn backends(&self) -> anyhow::Result<BackendConfig> {
        Ok(BackendConfig {
            data_dir: self.data.data_dir.clone(),
            kafka: self.kafka.settings(&self.producer, None, None, None),
            scylla: self.scylla.config(None, None)?,
            uses: Uses::INGEST,
        })
    }
}

#[derive(Args, Clone, Debug)]
pub struct RebuildArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub group: KafkaGroupArgs,
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(flatten)]
    pub scylla_write: ScyllaWriteArgs,
    #[command(flatten)]
    pub projector: ProjectorOpts,
}

impl RebuildArgs {
    /// A rebuild reads Kafka from the beginning under a fresh consumer group
    /// named after the projectors' (`{group}-rebuild-{ms}`); the embedded log
    /// is read from offset 0 once the store is reset.
    pub fn backends(&self, now_ms: i64) -> anyhow::Result<BackendConfig> {
        let group = format!("{}-rebuild-{now_ms}", self.group.kafka_group);
        Ok(BackendConfig {
            data_dir: self.data.data_dir.clone(),
            kafka: self
                .kafka
                .settings(&KafkaProducerArgs::default(), Some(&group), None, None),
            scylla: self.scylla.config(Some(&self.scylla_write), None)?,
            uses: Uses::CONSUME,
        })
    }
}

#[derive(Args, Clone, Debug)]
pub struct FeedArgs {
    /// Base address of an ingest service (or `dev`).
    #[arg(
        long,
        env = "HINDSIGHT_INGEST_URL",
        default_value = "http://127.0.0.1:8081"
    )]
    pub ingest_url: String,
    #[arg(long, env = "HINDSIGHT_INGEST_TOKEN", hide_env_values = true)]
    pub ingest_token: String,
    #[command(flatten)]
    pub demo: DemoArgs,
    /// Keep sending a round of live ticks every second afterwards.
    #[arg(long)]
    pub live: bool,
}

#[derive(Args, Clone, Debug)]
pub struct KeysArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(flatten)]
    pub plans: PlanArgs,
    #[command(subcommand)]
    pub action: KeysAction,
}

impl KeysArgs {
    pub fn backends(&self) -> anyhow::Result<BackendConfig> {
        Ok(BackendConfig {
            data_dir: self.data.data_dir.clone(),
            kafka: None,
            scylla: self.scylla.config(None, None)?,
            uses: Uses::READ,
        })
    }
}

#[derive(Subcommand, Clone, Debug)]
pub enum KeysAction {
    /// Creates a key and prints it once.
    Create {
        #[arg(long)]
        org: String,
        #[arg(long, default_value = "free")]
        plan: String,
    },
    /// Lists keys (ids, organizations, plans; never the keys).
    List,
    /// Revokes a key by its id.
    Revoke { key_id: String },
    /// Moves a key to another plan, effective immediately.
    SetPlan { key_id: String, plan: String },
}

#[derive(Args, Clone, Debug)]
pub struct AccountsArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(flatten)]
    pub plans: PlanArgs,
    #[command(flatten)]
    pub public: PublicUrlArgs,
    /// The API's listen address, for the sign-in link when
    /// --public-url is not given.
    #[arg(
        long,
        env = "HINDSIGHT_LISTEN",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    pub listen: SocketAddr,
    #[command(subcommand)]
    pub action: AccountsAction,
}

impl AccountsArgs {
    pub fn backends(&self) -> anyhow::Result<BackendConfig> {
        Ok(BackendConfig {
            data_dir: self.data.data_dir.clone(),
            kafka: None,
            scylla: self.scylla.config(None, None)?,
            uses: Uses::READ,
        })
    }
}

#[derive(Subcommand, Clone, Debug)]
pub enum AccountsAction {
    /// Creates an organization and its owner, and prints the owner's
    /// one-time sign-in link (valid 24 hours).
    Create {
        #[arg(long)]
        org: String,
        #[arg(long)]
        email: String,
        #[arg(long, default_value = "free")]
        plan: String,
    },
    /// Prints a new one-time sign-in link for an existing user (a lost
    /// password).
    Link {
        #[arg(long)]
        email: String,
    },
}

#[derive(Args, Clone, Debug)]
pub struct KafkaCommand {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub topics: KafkaTopicArgs,
    #[command(subcommand)]
    pub action: KafkaAction,
}

#[derive(Subcommand, Clone, Debug)]
pub enum KafkaAction {
    /// Creates the topics (or verifies existing ones) through the admin API.
    Init,
}

impl KafkaCommand {
    pub fn config(&self) -> anyhow::Result<hindsight_kafka::KafkaConfig> {
        let settings = self
            .kafka
            .settings(
                &KafkaProducerArgs::default(),
                None,
                None,
                Some(&self.topics),
            )
            .ok_or_else(|| {
                anyhow::anyhow!("HINDSIGHT_KAFKA_BROKERS (or --kafka-brokers) is required")
            })?;
        Ok(settings.config)
    }
}

#[derive(Args, Clone, Debug)]
pub struct ScyllaCommand {
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    /// Replication of the keyspace, for `scylla migrate` (a CQL map).
    #[arg(
        long,
        env = "HINDSIGHT_SCYLLA_REPLICATION",
        default_value = DEFAULT_SCYLLA_REPLICATION,
        global = true
    )]
    pub scylla_replication: String,
    #[command(subcommand)]
    pub action: ScyllaAction,
}

#[derive(Subcommand, Clone, Debug)]
pub enum ScyllaAction {
    /// Creates the keyspace and tables (idempotent; records the schema version).
    Migrate,
}

impl ScyllaCommand {
    pub fn config(&self) -> anyhow::Result<hindsight_scylla::ScyllaConfig> {
        self.scylla
            .config(None, Some(&self.scylla_replication))?
            .ok_or_else(|| {
                anyhow::anyhow!("HINDSIGHT_SCYLLA_NODES (or --scylla-nodes) is required")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// clap's own checks (conflicting ids, globals, defaults that do not
    /// parse); the flags each subcommand shows are checked through the
    /// binary in `tests/app/cli.rs`.
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn projector_config(args: &[&str]) -> hindsight_projector::ProjectorConfig {
        let cli = Cli::try_parse_from([&["hindsight", "projector"], args].concat()).unwrap();
        match cli.command {
            Command::Projector(a) => a.projector.config(),
            _ => unreachable!("parsed as the projector"),
        }
    }

    #[test]
    fn the_projectors_step_bounds_come_from_its_flags() {
        let default = hindsight_projector::ProjectorConfig::default();
        let given = projector_config(&[]);
        assert_eq!(given.step_rows_max, default.step_rows_max);
        assert_eq!(given.backlog_batch_max, default.backlog_batch_max);
        let given = projector_config(&[
            "--projector-step-rows-max",
            "1000",
            "--projector-backlog-batch-max",
            "5000",
        ]);
        assert_eq!(given.step_rows_max, 1_000);
        assert_eq!(given.backlog_batch_max, 5_000);
    }

    /// The commands that run steps back to back and exit get the batch
    /// allocator tuning; services keep theirs.
    #[test]
    fn batch_commands_are_tuned_as_batch_work() {
        use crate::allocator::Workload;
        let workload = |args: &[&str]| {
            Cli::try_parse_from([&["hindsight"], args].concat())
                .unwrap()
                .command
                .workload()
        };
        assert_eq!(
            workload(&["backfill", "--project", "f.ndjson"]),
            Workload::Batch
        );
        assert_eq!(workload(&["rebuild"]), Workload::Batch);
        for service in ["dev", "ingest", "projector", "api"] {
            assert_eq!(workload(&[service]), Workload::Service, "{service}");
        }
    }
}
