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

use crate::api::{load, project_with_key, Server, KEY};
use hindsight::app::Embedded;
use hindsight_api::keys;
use hindsight_contracts::{AppendBatch, AuthStore, ConsumerSource, EventLog};
use hindsight_kafka::{KafkaConfig, KafkaLog, KafkaSource};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::{codec, wire, Event, Timestamp};
use hindsight_scylla::{ScyllaConfig, ScyllaStore};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-ingest-token";
const DAY: i64 = 1_756_684_800;

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

/// A data shape: NDJSON batches (catalog first, then ticks in time order).
struct Shape {
    name: String,
    bodies: Vec<String>,
}

fn market_line(m: &str) -> String {
    format!(
        r#"{{"kind":"market","id":"{m}","slug":"{m}-slug","question":"Will {m} happen?","status":"open","tokens":[{{"id":"{m}-yes","label":"Yes"}},{{"id":"{m}-no","label":"No"}}],"updated_at":"2025-08-15T00:00:00Z"}}"#
    )
}

fn tick_line(m: &str, side: &str, ts: i64, p: f64) -> String {
    format!(r#"{{"kind":"price","market_id":"{m}","token_id":"{m}-{side}","ts":{ts},"p":{p}}}"#)
}

/// Splits lines into bodies of at most `per` lines.
fn bodies(lines: Vec<String>, per: usize) -> Vec<String> {
    lines.chunks(per).map(|c| c.join("\n") + "\n").collect()
}

/// 10 000 markets (20 000 tokens) over one day; token activity follows a
/// Zipf-like law (weight 1/rank), so a few tokens trade every few seconds
/// and most a handful of times a day.
fn long_tail(prefix: &str, ticks: usize) -> Shape {
    let markets = 10_000;
    let tokens = markets * 2;
    // Inverse CDF of weights 1/(rank+1), sampled by a fixed LCG.
    let cdf: Vec<f64> = (0..tokens)
        .scan(0.0, |acc, r| {
            *acc += 1.0 / (r as f64 + 1.0);
            Some(*acc)
        })
        .collect();
    let total = *cdf.last().unwrap();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lines: Vec<String> = (0..markets)
        .map(|m| market_line(&format!("{prefix}{m}")))
        .collect();
    for n in 0..ticks {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let u = (state >> 11) as f64 / (1u64 << 53) as f64 * total;
        let token = cdf.partition_point(|&c| c < u).min(tokens - 1);
        let ts = DAY + (n as i64 * 86_400) / ticks as i64;
        let p = ((n * 7919) % 1000) as f64 / 1000.0;
        let side = if token % 2 == 0 { "yes" } else { "no" };
        lines.push(tick_line(&format!("{prefix}{}", token / 2), side, ts, p));
    }
    Shape {
        name: "long tail: 20 000 tokens, 1 day, Zipf activity".into(),
        bodies: bodies(lines, 10_000),
    }
}

/// 25 markets (50 tokens), each token a tick every `every` seconds for four
/// hours: 240 one-minute buckets per token, the page the API section reads.
fn dense(prefix: &str, every: i64) -> Shape {
    let markets = 25;
    let mut lines: Vec<String> = (0..markets)
        .map(|m| market_line(&format!("{prefix}{m}")))
        .collect();
    for s in (0..4 * 3600).step_by(every as usize) {
        for m in 0..markets {
            for side in ["yes", "no"] {
                let p = (((s as usize) * 31 + m * 7) % 1000) as f64 / 1000.0;
                lines.push(tick_line(&format!("{prefix}{m}"), side, DAY + s, p));
            }
        }
    }
    Shape {
        name: format!("dense: 50 tokens, 4 h, a tick every {every} s each"),
        bodies: bodies(lines, 10_000),
    }
}

fn events_of(shape: &Shape) -> Vec<Event> {
    let now = Timestamp::now();
    shape
        .bodies
        .iter()
        .flat_map(|b| b.lines())
        .map(|l| wire::parse_line(l, now).expect("bench lines are valid"))
        .collect()
}

async fn run_async(quick: bool) -> anyhow::Result<()> {
    let brokers = required("HINDSIGHT_KAFKA_BROKERS")?;
    let nodes = required("HINDSIGHT_SCYLLA_NODES")?;
    let bin = std::env::current_exe()?.with_file_name("hindsight");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: run `cargo build --release` first",
        bin.display()
    );
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
    let shapes = [long_tail("lt", tail_ticks), dense("dn", every)];

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
    pages(&bin, &dir, &cql("proj1"), &shapes[1], quick).await?;
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
    let records: Vec<(String, Vec<u8>)> = events_of(shape)
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
    crate::send_all(&url, TOKEN, shape.bodies.clone(), 8).await?;
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
    let events = events_of(shape);
    let total = events.len();
    for chunk in events.chunks(20_000) {
        log.append(AppendBatch {
            events: chunk.to_vec(),
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
        let step = projector.step(consumer.as_mut()).await?;
        if step.events > 0 {
            started.get_or_insert_with(Instant::now);
            applied += step.events;
        }
    }
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
    bin: &std::path::Path,
    dir: &std::path::Path,
    cql: &ScyllaConfig,
    shape: &Shape,
    quick: bool,
) -> anyhow::Result<()> {
    let embedded_dir = dir.join("embedded");
    project_with_key(&Embedded::open(&embedded_dir)?, events_of(shape)).await?;

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
            ],
        ),
    ] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let server = Server(
            Command::new(bin)
                .args(["api", "--listen", &format!("127.0.0.1:{port}")])
                .args(&backend)
                .env_remove("HINDSIGHT_KAFKA_BROKERS")
                .env_remove("HINDSIGHT_SCYLLA_NODES")
                .env("HINDSIGHT_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()?,
        );
        let url = format!("http://127.0.0.1:{port}{path}");
        // Ready once the page answers in full.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client.get(&url).header("X-API-Key", KEY).send().await {
                if r.status() == 200 {
                    let v: serde_json::Value = r.json().await?;
                    let n = v["data"].as_array().map_or(0, Vec::len);
                    anyhow::ensure!(n == 200, "{name}: the page has {n} points, not 200");
                    break;
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "{name}: api did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
