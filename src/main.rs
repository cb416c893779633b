//! `hindsight`: every service of Hindsight in one binary.
//!
//! `dev` runs ingest, projector, API and a demo feed in one process on the
//! embedded backends; `ingest`, `projector` and `api` run one service each
//! over a shared data directory; `backfill`, `rebuild` and `keys` are
//! operator commands. Every flag has a `HINDSIGHT_*` environment variable.

mod services;

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "hindsight",
    version,
    about = "History of prediction markets: ingest, projector and /v1 API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `hindsight=debug`.
    #[arg(long, env = "HINDSIGHT_LOG", default_value = "warn", global = true)]
    log: String,
}

#[derive(Subcommand)]
enum Command {
    /// Everything in one process on the embedded backends, with demo data.
    Dev(DevArgs),
    /// HTTP ingest alone: validates NDJSON batches and appends them to the log.
    Ingest(IngestArgs),
    /// The projector alone: rolls the log into the read tables.
    Projector(ProjectorArgs),
    /// The /v1 API alone, reading the read store.
    Api(ApiArgs),
    /// Appends NDJSON files (plain or gzip) to the log.
    Backfill(BackfillArgs),
    /// Drops every read table and replays the whole log into them.
    Rebuild(RebuildArgs),
    /// Manages API keys (only hashes are stored).
    Keys(KeysArgs),
    /// Sends demo market data to an ingest endpoint, as a pipeline would.
    Feed(FeedArgs),
    /// Prints the OpenAPI document of the /v1 API.
    Openapi,
    /// Kafka administration.
    Kafka(KafkaCommand),
    /// ScyllaDB administration.
    Scylla(ScyllaCommand),
}

#[derive(Args, Clone)]
pub struct ScyllaCommand {
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(subcommand)]
    pub action: ScyllaAction,
}

#[derive(Subcommand, Clone)]
pub enum ScyllaAction {
    /// Creates the keyspace and tables (idempotent; records the schema version).
    Migrate,
}

#[derive(Args, Clone)]
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
    /// Replication of the keyspace, for `scylla migrate` (a CQL map).
    #[arg(
        long,
        env = "HINDSIGHT_SCYLLA_REPLICATION",
        default_value = "{'class': 'NetworkTopologyStrategy', 'replication_factor': 3}",
        global = true
    )]
    pub scylla_replication: String,
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
    /// Unlogged batches a projector has in flight at once.
    #[arg(
        long,
        env = "HINDSIGHT_SCYLLA_WRITE_CONCURRENCY",
        default_value_t = 32,
        global = true
    )]
    pub scylla_write_concurrency: usize,
}

impl ScyllaArgs {
    pub fn config(&self) -> anyhow::Result<Option<hindsight_scylla::ScyllaConfig>> {
        if self.scylla_nodes.is_empty() {
            return Ok(None);
        }
        let consistency = hindsight_scylla::store::parse_consistency(&self.scylla_consistency)
            .ok_or_else(|| anyhow::anyhow!("unknown consistency {:?}", self.scylla_consistency))?;
        Ok(Some(hindsight_scylla::ScyllaConfig {
            nodes: self.scylla_nodes.clone(),
            keyspace: self.scylla_keyspace.clone(),
            replication: self.scylla_replication.clone(),
            consistency,
            request_timeout: std::time::Duration::from_millis(self.scylla_timeout_ms),
            write_concurrency: self.scylla_write_concurrency,
        }))
    }
}

#[derive(Args, Clone)]
pub struct KafkaCommand {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(subcommand)]
    pub action: KafkaAction,
}

#[derive(Subcommand, Clone)]
pub enum KafkaAction {
    /// Creates the topics (or verifies existing ones) through the admin API.
    Init,
}

#[derive(Args, Clone)]
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
    /// Partitions per topic, for `kafka init`.
    #[arg(
        long,
        env = "HINDSIGHT_KAFKA_PARTITIONS",
        default_value_t = 6,
        global = true
    )]
    pub kafka_partitions: i32,
    /// Replication factor, for `kafka init`.
    #[arg(
        long,
        env = "HINDSIGHT_KAFKA_REPLICATION",
        default_value_t = 1,
        global = true
    )]
    pub kafka_replication: i32,
    /// Consumer group of the projectors.
    #[arg(
        long,
        env = "HINDSIGHT_KAFKA_GROUP",
        default_value = "hindsight-projector",
        global = true
    )]
    pub kafka_group: String,
    /// Static group membership for a projector: a stable name (pod or
    /// replica name). A restarted projector with the same name takes over
    /// its predecessor's partitions at once.
    #[arg(long, env = "HINDSIGHT_KAFKA_INSTANCE_ID", global = true)]
    pub kafka_instance_id: Option<String>,
    /// Events an ingest process may have sent but not yet seen confirmed;
    /// beyond it, ingest answers 503.
    #[arg(
        long,
        env = "HINDSIGHT_KAFKA_MAX_IN_FLIGHT",
        default_value_t = 200_000,
        global = true
    )]
    pub kafka_max_in_flight: usize,
    /// How long a record is retried before its batch fails (503).
    #[arg(
        long,
        env = "HINDSIGHT_KAFKA_DELIVERY_TIMEOUT_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub kafka_delivery_timeout_ms: u64,
}

impl KafkaArgs {
    pub fn config(&self) -> Option<hindsight_kafka::KafkaConfig> {
        self.kafka_brokers
            .as_ref()
            .map(|brokers| hindsight_kafka::KafkaConfig {
                brokers: brokers.clone(),
                topic_prefix: self.kafka_topic_prefix.clone(),
                partitions: self.kafka_partitions,
                replication: self.kafka_replication,
                group: self.kafka_group.clone(),
                instance_id: self.kafka_instance_id.clone(),
                max_in_flight: self.kafka_max_in_flight.max(1),
            })
    }
}

#[derive(Args, Clone)]
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

#[derive(Args, Clone)]
pub struct PlanArgs {
    /// JSON file of plans, added to (or replacing) free, pro and enterprise.
    #[arg(long, env = "HINDSIGHT_PLANS_FILE", global = true)]
    pub plans_file: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct IngestOpts {
    /// Bearer token pipelines must send to /ingest/v1 (dev: generated when unset).
    #[arg(long, env = "HINDSIGHT_INGEST_TOKEN", hide_env_values = true)]
    pub ingest_token: Option<String>,
    /// Largest ingest body in bytes, compressed or decompressed.
    #[arg(long, env = "HINDSIGHT_INGEST_MAX_BODY_BYTES", default_value_t = 64 << 20)]
    pub ingest_max_body_bytes: usize,
}

#[derive(Args, Clone)]
pub struct ProjectorOpts {
    /// Most events folded into one durable projector step.
    #[arg(long, env = "HINDSIGHT_PROJECTOR_BATCH_MAX", default_value_t = 20_000)]
    pub projector_batch_max: usize,
}

#[derive(Args, Clone)]
pub struct DevArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Address of /v1, /ingest/v1, /metrics, /livez and /readyz.
    #[arg(long, env = "HINDSIGHT_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub ingest: IngestOpts,
    #[command(flatten)]
    pub projector: ProjectorOpts,
    #[command(flatten)]
    pub plans: PlanArgs,
    /// The API key dev accepts (generated and printed when unset).
    #[arg(long, env = "HINDSIGHT_DEMO_API_KEY", hide_env_values = true)]
    pub demo_api_key: Option<String>,
    /// Plan of the demo key.
    #[arg(long, env = "HINDSIGHT_DEMO_PLAN", default_value = "enterprise")]
    pub demo_plan: String,
    /// Start without generated demo data.
    #[arg(long, env = "HINDSIGHT_NO_DEMO")]
    pub no_demo: bool,
    /// Seed of the demo generator.
    #[arg(long, env = "HINDSIGHT_DEMO_SEED", default_value_t = 2025)]
    pub demo_seed: u64,
    /// Hours of demo history generated at first start.
    #[arg(long, env = "HINDSIGHT_DEMO_HISTORY_HOURS", default_value_t = 48)]
    pub demo_history_hours: u32,
}

#[derive(Args, Clone)]
pub struct IngestArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[arg(long, env = "HINDSIGHT_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// Address of /metrics, /livez and /readyz (default: the listen address).
    #[arg(long, env = "HINDSIGHT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub ingest: IngestOpts,
}

#[derive(Args, Clone)]
pub struct ProjectorArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Address of the projector's /metrics, /livez and /readyz.
    #[arg(
        long,
        env = "HINDSIGHT_METRICS_LISTEN",
        default_value = "127.0.0.1:9464"
    )]
    pub metrics_listen: SocketAddr,
    #[command(flatten)]
    pub projector: ProjectorOpts,
}

#[derive(Args, Clone)]
pub struct ApiArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(flatten)]
    pub plans: PlanArgs,
    #[arg(long, env = "HINDSIGHT_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of /metrics, /livez and /readyz (default: the listen address).
    #[arg(long, env = "HINDSIGHT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
}

#[derive(Args, Clone)]
pub struct BackfillArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// NDJSON files; gzip is detected by content.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// No progress line (for logs and CI).
    #[arg(long, env = "HINDSIGHT_NO_PROGRESS")]
    pub no_progress: bool,
}

#[derive(Args, Clone)]
pub struct RebuildArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub scylla: ScyllaArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub projector: ProjectorOpts,
}

#[derive(Args, Clone)]
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
    #[arg(long, env = "HINDSIGHT_DEMO_SEED", default_value_t = 2025)]
    pub demo_seed: u64,
    /// Hours of history sent first.
    #[arg(long, env = "HINDSIGHT_DEMO_HISTORY_HOURS", default_value_t = 48)]
    pub demo_history_hours: u32,
    /// Keep sending a round of live ticks every second afterwards.
    #[arg(long)]
    pub live: bool,
}

#[derive(Args, Clone)]
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

#[derive(Subcommand, Clone)]
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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Dev(args) => services::dev(args).await,
            Command::Ingest(args) => services::ingest(args).await,
            Command::Projector(args) => services::projector(args).await,
            Command::Api(args) => services::api(args).await,
            Command::Backfill(args) => services::backfill(args).await,
            Command::Rebuild(args) => services::rebuild(args).await,
            Command::Keys(args) => services::keys(args).await,
            Command::Feed(args) => services::feed(args).await,
            Command::Kafka(args) => services::kafka(args).await,
            Command::Scylla(args) => services::scylla(args).await,
            Command::Openapi => {
                print!("{}", hindsight_api::openapi::to_pretty_json());
                Ok(())
            }
        }
    })
}
