//! The distributed deployment on the real engines (Apache Kafka and Apache
//! Cassandra from `scripts/engines.sh`), each figure next to its anchor in
//! the same run:
//!
//! 1. **Ingest**: HTTP ingest → Kafka (validate, encode, produce, wait for
//!    every confirmation) next to a raw rdkafka producer sending the same
//!    records, pre-encoded, with the same producer settings.
//! 2. **Projection**: Kafka → Cassandra events/s for a fresh projector, on a
//!    long-tail shape (20 000 tokens, most trading less than once a minute:
//!    nearly every tick opens new bucket rows) and a dense one (50 tokens,
//!    a tick every 2 s each: nearly every tick lands in a row in memory).
//! 3. **Pages**: a 200-point history page served by `hindsight api` over
//!    Cassandra next to the same page served over the embedded store, the
//!    same data projected into both.
//!
//! Needs `HINDSIGHT_KAFKA_BROKERS`, `HINDSIGHT_SCYLLA_NODES`
//! (`eval "$(scripts/engines.sh start)"`) and the release binary
//! (`cargo build --release`).

use crate::api::{load, project_with_key, KEY};
use crate::process::{release_binary, Server};
use crate::shape::{dense, long_tail, Shape, DAY};
use hindsight::app::Embedded;
use hindsight_api::keys;
use hindsight_contracts::{AppendBatch, AuthStore, ConsumerSource, EventLog};
use hindsight_kafka::{KafkaConfig, KafkaLog, KafkaSource};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::codec;
use hindsight_scylla::{ScyllaConfig, ScyllaStore};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-ingest-token";

fn required(var: &str) -> anyhow::Result<String> {
    std::env::var(var).map_err(|_| {
        anyhow::anyhow!(
            "{var} is not set: start Apache Kafka and Cassandra with `eval \"$(scripts/engines.sh start)\"`"
        )
    })
}

pub fn run(quick: bool) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run_async(quick))
}

async fn run_async(quick: bool) -> anyhow::Result<()> {
    let brokers = required("HINDSIGHT_KAFKA_BROKERS")?;
    let nodes = required("HINDSIGHT_SCYLLA_NODES")?;
    // The API section needs it: fail before the long sections, not after.
    release_binary()?;
    let run = format!("bench_{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("hindsight-bench-engines-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let kafka = |name: &str| KafkaConfig {
        brokers: brokers.clone(),
        topic_prefix: format!("{run}_{name}"),
        partitions: 6,
        replication: 1,
        group: format!("{run}_{name}-projector"),
        instance_id: None,
        max_in_flight: 200_000,
    };
    let cql = |name: &str| ScyllaConfig {
        nodes: nodes.split(',').map(String::from).collect(),
        keyspace: format!("{run}_{name}"),
        replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
        consistency: hindsight_scylla::store::parse_consistency("ONE").unwrap(),
        request_timeout: Duration::from_secs(30),
        write_concurrency: 64,
    };
    let (tail_ticks, every) = if quick { (100_000, 8) } else { (400_000, 2) };
    let shapes = [
        long_tail("lt", 10_000, tail_ticks),
        dense("dn", 25, every, 4),
    ];

    println!(
        "== Engines (Apache Kafka at {brokers}, 6 partitions; Apache Cassandra at {nodes}, one node, consistency ONE)"
    );
    ingest_vs_raw(&kafka("raw"), &kafka("ingest"), &cql("ingest"), &shapes[0]).await?;
    println!("   projector, Kafka -> Cassandra, fresh group, timed from its first batch:");
    for (i, shape) in shapes.iter().enumerate() {
        let name = format!("proj{i}");
        let store = project(&kafka(&name), &cql(&name), shape).await?;
        if i == 1 {
            store
                .put_key(keys::record_for(KEY, "bench", "enterprise"))
                .await?;
        }
    }
    pages(&dir, &cql("proj1"), &shapes[1], quick).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Raw rdkafka producer vs HTTP ingest on the same records.
async fn ingest_vs_raw(
    raw: &KafkaConfig,
    cfg: &KafkaConfig,
    catalog: &ScyllaConfig,
    shape: &Shape,
) -> anyhow::Result<()> {
    hindsight_kafka::topics::init(raw).await?;
    hindsight_kafka::topics::init(cfg).await?;
    let records: Vec<(String, Vec<u8>)> = shape
        .events()
        .iter()
        .map(|e| (e.key().to_string(), codec::encode(e)))
        .collect();
    let producer: FutureProducer = raw
        .client()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "lz4")
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let topic = raw.topic(0);
    let started = Instant::now();
    let mut pending = Vec::with_capacity(records.len());
    for (key, payload) in &records {
        let record = FutureRecord::to(&topic).key(key).payload(payload);
        pending.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| anyhow::anyhow!("{e}"))?,
        );
    }
    for p in pending {
        p.await?.map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
    }
    let raw_rate = records.len() as f64 / started.elapsed().as_secs_f64();

    // Ingest checks lines against the catalog of the read store, here an
    // empty keyspace of its own, as a distributed ingest replica does.
    ScyllaStore::migrate(catalog).await?;
    let store = Arc::new(ScyllaStore::connect(catalog.clone()).await?);
    let log = Arc::new(KafkaLog::new(cfg.clone(), None, Duration::from_secs(30))?);
    let limits = hindsight_ingest::http::IngestLimits::default();
    let router = hindsight_ingest::http::router(hindsight_ingest::http::IngestState {
        log,
        token: TOKEN.into(),
        max_body_bytes: 64 << 20,
        limits,
        catalog: Arc::new(hindsight_ingest::catalog::CatalogView::new(
            store,
            limits.catalog_max_age,
        )),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/ingest/v1/events", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    let started = Instant::now();
    crate::send_all(&url, TOKEN, shape.bodies(10_000), 8).await?;
    let ingest = records.len() as f64 / started.elapsed().as_secs_f64();
    println!(
        "   ingest, {} events of the long-tail shape in 10 000-line batches:",
        records.len()
    );
    println!("     raw rdkafka producer, pre-encoded records        {raw_rate:>10.0} events/s");
    println!(
        "     HTTP ingest -> Kafka (8 connections, confirmed)   {ingest:>10.0} events/s  ({:.2}x raw)",
        ingest / raw_rate
    );
    Ok(())
}

/// Appends the shape to fresh topics, then times a fresh projector draining
/// them into a fresh keyspace.
async fn project(
    kafka: &KafkaConfig,
    cql: &ScyllaConfig,
    shape: &Shape,
) -> anyhow::Result<Arc<ScyllaStore>> {
    hindsight_kafka::topics::init(kafka).await?;
    ScyllaStore::migrate(cql).await?;
    let log = KafkaLog::new(kafka.clone(), None, Duration::from_secs(60))?;
    let events = shape.events();
    let total = events.len();
    for chunk in events.chunks(20_000) {
        log.append(AppendBatch {
            events: chunk.to_vec().into(),
            idempotency: None,
        })
        .await?;
    }
    let store = Arc::new(ScyllaStore::connect(cql.clone()).await?);
    let source = KafkaSource {
        config: kafka.clone(),
        store: Some(store.clone()),
    };
    let mut consumer = source.open().await?;
    let mut projector = Projector::new(Arc::new(source), store.clone(), ProjectorConfig::default());
    let (mut applied, mut started) = (0usize, None);
    while applied < total {
        let step = projector.advance(consumer.as_mut()).await?;
        if step.events > 0 {
            started.get_or_insert_with(Instant::now);
            applied += step.events;
        }
    }
    projector.settle(consumer.as_mut()).await?;
    let secs = started.map_or(1e-9, |s: Instant| s.elapsed().as_secs_f64());
    println!(
        "     {:<50} {:>8} events {:>10.0} events/s",
        shape.name,
        total,
        total as f64 / secs
    );
    Ok(store)
}

/// The same 200-point page from `hindsight api` over Cassandra and over the
/// embedded store holding the same projected data.
async fn pages(
    dir: &std::path::Path,
    cql: &ScyllaConfig,
    shape: &Shape,
    quick: bool,
) -> anyhow::Result<()> {
    let embedded_dir = dir.join("embedded");
    project_with_key(&Embedded::open(&embedded_dir)?, shape.events()).await?;

    let path = format!(
        "/v1/tokens/dn0-yes/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=200",
        DAY + 4 * 3600
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let secs = if quick { 1.5 } else { 4.0 };
    println!("   a 200-point history page (1m prices of one token), 8 connections, `hindsight api` process:");
    let mut embedded_rps = 0.0;
    for (name, backend) in [
        (
            "embedded store (SQLite)",
            vec!["--data-dir".to_string(), embedded_dir.display().to_string()],
        ),
        (
            "Cassandra",
            vec![
                "--data-dir".to_string(),
                dir.join("api-cql").display().to_string(),
                "--scylla-nodes".to_string(),
                cql.nodes.join(","),
                "--scylla-keyspace".to_string(),
                cql.keyspace.clone(),
                "--scylla-consistency".to_string(),
                "ONE".to_string(),
                // Required with the CQL store (replicas sign cursors alike).
                "--cursor-secret".to_string(),
                "bench-cursor-secret-of-thirty-two-bytes".to_string(),
            ],
        ),
    ] {
        let server = Server::api(|c| {
            c.args(&backend)
                .env_remove("HINDSIGHT_KAFKA_BROKERS")
                .env_remove("HINDSIGHT_SCYLLA_NODES")
                .env("HINDSIGHT_LOG", "warn");
        })?;
        // Ready once the page answers in full.
        server
            .until_ready(&client, &path, KEY, |body| {
                serde_json::from_str::<serde_json::Value>(body)
                    .is_ok_and(|v| v["data"].as_array().map_or(0, Vec::len) == 200)
            })
            .await?;
        let url = format!("{}{path}", server.base);
        let f = load(&client, &url, 8, secs).await;
        if embedded_rps == 0.0 {
            embedded_rps = f.rps;
        }
        println!(
            "     {name:<28} {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  ({:.2}x embedded)",
            f.rps,
            f.p50,
            f.p99,
            f.rps / embedded_rps
        );
        drop(server);
    }
    Ok(())
}
