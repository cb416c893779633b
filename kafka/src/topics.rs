//! Topics, their names and settings, and `hindsight kafka init`.

use hindsight_contracts::{Error, Result};
use hindsight_schemas::EventKind;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use std::time::Duration;

/// The data kinds that get a topic each, in partition-id order.
pub const KINDS: [&str; 4] = ["prices", "books", "metrics", "catalog"];

/// How to reach Kafka and lay out the topics.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// `host:port,host:port`.
    pub brokers: String,
    /// Topic names are `{prefix}.{kind}`.
    pub topic_prefix: String,
    pub partitions: i32,
    pub replication: i32,
    /// Consumer group of the projectors.
    pub group: String,
    /// Static group membership (`group.instance.id`): a stable name per
    /// projector (pod, replica). A restarted projector with the same name
    /// resumes its predecessor's membership instead of waiting out its
    /// session.
    pub instance_id: Option<String>,
    /// Most events an ingest process has sent but not yet seen confirmed.
    pub max_in_flight: usize,
}

impl KafkaConfig {
    pub fn topic(&self, kind: usize) -> String {
        format!("{}.{}", self.topic_prefix, KINDS[kind])
    }

    pub fn topics(&self) -> Vec<String> {
        (0..KINDS.len()).map(|k| self.topic(k)).collect()
    }

    /// The topic (index) an event kind goes to.
    pub fn kind_index(kind: EventKind) -> usize {
        match kind {
            EventKind::Price => 0,
            EventKind::Book => 1,
            EventKind::Metrics => 2,
            EventKind::Series | EventKind::Event | EventKind::Market => 3,
        }
    }

    /// The topic index of a topic name, if it is one of ours.
    pub fn index_of(&self, topic: &str) -> Option<usize> {
        (0..KINDS.len()).find(|&k| self.topic(k) == topic)
    }

    pub fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        c
    }
}

/// The log partition id of a Kafka (topic, partition): the read store keys
/// consumed positions and row offsets by it.
pub fn partition_id(topic_index: usize, partition: i32) -> u32 {
    ((topic_index as u32) << 16) | partition as u32
}

pub fn split_partition_id(id: u32) -> (usize, i32) {
    ((id >> 16) as usize, (id & 0xffff) as i32)
}

fn fail(e: impl std::fmt::Display) -> Error {
    Error::unavailable("kafka", e.to_string())
}

/// Creates the topics, or verifies existing ones have the configured
/// partition count. Brokers without topic auto-creation need this first.
pub async fn init(config: &KafkaConfig) -> Result<Vec<String>> {
    let admin: AdminClient<DefaultClientContext> = config.client().create().map_err(fail)?;
    let names = config.topics();
    let new: Vec<NewTopic> = names
        .iter()
        .map(|n| {
            NewTopic::new(
                n,
                config.partitions,
                TopicReplication::Fixed(config.replication),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics(&new, &opts).await.map_err(fail)?;
    let mut report = Vec::new();
    for r in results {
        match r {
            Ok(name) => report.push(format!(
                "created {name} ({} partitions, replication {})",
                config.partitions, config.replication
            )),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                report.push(format!("exists {name}"))
            }
            Err((name, code)) => return Err(fail(format!("creating {name}: {code}"))),
        }
    }
    verify(config, Duration::from_secs(30))?;
    Ok(report)
}

/// Fails clearly when a topic is missing (brokers need not auto-create).
pub fn verify(config: &KafkaConfig, timeout: Duration) -> Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let probe: BaseConsumer = config.client().create().map_err(fail)?;
    for name in config.topics() {
        let meta = probe.fetch_metadata(Some(&name), timeout).map_err(fail)?;
        let topic = meta.topics().iter().find(|t| t.name() == name);
        match topic {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {}
            _ => {
                return Err(fail(format!(
                    "topic {name} does not exist: run `hindsight kafka init`"
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_ids_round_trip_and_every_kind_has_a_topic() {
        for t in 0..KINDS.len() {
            for p in [0, 1, 7, 1023] {
                assert_eq!(split_partition_id(partition_id(t, p)), (t, p));
            }
        }
        let c = KafkaConfig {
            brokers: String::new(),
            topic_prefix: "hs".into(),
            partitions: 3,
            replication: 1,
            group: "g".into(),
            instance_id: None,
            max_in_flight: 1,
        };
        assert_eq!(
            c.topic(KafkaConfig::kind_index(EventKind::Market)),
            "hs.catalog"
        );
        assert_eq!(c.index_of("hs.books"), Some(1));
        assert_eq!(c.index_of("other.books"), None);
    }
}
