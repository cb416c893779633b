//! The Kafka log passes the shared log conformance suite on a real broker,
//! one test per check:
//!
//! ```text
//! eval "$(scripts/engines.sh start)"      # Apache Kafka 4.1 on loopback
//! cargo test -p hindsight-kafka --test conformance
//! ```
//!
//! Without `HINDSIGHT_KAFKA_BROKERS` every check fails and says how to start
//! a broker: a suite that did not run must not count as passed.
//!
//! Each check gets topics under a prefix of its own (created by
//! `topics::init`, three partitions each) and a consumer group of its own;
//! idempotency keys live in an `IdempotencyFile`, as beside an ingest
//! process, and consumed positions in an embedded read store, as a
//! projector writes them before committing to the group.

use hindsight_contracts::conformance::LogFixture;
use hindsight_contracts::{ConsumerSource, EventLog, IdempotencyStore, ProjectionStore};
use hindsight_kafka::{topics, KafkaConfig, KafkaLog, KafkaSource};
use hindsight_sqlite::{IdempotencyFile, SqliteStore};
use std::sync::Arc;
use std::time::Duration;

async fn log(prefix: &str) -> LogFixture {
    let brokers = std::env::var("HINDSIGHT_KAFKA_BROKERS").unwrap_or_else(|_| {
        panic!(
            "HINDSIGHT_KAFKA_BROKERS is not set: the Kafka log conformance suite needs a broker. \
             Start one with `eval \"$(scripts/engines.sh start)\"` (Apache Kafka 4.1 on \
             loopback) and run the tests again in that shell"
        )
    });
    let config = KafkaConfig {
        brokers,
        topic_prefix: format!("hsconf.{prefix}"),
        partitions: 3,
        replication: 1,
        group: format!("hsconf.{prefix}"),
        instance_id: None,
        max_in_flight: 10_000,
    };
    create_topics(&config).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let idempotency: Arc<dyn IdempotencyStore> =
        Arc::new(IdempotencyFile::open(dir.path()).expect("open idempotency file"));
    let log = KafkaLog::new(config.clone(), Some(idempotency), Duration::from_secs(10))
        .expect("producer");
    let store: Arc<dyn ProjectionStore> =
        Arc::new(SqliteStore::open(dir.path()).expect("open store"));
    LogFixture {
        log: Arc::new(log) as Arc<dyn EventLog>,
        source: Arc::new(KafkaSource {
            config,
            store: Some(store.clone()),
        }) as Arc<dyn ConsumerSource>,
        store,
        keep: Box::new(dir),
    }
}

/// `topics::init` verifies the topics right after creating them, and the
/// broker can answer that metadata request before the new topics reach its
/// metadata cache ("topic ... does not exist"): `init` is idempotent, so
/// try again briefly. (Reported: `init` itself should wait for them.)
async fn create_topics(config: &KafkaConfig) {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match topics::init(config).await {
            Ok(_) => return,
            Err(e) if attempt < 10 && e.to_string().contains("does not exist") => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("creating topics under {}: {e}", config.topic_prefix),
        }
    }
}

mod kafka {
    hindsight_contracts::log_conformance!(super::log);
}
