//! Kafka on a real broker: HTTP ingest → Kafka events/s next to a raw
//! rdkafka producer sending the same encoded records to the same broker in
//! the same run, and Kafka → read store events/s for the projector.
//!
//! Broker: Apache Kafka at `HINDSIGHT_KAFKA_BROKERS` (`scripts/engines.sh`).

use hindsight_contracts::ConsumerSource;
use hindsight_kafka::{KafkaConfig, KafkaLog, KafkaSource};
use hindsight_projector::Projector;
use hindsight_projector::ProjectorConfig;
use hindsight_schemas::{codec, wire, Timestamp};
use hindsight_sqlite::SqliteStore;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-ingest-token";

/// The broker under test: Apache Kafka from `scripts/engines.sh`
/// (`eval "$(scripts/engines.sh start)"` exports its address).
fn brokers() -> anyhow::Result<String> {
    std::env::var("HINDSIGHT_KAFKA_BROKERS").map_err(|_| {
        anyhow::anyhow!(
            "HINDSIGHT_KAFKA_BROKERS is not set: start Apache Kafka with `eval \"$(scripts/engines.sh start)\"`"
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
    let dir = std::env::temp_dir().join(format!("hindsight-bench-kafka-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let brokers = brokers()?;
    let events = if quick { 100_000 } else { 400_000 };
    let batch_lines = 10_000;
    let config = |prefix: &str| KafkaConfig {
        brokers: brokers.clone(),
        topic_prefix: prefix.into(),
        partitions: 6,
        replication: 1,
        group: format!("{prefix}-projector"),
        instance_id: None,
        max_in_flight: 200_000,
    };

    // Topics for both runs first, before the broker is under load.
    let raw_cfg = config("raw");
    let cfg = config("hs");
    hindsight_kafka::topics::init(&raw_cfg).await?;
    hindsight_kafka::topics::init(&cfg).await?;

    // The same events, as NDJSON bodies and as encoded records.
    let bodies: Vec<String> = (0..events / batch_lines)
        .map(|b| {
            (0..batch_lines)
                .map(|i| {
                    let n = b * batch_lines + i;
                    format!(
                        "{{\"kind\":\"price\",\"market_id\":\"km{}\",\"token_id\":\"km{}-yes\",\"ts\":{},\"p\":{}}}\n",
                        n % 500,
                        n % 500,
                        1_756_684_800 + (n / 500) as i64,
                        (n % 1000) as f64 / 1000.0
                    )
                })
                .collect()
        })
        .collect();
    let records: Vec<(String, Vec<u8>)> = bodies
        .iter()
        .flat_map(|b| b.lines())
        .map(|l| {
            let e = wire::parse_line(l, Timestamp::now()).unwrap();
            (e.key().to_string(), codec::encode(&e))
        })
        .collect();

    // Raw rdkafka: the encoded records, same producer settings.
    let producer: FutureProducer = raw_cfg
        .client()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "lz4")
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let topic = raw_cfg.topic(0);
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
    let raw = records.len() as f64 / started.elapsed().as_secs_f64();

    // Hindsight: HTTP ingest (validate, check against the store's catalog,
    // encode, produce, wait for confirms).
    let store = Arc::new(SqliteStore::open(&dir.join("store"))?);
    let log = Arc::new(KafkaLog::new(cfg.clone(), None, Duration::from_secs(30))?);
    let limits = hindsight_ingest::http::IngestLimits::default();
    let router = hindsight_ingest::http::router(hindsight_ingest::http::IngestState {
        log,
        token: TOKEN.into(),
        max_body_bytes: 64 << 20,
        limits,
        catalog: Arc::new(hindsight_ingest::catalog::CatalogView::new(
            store.clone(),
            limits.catalog_max_age,
        )),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/ingest/v1/events", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    let started = Instant::now();
    crate::send_all(&url, TOKEN, bodies, 8).await?;
    let ingest = events as f64 / started.elapsed().as_secs_f64();

    // Projector: a fresh group from the beginning into a SQLite store, timed
    // from its first batch (joining the group is not throughput).
    let source = KafkaSource {
        config: cfg.clone(),
        store: Some(store.clone()),
    };
    let mut consumer = source.open().await?;
    let mut projector = Projector::new(Arc::new(source), store, ProjectorConfig::default());
    let (mut applied, mut started) = (0usize, None);
    loop {
        let step = projector.step(consumer.as_mut()).await?;
        if step.events > 0 {
            started.get_or_insert_with(Instant::now);
            applied += step.events;
        } else if applied >= events {
            break;
        }
    }
    let project = applied as f64 / started.map_or(1e-9, |s: Instant| s.elapsed().as_secs_f64());

    println!("== Kafka (Apache Kafka at {brokers}; 6 partitions; {events} price ticks)");
    println!("   raw rdkafka producer, pre-encoded records      {raw:>10.0} events/s");
    println!(
        "   HTTP ingest -> Kafka (8 connections, confirmed) {ingest:>10.0} events/s  ({:.2}x raw)",
        ingest / raw
    );
    println!("   Kafka -> read store (projector, from 1st batch)  {project:>10.0} events/s");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
