//! The Kafka log on librdkafka's in-process mock cluster: fast, and able to
//! take a broker down on demand. (Consumer groups and restarts are tested
//! against a real broker, tansu, in the workspace's `tests/kafka_tansu.rs`.)

use hindsight_contracts::{AppendBatch, AppendOutcome, EventLog, Idempotency};
use hindsight_contracts::{Range, ReadStore};
use hindsight_kafka::{KafkaConfig, KafkaLog, KafkaSource};
use hindsight_projector::Projector;
use hindsight_projector::ProjectorConfig;
use hindsight_schemas::*;
use hindsight_sqlite::{IdempotencyFile, SqliteStore};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use std::sync::Arc;
use std::time::Duration;

const T0: i64 = 1_756_684_800_000;

fn cluster(partitions: i32) -> (MockCluster<'static, DefaultProducerContext>, KafkaConfig) {
    let mock = MockCluster::new(1).unwrap();
    let config = KafkaConfig {
        brokers: mock.bootstrap_servers(),
        topic_prefix: format!("t{}", std::process::id()),
        partitions,
        replication: 1,
        group: "projectors".into(),
        instance_id: None,
        max_in_flight: 10_000,
    };
    // The mock cluster does not create topics through the admin API.
    for topic in config.topics().into_iter().chain([config.markers_topic()]) {
        mock.create_topic(&topic, partitions, 1).unwrap();
    }
    (mock, config)
}

fn events(markets: usize, ticks: usize) -> Vec<Event> {
    let mut out = Vec::new();
    for m in 0..markets {
        out.push(Event::Market(Box::new(MarketRecord {
            id: format!("m{m}"),
            slug: format!("m{m}"),
            event_id: None,
            question: None,
            description: None,
            status: "open".into(),
            start_date: None,
            end_date: None,
            closed_at: None,
            resolved_token_id: None,
            resolved_token_label: None,
            tokens: vec![Token {
                id: format!("m{m}-y"),
                label: "Yes".into(),
            }],
            created_at: Timestamp(T0),
            updated_at: Timestamp(T0),
        })));
        for k in 0..ticks {
            out.push(Event::Price(PriceTick {
                market_id: format!("m{m}"),
                token_id: format!("m{m}-y"),
                ts: Timestamp(T0 + k as i64 * 1000),
                p: (k % 10) as f64 / 10.0,
            }));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn appended_events_are_projected_from_a_consumer_group() {
    let (_mock, config) = cluster(3);
    let log = KafkaLog::new(config.clone(), None, Duration::from_secs(5)).unwrap();
    let outcome = log
        .append(AppendBatch {
            events: events(6, 120).into(),
            idempotency: None,
        })
        .await
        .unwrap();
    assert_eq!(outcome, AppendOutcome::Appended { count: 6 * 121 });

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let mut projector = Projector::new(
        Arc::new(KafkaSource {
            config,
            store: Some(store.clone()),
        }),
        store.clone(),
        ProjectorConfig::default(),
    );
    let applied = tokio::time::timeout(Duration::from_secs(60), projector.catch_up())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(applied, 6 * 121);
    for m in 0..6 {
        let range = Range {
            res: Resolution::H1,
            start: Timestamp(T0),
            end: Timestamp(T0 + 3_600_000),
            limit: 10,
        };
        let points = store.prices(&format!("m{m}-y"), range).await.unwrap();
        assert_eq!(points.len(), 1);
        // 120 ticks cycling 0.0..0.9: mean 0.45.
        assert!((points[0].p - 0.45).abs() < 1e-12, "{}", points[0].p);
        assert_eq!(
            store
                .token(&format!("m{m}-y"))
                .await
                .unwrap()
                .unwrap()
                .market_id,
            format!("m{m}")
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_down_broker_fails_the_batch_and_nothing_is_acknowledged() {
    let (mock, config) = cluster(1);
    let dir = tempfile::tempdir().unwrap();
    let idempotency = IdempotencyFile::open(dir.path()).unwrap();
    let log = KafkaLog::new(
        config,
        Some(Arc::new(idempotency)),
        Duration::from_millis(1500),
    )
    .unwrap();
    let batch = |key: &str| AppendBatch {
        events: events(1, 10).into(),
        idempotency: Some(Idempotency::for_body(key, b"one body", b"first".to_vec())),
    };
    assert!(matches!(
        log.append(batch("a")).await,
        Ok(AppendOutcome::Appended { .. })
    ));
    mock.broker_down(1).unwrap();
    let started = std::time::Instant::now();
    let err = log.append(batch("b")).await.unwrap_err();
    assert!(err.to_string().contains("kafka"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by the delivery timeout"
    );
    mock.broker_up(1).unwrap();
    // The failed batch was not recorded as done: its retry appends.
    let retried = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Ok(outcome) = log.append(batch("b")).await {
                return outcome;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(retried, AppendOutcome::Appended { count: 11 });
    // And a retry of an acknowledged batch is answered from the record.
    assert_eq!(
        log.append(batch("a")).await.unwrap(),
        AppendOutcome::Duplicate {
            response: b"first".to_vec()
        }
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_in_flight_budget_refuses_fast_instead_of_queueing() {
    let (mock, mut config) = cluster(1);
    config.max_in_flight = 50;
    let log = Arc::new(KafkaLog::new(config, None, Duration::from_secs(5)).unwrap());
    mock.broker_down(1).unwrap();
    // One batch takes the whole budget and waits on the down broker...
    let stuck = {
        let log = log.clone();
        tokio::spawn(async move {
            log.append(AppendBatch {
                events: events(1, 49).into(),
                idempotency: None,
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...so the next is refused within the budget wait, not queued.
    let started = std::time::Instant::now();
    let err = log
        .append(AppendBatch {
            events: events(1, 5).into(),
            idempotency: None,
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("in-flight budget"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    mock.broker_up(1).unwrap();
    let _ = stuck.await.unwrap();
}
