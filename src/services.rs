//! Wiring: which backends and services each subcommand runs.

use crate::*;
use anyhow::{anyhow, bail, Context};
use axum::Router;
use hindsight::app::{api_router, ops_router, Embedded, Readiness};
use hindsight_api::{keys, plans::Plans};
use hindsight_contracts::ConsumerSource;
use hindsight_contracts::Store;
use hindsight_contracts::{AppendBatch, EventLog, Idempotency};
use hindsight_ingest::backfill::{backfill_file, Progress};
use hindsight_ingest::demo::Demo;
use hindsight_ingest::http::IngestState;
use hindsight_kafka::{KafkaLog, KafkaSource};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::{Event, Timestamp};
use hindsight_scylla::ScyllaStore;
use hindsight_sqlite::EmbeddedSource;
use hindsight_sqlite::{IdempotencyFile, SqliteLog, SqliteStore};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Only one projector may write an embedded read store: a second one would
/// fold the same events into the same rows.
fn lock_projector(dir: &Path) -> anyhow::Result<File> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("projector.lock");
    let file = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    file.try_lock().map_err(|_| {
        anyhow!(
            "another projector holds {} (is `hindsight dev`, `projector` or `rebuild` running on this data dir?)",
            path.display()
        )
    })?;
    Ok(file)
}

async fn serve(
    listen: SocketAddr,
    router: Router,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let mut shutdown = shutdown;
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await?;
    Ok(())
}

/// Serves a service, with `/metrics`, `/livez` and `/readyz` on their own
/// address when one is given, else beside the service's routes.
async fn serve_with_ops(
    listen: SocketAddr,
    router: Router,
    metrics: Option<SocketAddr>,
    ops: Router,
) -> anyhow::Result<()> {
    let shutdown = shutdown_signal();
    match metrics {
        None => serve(listen, router.merge(ops), shutdown).await,
        Some(metrics) => {
            tokio::try_join!(
                serve(listen, router, shutdown.clone()),
                serve(metrics, ops, shutdown)
            )?;
            Ok(())
        }
    }
}

/// Turns true on Ctrl-C or SIGTERM.
fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        let _ = tx.send(true);
    });
    rx
}

fn load_plans(args: &PlanArgs) -> anyhow::Result<Plans> {
    Plans::load(args.plans_file.as_deref()).map_err(|e| anyhow!("plans file: {e}"))
}

fn projector_config(opts: &ProjectorOpts) -> ProjectorConfig {
    ProjectorConfig {
        batch_max: opts.projector_batch_max.max(1),
        ..Default::default()
    }
}

pub async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let handle = hindsight_telemetry::install();
    let dir = &args.data.data_dir;
    let _lock = lock_projector(dir)?;
    let app = Embedded::open(dir)?;
    let (log, store) = (app.log.clone(), app.store.clone());
    let shutdown = shutdown_signal();

    let ingest_token = args
        .ingest
        .ingest_token
        .clone()
        .unwrap_or_else(|| format!("hsi_{}", keys::random_hex(16)));
    let api_key = args
        .demo_api_key
        .clone()
        .unwrap_or_else(|| format!("{}{}", keys::KEY_PREFIX, keys::random_hex(32)));
    let plans = load_plans(&args.plans)?;
    if plans.get(&args.demo_plan).is_none() {
        bail!("unknown plan {:?} for the demo key", args.demo_plan);
    }
    use hindsight_contracts::AuthStore;
    store
        .put_key(keys::record_for(&api_key, "dev", &args.demo_plan))
        .await?;

    let projector = app.projector(projector_config(&args.projector));
    let projector_task = tokio::spawn(projector.run(shutdown.clone()));

    let demo = if args.no_demo {
        None
    } else {
        Some(tokio::spawn(run_demo(
            log.clone(),
            args.demo_seed,
            args.demo_history_hours,
            shutdown.clone(),
        )))
    };

    let router = app
        .api_router(plans)
        .await?
        .merge(app.ingest_router(&ingest_token, args.ingest.ingest_max_body_bytes))
        .merge(ops_router(
            handle,
            Readiness {
                log: Some(log.clone()),
                store: Some(store.clone()),
            },
        ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    print_welcome(addr, dir, &api_key, &ingest_token, !args.no_demo);
    let mut stop = shutdown.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await?;
    if let Some(demo) = demo {
        let _ = demo.await;
    }
    let _ = projector_task.await;
    Ok(())
}

fn print_welcome(addr: SocketAddr, dir: &Path, api_key: &str, ingest_token: &str, demo: bool) {
    let base = format!("http://{addr}");
    let now = Timestamp::now().millis() / 1000;
    println!(
        "Hindsight is running on the embedded backends (data in {})",
        dir.display()
    );
    println!("  API       {base}/v1            header  X-API-Key: {api_key}");
    println!("  Ingest    {base}/ingest/v1/events   header  Authorization: Bearer {ingest_token}");
    println!("  Metrics   {base}/metrics");
    if demo {
        println!("Demo markets are being generated (48 h of history, then live ticks). Try:");
        println!(
            "  curl -s -H 'X-API-Key: {api_key}' '{base}/v1/tokens/tok-fed-cuts-25bps-december-2026-yes/prices?start_ts={}&end_ts={}&resolution=1h'",
            now - 6 * 3600,
            now + 60
        );
    }
    println!("Stop with Ctrl-C.");
}

/// Appends the demo catalog and history once (first start of a data dir),
/// then a round of live ticks every second.
async fn run_demo(
    log: Arc<SqliteLog>,
    seed: u64,
    history_hours: u32,
    mut shutdown: watch::Receiver<bool>,
) {
    let now = Timestamp::now();
    let hour = 3_600_000;
    let start = Timestamp((now.0 / hour - history_hours as i64) * hour);
    let mut demo = Demo::new(seed, start);
    let fresh = matches!(log.head().await, Ok(0));
    let append = |events: Vec<Event>, key: Option<String>| {
        let log = log.clone();
        async move {
            let batch = AppendBatch {
                events,
                idempotency: key.map(|key| Idempotency {
                    key,
                    response: Vec::new(),
                }),
            };
            if let Err(e) = log.append(batch).await {
                tracing::error!(error = %e, "demo feed could not append");
            }
        }
    };
    if fresh {
        append(
            demo.catalog().to_vec(),
            Some(format!("demo-catalog-{seed}")),
        )
        .await;
        let mut events = Vec::new();
        let mut t = start;
        while t < now {
            demo.round(t, 5, &mut events);
            t = Timestamp(t.0 + 60_000);
            if events.len() >= 20_000 {
                append(std::mem::take(&mut events), None).await;
            }
        }
        append(events, None).await;
    }
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let mut events = Vec::new();
        demo.round(Timestamp::now(), 5, &mut events);
        append(events, None).await;
    }
}

pub async fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let handle = hindsight_telemetry::install();
    let token = args
        .ingest
        .ingest_token
        .clone()
        .context("HINDSIGHT_INGEST_TOKEN (or --ingest-token) is required")?;
    let (log, kafka) = event_log(&args.data, &args.kafka)?;
    let ops = ops_router(
        handle,
        Readiness {
            log: Some(log.clone()),
            store: None,
        },
    );
    let router = hindsight_ingest::http::router(IngestState {
        log,
        token: token.into(),
        max_body_bytes: args.ingest.ingest_max_body_bytes,
    });
    serve_with_ops(args.listen, router, args.metrics_listen, ops).await?;
    if let Some(kafka) = kafka {
        kafka.flush(Duration::from_secs(10));
    }
    Ok(())
}

/// The log as services append to it, and the Kafka producer to flush at exit.
type LogHandles = (Arc<dyn EventLog>, Option<Arc<KafkaLog>>);

/// The event log: Kafka when brokers are configured, else the embedded log.
fn event_log(data: &DataArgs, kafka: &KafkaArgs) -> anyhow::Result<LogHandles> {
    match kafka.config() {
        Some(config) => {
            hindsight_kafka::topics::verify(&config, Duration::from_secs(10))?;
            let idempotency = IdempotencyFile::open(&data.data_dir)?;
            let log = Arc::new(KafkaLog::new(
                config,
                Some(Arc::new(idempotency)),
                Duration::from_millis(kafka.kafka_delivery_timeout_ms),
            )?);
            Ok((log.clone(), Some(log)))
        }
        None => Ok((Arc::new(SqliteLog::open(&data.data_dir)?), None)),
    }
}

/// The read store: ScyllaDB when nodes are configured, else the embedded
/// store in the data directory.
async fn read_store(data: &DataArgs, scylla: &ScyllaArgs) -> anyhow::Result<Arc<dyn Store>> {
    match scylla.config()? {
        Some(config) => Ok(Arc::new(ScyllaStore::connect(config).await?)),
        None => Ok(Arc::new(SqliteStore::open(&data.data_dir)?)),
    }
}

pub async fn scylla(args: ScyllaCommand) -> anyhow::Result<()> {
    let config = args
        .scylla
        .config()?
        .context("HINDSIGHT_SCYLLA_NODES (or --scylla-nodes) is required")?;
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

/// Where a projector reads: the Kafka group, or the embedded log (then
/// holding the data directory's projector lock).
fn consumer_source(
    data: &DataArgs,
    kafka: &KafkaArgs,
    store: &Arc<dyn Store>,
) -> anyhow::Result<(Arc<dyn ConsumerSource>, Option<File>)> {
    match kafka.config() {
        Some(config) => {
            hindsight_kafka::topics::verify(&config, Duration::from_secs(10))?;
            Ok((
                Arc::new(KafkaSource {
                    config,
                    store: Some(store.clone()),
                }),
                None,
            ))
        }
        None => {
            let lock = lock_projector(&data.data_dir)?;
            let log = Arc::new(SqliteLog::open(&data.data_dir)?);
            Ok((
                Arc::new(EmbeddedSource {
                    log,
                    store: store.clone(),
                }),
                Some(lock),
            ))
        }
    }
}

pub async fn kafka(args: KafkaCommand) -> anyhow::Result<()> {
    let config = args
        .kafka
        .config()
        .context("HINDSIGHT_KAFKA_BROKERS (or --kafka-brokers) is required")?;
    match args.action {
        KafkaAction::Init => {
            for line in hindsight_kafka::topics::init(&config).await? {
                println!("{line}");
            }
        }
    }
    Ok(())
}

pub async fn projector(args: ProjectorArgs) -> anyhow::Result<()> {
    let handle = hindsight_telemetry::install();
    let store = read_store(&args.data, &args.scylla).await?;
    let (source, _lock) = consumer_source(&args.data, &args.kafka, &store)?;
    let shutdown = shutdown_signal();
    let projector = Projector::new(source, store.clone(), projector_config(&args.projector));
    let task = tokio::spawn(projector.run(shutdown.clone()));
    let ops = ops_router(
        handle,
        Readiness {
            log: None,
            store: Some(store.clone()),
        },
    );
    serve(args.metrics_listen, ops, shutdown).await?;
    task.await?;
    Ok(())
}

pub async fn api(args: ApiArgs) -> anyhow::Result<()> {
    let handle = hindsight_telemetry::install();
    let plans = load_plans(&args.plans)?;
    let store = read_store(&args.data, &args.scylla).await?;
    let ops = ops_router(
        handle,
        Readiness {
            log: None,
            store: Some(store.clone()),
        },
    );
    let router = api_router(store, plans).await?;
    serve_with_ops(args.listen, router, args.metrics_listen, ops).await
}

pub async fn backfill(args: BackfillArgs) -> anyhow::Result<()> {
    let (log, _) = event_log(&args.data, &args.kafka)?;
    let mut progress = Progress::new(!args.no_progress);
    let (mut lines, mut accepted, mut skipped, mut rejected) = (0, 0, 0, 0);
    for file in &args.files {
        let report = backfill_file(log.as_ref(), file, &mut progress)
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
    let secs = progress.elapsed().as_secs_f64();
    println!(
        "backfill: {} files, {lines} lines, {accepted} appended, {skipped} skipped as already appended, {rejected} rejected, {secs:.1} s ({:.0} events/s)",
        args.files.len(),
        (accepted + skipped) as f64 / secs.max(1e-9)
    );
    if rejected > 0 {
        std::process::exit(2);
    }
    Ok(())
}

pub async fn rebuild(args: RebuildArgs) -> anyhow::Result<()> {
    let store = read_store(&args.data, &args.scylla).await?;
    // A fresh consumer group reads Kafka from the beginning; the embedded
    // log is read from offset 0 once the store is reset.
    let mut kafka = args.kafka.clone();
    kafka.kafka_group = format!(
        "{}-rebuild-{}",
        kafka.kafka_group,
        Timestamp::now().millis()
    );
    let (source, _lock) = consumer_source(&args.data, &kafka, &store)?;
    let started = std::time::Instant::now();
    store.reset().await?;
    let mut projector = Projector::new(source, store, projector_config(&args.projector));
    let events = projector.catch_up().await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "rebuild: replayed {events} events in {secs:.1} s ({:.0} events/s)",
        events as f64 / secs.max(1e-9)
    );
    Ok(())
}

pub async fn keys(args: KeysArgs) -> anyhow::Result<()> {
    let store = read_store(&args.data, &args.scylla).await?;
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

/// Posts one NDJSON batch, retrying 503s (honouring `Retry-After`) and
/// transport errors under one idempotency key, so a retry never duplicates.
async fn post_batch(
    client: &reqwest::Client,
    args: &FeedArgs,
    key: &str,
    body: String,
) -> anyhow::Result<()> {
    let url = format!("{}/ingest/v1/events", args.ingest_url.trim_end_matches('/'));
    let mut delay = Duration::from_millis(500);
    for _ in 0..20 {
        let sent = client
            .post(&url)
            .bearer_auth(&args.ingest_token)
            .header("Idempotency-Key", key)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                let wait = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1);
                tokio::time::sleep(Duration::from_secs(wait).max(delay)).await;
            }
            Ok(r) => bail!(
                "ingest answered {}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            Err(e) => {
                tracing::warn!(error = %e, "ingest unreachable; retrying");
                tokio::time::sleep(delay).await;
            }
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
    bail!("ingest kept refusing batch {key}")
}

pub async fn feed(args: FeedArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let now = Timestamp::now();
    let hour = 3_600_000;
    let start = Timestamp((now.0 / hour - args.demo_history_hours as i64) * hour);
    let mut demo = Demo::new(args.demo_seed, start);
    let lines = |events: &[Event]| {
        events
            .iter()
            .map(hindsight_schemas::wire::to_line)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let prefix = format!("feed-{}-{}", args.demo_seed, start.0);
    post_batch(
        &client,
        &args,
        &format!("{prefix}-catalog"),
        lines(demo.catalog()),
    )
    .await?;
    let (mut t, mut n, mut sent) = (start, 0, 0usize);
    let mut events = Vec::new();
    while t < now {
        demo.round(t, 5, &mut events);
        t = Timestamp(t.0 + 60_000);
        if events.len() >= 5_000 || t >= now {
            post_batch(&client, &args, &format!("{prefix}-{n}"), lines(&events)).await?;
            sent += events.len();
            n += 1;
            events.clear();
        }
    }
    println!(
        "feed: sent {sent} events of {} hours of history to {}",
        args.demo_history_hours, args.ingest_url
    );
    if !args.live {
        return Ok(());
    }
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut shutdown = shutdown_signal();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
        }
        let at = Timestamp::now();
        demo.round(at, 5, &mut events);
        post_batch(
            &client,
            &args,
            &format!("{prefix}-live-{}", at.0),
            lines(&events),
        )
        .await?;
        events.clear();
    }
}
