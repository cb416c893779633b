//! What each subcommand does: configuration → backends → service, run until
//! a signal; or a one-shot operator command.

use crate::backends::{BackendConfig, Backends, ProjectorLocked};
use crate::config::*;
use crate::demo::{DemoConfig, DemoFeed, HttpSink, Sink};
use crate::services::api::ApiConfig;
use crate::services::dev::DevConfig;
use crate::services::ingest::IngestConfig;
use crate::services::{self, bind, Listeners};
use crate::shutdown;
use anyhow::{anyhow, bail, Context};
use hindsight_api::dashboard::{accounts as dashboard_accounts, DashboardConfig};
use hindsight_api::{keys, plans::Plans};
use hindsight_ingest::backfill::{backfill_file, Progress, Target};
use hindsight_ingest::catalog::{BatchClaims, CatalogView};
use hindsight_ingest::http::DEFAULT_CATALOG_MAX_AGE;
use hindsight_projector::Projector;
use hindsight_schemas::time::SystemClock;
use hindsight_schemas::Timestamp;
use hindsight_scylla::ScyllaStore;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Dev(args) => dev(args).await,
        Command::Ingest(args) => ingest(args).await,
        Command::Projector(args) => projector(args).await,
        Command::Api(args) => api(args).await,
        Command::Backfill(args) => backfill(args).await,
        Command::Rebuild(args) => rebuild(args).await,
        Command::Keys(args) => keys(args).await,
        Command::Accounts(args) => accounts(args).await,
        Command::Feed(args) => feed(args).await,
        Command::Kafka(args) => kafka(args).await,
        Command::Scylla(args) => scylla(args).await,
        Command::Openapi => {
            print!("{}", hindsight_api::openapi::to_pretty_json());
            Ok(())
        }
    }
}

fn load_plans(args: &PlanArgs) -> anyhow::Result<Plans> {
    Plans::load(args.plans_file.as_deref()).map_err(|e| anyhow!("plans file: {e}"))
}

fn api_config(
    plans: &PlanArgs,
    cursor: &CursorArgs,
    (exports, page_cache): (&ExportJobArgs, &PageCacheArgs),
    backends: &BackendConfig,
    dashboard: DashboardConfig,
) -> anyhow::Result<ApiConfig> {
    Ok(ApiConfig {
        page_cache_bytes: page_cache.page_cache_mb << 20,
        plans: Arc::new(load_plans(plans)?),
        clock: Arc::new(SystemClock),
        cursors: services::api::cursor_keys(&cursor.cursor_secret, backends)?,
        dashboard,
        export_jobs: exports.config(),
    })
}

async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let ingest_token = args
        .ingest
        .ingest_token
        .clone()
        .unwrap_or_else(|| format!("hsi_{}", keys::random_hex(16)));
    let api_key = args
        .demo_api_key
        .clone()
        .unwrap_or_else(|| format!("{}{}", keys::KEY_PREFIX, keys::random_hex(32)));
    let api = api_config(
        &args.plans,
        &args.cursor,
        (&args.exports, &args.page_cache),
        &args.backends(),
        args.public.dashboard(args.listen),
    )?;
    if api.plans.get(&args.demo_plan).is_none() {
        bail!("unknown plan {:?} for the demo key", args.demo_plan);
    }
    let cfg = DevConfig {
        ingest: IngestConfig {
            token: ingest_token.clone(),
            max_body_bytes: args.ingest.ingest_max_body_bytes,
            limits: args.ingest.limits(),
        },
        api,
        projector: args.projector.config(),
        demo: (!args.no_demo).then_some(DemoConfig {
            seed: args.demo.demo_seed,
            history_hours: args.demo.demo_history_hours,
        }),
    };
    let backends = Backends::connect(&args.backends()).await?;
    backends
        .store()?
        .put_key(keys::record_for(&api_key, "dev", &args.demo_plan))
        .await?;
    let listeners = Listeners::bind(args.listen, args.metrics_listen).await?;
    let service = services::dev::build(&cfg, &backends, listeners)
        .await?
        .with_http_limits(args.http.limits());
    let public = args.public.url(service.local_addr());
    let link = demo_sign_in_link(backends.store()?.as_ref(), &public, &args.demo_plan).await?;
    print_welcome(
        service.local_addr(),
        service.ops_addr(),
        &args.data.data_dir,
        &api_key,
        &ingest_token,
        cfg.demo.as_ref(),
    );
    println!("  Dashboard {public}/dashboard   demo sign-in link (works once): {link}");
    println!("Stop with Ctrl-C.");
    service.run_until_stopped(shutdown::signal()).await?;
    backends.close().await;
    Ok(())
}

/// The demo organization's owner gets a new sign-in link at every start.
const DEMO_ORG: &str = "demo";
const DEMO_OWNER: &str = "demo@hindsight.local";

async fn demo_sign_in_link(
    store: &dyn hindsight_contracts::AccountStore,
    url: &str,
    plan: &str,
) -> anyhow::Result<String> {
    let now = Timestamp::now();
    let token = if store.organization(DEMO_ORG).await?.is_some() {
        dashboard_accounts::invite(store, DEMO_ORG, DEMO_OWNER, "owner", now).await?
    } else {
        dashboard_accounts::create_organization(store, DEMO_ORG, plan, DEMO_OWNER, now).await?
    };
    Ok(dashboard_accounts::sign_in_link(url, &token))
}

fn print_welcome(
    addr: SocketAddr,
    ops: SocketAddr,
    dir: &Path,
    api_key: &str,
    ingest_token: &str,
    demo: Option<&DemoConfig>,
) {
    let base = format!("http://{addr}");
    let now = Timestamp::now().millis() / 1000;
    println!(
        "Hindsight is running on the embedded backends (data in {})",
        dir.display()
    );
    println!("  API       {base}/v1            header  X-API-Key: {api_key}");
    println!("  Ingest    {base}/ingest/v1/events   header  Authorization: Bearer {ingest_token}");
    println!("  Metrics   http://{ops}/metrics");
    if let Some(demo) = demo {
        println!(
            "Demo markets are being generated ({} h of history, then live ticks). Try:",
            demo.history_hours
        );
        // The token the OpenAPI document's examples name, a demo market's.
        let token = hindsight_api::openapi::example("token_id").unwrap_or_default();
        println!(
            "  curl -s -H 'X-API-Key: {api_key}' '{base}/v1/tokens/{token}/prices?start_ts={}&end_ts={}&resolution=1h'",
            now - 6 * 3600,
            now + 60
        );
    }
}

async fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let cfg = IngestConfig {
        token: args
            .ingest
            .ingest_token
            .clone()
            .context("HINDSIGHT_INGEST_TOKEN (or --ingest-token) is required")?,
        max_body_bytes: args.ingest.ingest_max_body_bytes,
        limits: args.ingest.limits(),
    };
    let backends = Backends::connect(&args.backends()?).await?;
    let listeners = Listeners::bind(args.listen, args.metrics_listen).await?;
    let service =
        services::ingest::build(&cfg, &backends, listeners)?.with_http_limits(args.http.limits());
    service.run_until_stopped(shutdown::signal()).await?;
    backends.close().await;
    Ok(())
}

async fn projector(args: ProjectorArgs) -> anyhow::Result<()> {
    let backends = Backends::connect(&args.backends()?).await?;
    let service = services::projector::build(
        &args.projector.config(),
        &backends,
        bind(args.metrics_listen).await?,
    )?
    .with_http_limits(args.http.limits());
    service.run_until_stopped(shutdown::signal()).await
}

async fn api(args: ApiArgs) -> anyhow::Result<()> {
    let backend_config = args.backends()?;
    let cfg = api_config(
        &args.plans,
        &args.cursor,
        (&args.exports, &args.page_cache),
        &backend_config,
        args.public.dashboard(args.listen),
    )?;
    let backends = Backends::connect(&backend_config).await?;
    let listeners = Listeners::bind(args.listen, args.metrics_listen).await?;
    let service = services::api::build(&cfg, &backends, listeners)
        .await?
        .with_http_limits(args.http.limits());
    service.run_until_stopped(shutdown::signal()).await
}

async fn backfill(args: BackfillArgs) -> anyhow::Result<()> {
    let (backends, projecting) = backfill_backends(&args).await?;
    let log = backends.log()?;
    let catalog = Arc::new(CatalogView::new(backends.store()?, DEFAULT_CATALOG_MAX_AGE));
    let target = Target {
        log: log.as_ref(),
        catalog: &catalog,
        limits: args.wire.limits(),
    };
    // One run's claims across its files: a file's ticks may follow another
    // file's markets.
    let mut claims = BatchClaims::default();
    let mut progress = Progress::new(!args.no_progress);
    let (mut lines, mut accepted, mut skipped, mut rejected) = (0, 0, 0, 0);
    for file in &args.files {
        let report = backfill_file(&target, &mut claims, file, &mut progress)
            .await
            .map_err(|e| anyhow!(e))?;
        println!(
            "{}: {} lines, {} appended, {} already appended earlier, {} rejected{}",
            file.display(),
            report.lines,
            report.accepted,
            report.already_appended,
            report.rejected,
            report
                .rejects_file
                .map(|p| format!(" (see {})", p.display()))
                .unwrap_or_default()
        );
        lines += report.lines;
        accepted += report.accepted;
        skipped += report.already_appended;
        rejected += report.rejected;
    }
    let appended_in = progress.elapsed().as_secs_f64();
    let projected = match projecting {
        Some(projecting) => Some(projecting.finish().await.context(
            "projecting the backfill failed; what was appended stays in the log, and the next \
             projector (`hindsight dev`, `projector`) resumes from the store's position",
        )?),
        None => None,
    };
    backends.close().await;
    let secs = progress.elapsed().as_secs_f64();
    println!(
        "backfill: {} files, {lines} lines, {accepted} appended, {skipped} skipped as already appended, {rejected} rejected, {appended_in:.1} s ({:.0} events/s)",
        args.files.len(),
        (accepted + skipped) as f64 / appended_in.max(1e-9)
    );
    if let Some(events) = projected {
        println!(
            "backfill: {events} events projected into the read tables; all queryable after {secs:.1} s"
        );
    }
    if rejected > 0 {
        std::process::exit(2);
    }
    Ok(())
}

/// The backends of a backfill and, with `--project`, a projector rolling in
/// what it appends: the parse and the projector's fold and writes then
/// share the machine's cores, and the files are queryable when the command
/// returns. When another process holds the data directory's projector (a
/// running `hindsight dev`), that one rolls them in.
async fn backfill_backends(args: &BackfillArgs) -> anyhow::Result<(Backends, Option<Projecting>)> {
    let mut config = args.backends()?;
    if !args.project {
        return Ok((Backends::connect(&config).await?, None));
    }
    if config.kafka.is_some() {
        bail!("--project rolls the embedded log in; with Kafka, the projector services do");
    }
    config.uses.consume = true;
    let backends = match Backends::connect(&config).await {
        Err(e) if e.downcast_ref::<ProjectorLocked>().is_some() => {
            eprintln!("{e}: appending only, and that projector rolls the files in");
            config.uses.consume = false;
            return Ok((Backends::connect(&config).await?, None));
        }
        other => other?,
    };
    let config = hindsight_projector::ProjectorConfig {
        idle_wait: BACKFILL_IDLE_WAIT,
        ..args.projector.rebuild_config()
    };
    if let Some(log) = backends.embedded_log() {
        // Two of the projector's steps: one it folds, one it takes next.
        log.lead_consumer(2 * config.batch_max.max(config.backlog_batch_max));
    }
    let projector = Projector::new(backends.source()?, backends.store()?, config);
    Ok((backends, Some(Projecting::start(projector))))
}

/// How long the backfill's projector, caught up with the appends, waits
/// for more before asking again whether they are over. Each append in this
/// process wakes it at once (the embedded log's head), so the wait only
/// ends the last poll, after the last append: at the default 100 ms that
/// poll cost a dense `shapes` file's `backfill --project` ~0.1 s (medians
/// of four alternated runs, 1.13 s against 1.03), and an empty file's
/// nearly all of its 0.22 s.
const BACKFILL_IDLE_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// A projector catching up with a log still being appended to, until told
/// the appends are over ([`Projecting::finish`]).
struct Projecting {
    appended: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<hindsight_contracts::Result<u64>>,
}

impl Projecting {
    fn start(mut projector: Projector) -> Self {
        let (appended, done) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut events = 0;
            loop {
                // Read before catching up: when it says the appends are
                // over, this catch-up covers every one of them.
                let last = *done.borrow();
                events += projector.catch_up().await?;
                if last {
                    return Ok(events);
                }
            }
        });
        Projecting { appended, task }
    }

    /// Waits until every event appended is in the read tables; returns how
    /// many events were projected.
    async fn finish(self) -> anyhow::Result<u64> {
        let _ = self.appended.send(true);
        Ok(self.task.await??)
    }
}

async fn rebuild(args: RebuildArgs) -> anyhow::Result<()> {
    let backends = Backends::connect(&args.backends(Timestamp::now().millis())?).await?;
    let store = backends.store()?;
    let started = std::time::Instant::now();
    let mut projector = Projector::new(backends.source()?, store, args.projector.rebuild_config());
    projector.reset_store().await?;
    let events = projector.catch_up().await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "rebuild: replayed {events} events in {secs:.1} s ({:.0} events/s)",
        events as f64 / secs.max(1e-9)
    );
    Ok(())
}

async fn keys(args: KeysArgs) -> anyhow::Result<()> {
    let backends = Backends::connect(&args.backends()?).await?;
    let store = backends.store()?;
    let plans = load_plans(&args.plans)?;
    let find = |all: Vec<hindsight_contracts::ApiKeyRecord>, id: &str| {
        all.into_iter()
            .find(|k| k.key_id == id)
            .ok_or_else(|| anyhow!("no key with id {id}"))
    };
    match args.action {
        KeysAction::Create { org, plan } => {
            if plans.get(&plan).is_none() {
                bail!("unknown plan {plan:?}");
            }
            let (plaintext, record) = keys::generate(&org, &plan);
            store.put_key(record.clone()).await?;
            println!("{plaintext}");
            eprintln!(
                "created {} for {org} on plan {plan}; the key is shown only once",
                record.key_id
            );
        }
        KeysAction::List => {
            for k in store.list_keys().await? {
                let state = k
                    .revoked_at
                    .map_or("active".to_string(), |t| format!("revoked {t}"));
                println!(
                    "{}\t{}\t{}\t{}\t{state}",
                    k.key_id, k.organization, k.plan, k.created_at
                );
            }
        }
        KeysAction::Revoke { key_id } => {
            let mut k = find(store.list_keys().await?, &key_id)?;
            k.revoked_at = Some(Timestamp::now());
            store.put_key(k).await?;
            println!("revoked {key_id}");
        }
        KeysAction::SetPlan { key_id, plan } => {
            if plans.get(&plan).is_none() {
                bail!("unknown plan {plan:?}");
            }
            let mut k = find(store.list_keys().await?, &key_id)?;
            k.plan = plan.clone();
            store.put_key(k).await?;
            println!("{key_id} is now on plan {plan}");
        }
    }
    Ok(())
}

async fn accounts(args: AccountsArgs) -> anyhow::Result<()> {
    let backends = Backends::connect(&args.backends()?).await?;
    let store = backends.store()?;
    let url = args.public.url(args.listen);
    let now = Timestamp::now();
    let token = match args.action {
        AccountsAction::Create { org, email, plan } => {
            if load_plans(&args.plans)?.get(&plan).is_none() {
                bail!("unknown plan {plan:?}");
            }
            let token =
                dashboard_accounts::create_organization(store.as_ref(), &org, &plan, &email, now)
                    .await?;
            eprintln!("created organization {org} (plan {plan}) with owner {email}");
            token
        }
        AccountsAction::Link { email } => {
            let email = dashboard_accounts::normalize_email(&email)?;
            let Some(user) = store.user(&email).await? else {
                bail!("no user {email}");
            };
            dashboard_accounts::invite(store.as_ref(), &user.organization, &email, &user.role, now)
                .await?
        }
    };
    println!("{}", dashboard_accounts::sign_in_link(&url, &token));
    eprintln!("the link works once, for 24 hours");
    Ok(())
}

async fn feed(args: FeedArgs) -> anyhow::Result<()> {
    let cfg = DemoConfig {
        seed: args.demo.demo_seed,
        history_hours: args.demo.demo_history_hours,
    };
    let sink = Sink::Http(HttpSink::new(&args.ingest_url, &args.ingest_token));
    let now = Timestamp::now();
    let mut feed = DemoFeed::new(&cfg, now);
    let sent = feed.history(&sink, now).await?;
    println!(
        "feed: sent {sent} events of {} hours of history to {}",
        cfg.history_hours, args.ingest_url
    );
    if args.live {
        feed.live(&sink, shutdown::watch()).await?;
    }
    Ok(())
}

async fn kafka(args: KafkaCommand) -> anyhow::Result<()> {
    let config = args.config()?;
    match args.action {
        KafkaAction::Init => {
            for line in hindsight_kafka::topics::init(&config).await? {
                println!("{line}");
            }
        }
    }
    Ok(())
}

async fn scylla(args: ScyllaCommand) -> anyhow::Result<()> {
    let config = args.config()?;
    let version = hindsight_scylla::schema::SCHEMA_VERSION;
    match args.action {
        ScyllaAction::Migrate => {
            let ran = ScyllaStore::migrate(&config).await?;
            if ran.is_empty() {
                println!(
                    "keyspace {} is at schema version {version}: nothing to do",
                    config.keyspace
                );
            } else {
                println!(
                    "applied {} statements; keyspace {} is at schema version {version}",
                    ran.len(),
                    config.keyspace
                );
            }
        }
    }
    Ok(())
}
