//! Topics, their names and settings, and `hindsight kafka init`.
//!
//! The topics are the source of truth: `rebuild` replays them from the
//! first offset. So they must never delete an event: `retention.ms=-1`,
//! `retention.bytes=-1` and `cleanup.policy=delete` (compaction would keep
//! only the newest record per key, i.e. drop history). The broker's
//! defaults (7 days, delete) would silently lose history, so `init` creates
//! topics with these settings and fixes existing ones, and `verify` — run
//! by every service at start and by ingest's readiness — refuses a topic
//! that would lose events.
//!
//! One more topic, `{prefix}.ingest-markers`, holds a marker record per
//! attempt to append a keyed batch (see `keyed`): it is no part of the
//! source of truth, so it deletes records after [`MARKERS_RETENTION_MS`],
//! well past the 24 h a key is remembered. Projectors never read it;
//! `init` creates it and ingest refuses to start without it.

use hindsight_contracts::{Error, Result};
use hindsight_schemas::EventKind;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigResource, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::Duration;

/// The data kinds that get a topic each, in partition-id order.
pub const KINDS: [&str; 4] = ["prices", "books", "metrics", "catalog"];

/// Topic settings that keep every event forever (see the module doc).
pub const KEEP_FOREVER: [(&str, &str); 3] = [
    ("retention.ms", "-1"),
    ("retention.bytes", "-1"),
    ("cleanup.policy", "delete"),
];

/// Suffix of the marker topic: `{prefix}.ingest-markers`.
pub const MARKERS: &str = "ingest-markers";

/// How long marker records are kept: 7 days. A dead attempt's marker is read
/// when a retry of its key arrives, at most 24 h after the key's first claim.
pub const MARKERS_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

/// The shortest marker retention `verify_markers` accepts: the 24 h a key is
/// remembered, and an hour of margin.
const MARKERS_MIN_RETENTION_MS: i64 = 25 * 3600 * 1000;

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

    /// The event topics (the source of truth; what projectors read).
    pub fn topics(&self) -> Vec<String> {
        (0..KINDS.len()).map(|k| self.topic(k)).collect()
    }

    /// The topic of keyed appends' marker records (never projected).
    pub fn markers_topic(&self) -> String {
        format!("{}.{MARKERS}", self.topic_prefix)
    }

    /// The topic (index) an event kind goes to. Trades share the prices
    /// topic (no topic to create on an existing cluster; a market's trades
    /// stay in one partition, which their deduplication by trade id needs).
    pub fn kind_index(kind: EventKind) -> usize {
        match kind {
            EventKind::Price | EventKind::Trade => 0,
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

/// Creates the event topics with [`KEEP_FOREVER`] settings and the marker
/// topic with [`MARKERS_RETENTION_MS`]; for event topics that already
/// exist, checks the partition count and sets [`KEEP_FOREVER`] where the
/// topic would delete events. Returns one report line per topic.
pub async fn init(config: &KafkaConfig) -> Result<Vec<String>> {
    let admin = admin(config)?;
    let names = config.topics();
    let markers = config.markers_topic();
    let markers_retention = MARKERS_RETENTION_MS.to_string();
    let new_topic = |name| {
        NewTopic::new(
            name,
            config.partitions,
            TopicReplication::Fixed(config.replication),
        )
    };
    let mut new: Vec<NewTopic> = names
        .iter()
        .map(|n| {
            KEEP_FOREVER
                .iter()
                .fold(new_topic(n), |t, (k, v)| t.set(k, v))
        })
        .collect();
    new.push(
        new_topic(&markers)
            .set("retention.ms", &markers_retention)
            .set("cleanup.policy", "delete"),
    );
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics(&new, &opts).await.map_err(fail)?;
    let mut report = Vec::new();
    for r in results {
        match r {
            Ok(name) if name == markers => report.push(format!(
                "created {name} ({} partitions, replication {}, markers of keyed appends, kept 7 days)",
                config.partitions, config.replication
            )),
            Ok(name) => report.push(format!(
                "created {name} ({} partitions, replication {}, retention forever)",
                config.partitions, config.replication
            )),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) if name == markers => {
                report.push(format!("exists {name} (markers of keyed appends)"));
            }
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                let described = describe(&admin, &name, Duration::from_secs(30)).await?;
                let wrong = losing_settings(&described);
                if wrong.is_empty() {
                    report.push(format!("exists {name} (retention forever)"));
                } else {
                    keep_forever(&admin, &name, &described).await?;
                    report.push(format!(
                        "fixed {name}: was {}, now {}",
                        show(&wrong),
                        show(&KEEP_FOREVER.map(|(k, v)| (k.to_string(), v.to_string())))
                    ));
                }
            }
            Err((name, code)) => return Err(fail(format!("creating {name}: {code}"))),
        }
    }
    // A topic just created reaches every broker's metadata a moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let all: Vec<String> = names.iter().cloned().chain([markers]).collect();
    while missing_topic(config, &all, Duration::from_secs(10))?.is_some()
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    verify(config, Duration::from_secs(30))?;
    verify_markers(config, Duration::from_secs(30))?;
    Ok(report)
}

/// Fails clearly when a topic is missing (brokers need not auto-create) or
/// would delete events (finite retention, compaction).
pub fn verify(config: &KafkaConfig, timeout: Duration) -> Result<()> {
    if let Some(name) = missing_topic(config, &config.topics(), timeout)? {
        return Err(fail(format!(
            "topic {name} does not exist: run `hindsight kafka init`"
        )));
    }
    // The admin client's futures are completed by its own polling thread,
    // so this synchronous check (called from sync and async callers alike)
    // can wait on them without a runtime.
    let admin = admin(config)?;
    for name in config.topics() {
        let described = block_on(describe(&admin, &name, timeout))?;
        let wrong = losing_settings(&described);
        if !wrong.is_empty() {
            return Err(Error::backend(
                "kafka",
                format!(
                    "topic {name} would delete events ({}): the log is the source of truth \
                     that `rebuild` replays; run `hindsight kafka init` to keep events forever",
                    show(&wrong)
                ),
            ));
        }
    }
    Ok(())
}

/// What appending keyed batches needs beyond [`verify`]: the marker topic,
/// keeping records at least a day and an hour, never compacted (a marker is
/// found by its offset).
pub fn verify_markers(config: &KafkaConfig, timeout: Duration) -> Result<()> {
    let name = config.markers_topic();
    if missing_topic(config, std::slice::from_ref(&name), timeout)?.is_some() {
        return Err(fail(format!(
            "topic {name} (markers of keyed appends) does not exist: run `hindsight kafka init`"
        )));
    }
    let described = block_on(describe(&admin(config)?, &name, timeout))?;
    let value = |key: &str| described.get(key).and_then(|e| e.value.clone());
    let retention = value("retention.ms").and_then(|v| v.trim().parse::<i64>().ok());
    let keeps = retention.is_some_and(|ms| !(0..MARKERS_MIN_RETENTION_MS).contains(&ms));
    let deletes =
        value("cleanup.policy").is_some_and(|p| p.split(',').all(|p| p.trim() == "delete"));
    if keeps && deletes {
        Ok(())
    } else {
        Err(Error::backend(
            "kafka",
            format!(
                "topic {name} must keep markers at least 25 h (retention.ms {}) without compaction \
                 (cleanup.policy {}): a retry up to 24 h later reads them",
                retention.map_or("unset".into(), |r| r.to_string()),
                value("cleanup.policy").unwrap_or_else(|| "unset".into())
            ),
        ))
    }
}

/// The first of `names` the broker's metadata does not list.
fn missing_topic(
    config: &KafkaConfig,
    names: &[String],
    timeout: Duration,
) -> Result<Option<String>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let probe: BaseConsumer = config.client().create().map_err(fail)?;
    for name in names {
        let meta = probe.fetch_metadata(Some(name), timeout).map_err(fail)?;
        let topic = meta.topics().iter().find(|t| t.name() == name);
        match topic {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {}
            _ => return Ok(Some(name.clone())),
        }
    }
    Ok(None)
}

fn admin(config: &KafkaConfig) -> Result<AdminClient<DefaultClientContext>> {
    config.client().create().map_err(fail)
}

/// A topic's configuration; librdkafka fails the request after `timeout`.
async fn describe(
    admin: &AdminClient<DefaultClientContext>,
    name: &str,
    timeout: Duration,
) -> Result<ConfigResource> {
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let mut results = admin
        .describe_configs(&[ResourceSpecifier::Topic(name)], &opts)
        .await
        .map_err(fail)?;
    match results.pop() {
        Some(Ok(resource)) => Ok(resource),
        Some(Err(code)) => Err(fail(format!("describing {name}: {code}"))),
        None => Err(fail(format!("describing {name}: no answer"))),
    }
}

/// The settings of a topic that would delete events, as (name, value).
pub fn losing_settings(topic: &ConfigResource) -> Vec<(String, String)> {
    let value = |name: &str| topic.get(name).and_then(|e| e.value.clone());
    let mut wrong = Vec::new();
    for name in ["retention.ms", "retention.bytes"] {
        match value(name) {
            Some(v) if v.trim().parse::<i64>().is_ok_and(|n| n < 0) => {}
            other => wrong.push((name.to_string(), other.unwrap_or_else(|| "unset".into()))),
        }
    }
    match value("cleanup.policy") {
        Some(p) if p.split(',').all(|p| p.trim() == "delete") => {}
        other => wrong.push((
            "cleanup.policy".to_string(),
            other.unwrap_or_else(|| "unset".into()),
        )),
    }
    wrong
}

/// Sets [`KEEP_FOREVER`] on a topic. `AlterConfigs` replaces the topic's
/// whole configuration, so the topic's other explicit settings are sent
/// again unchanged.
async fn keep_forever(
    admin: &AdminClient<DefaultClientContext>,
    name: &str,
    described: &ConfigResource,
) -> Result<()> {
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(name));
    for e in &described.entries {
        if e.source == rdkafka::admin::ConfigSource::DynamicTopic && !e.is_sensitive {
            if let Some(v) = &e.value {
                alter = alter.set(&e.name, v);
            }
        }
    }
    for (k, v) in KEEP_FOREVER {
        alter = alter.set(k, v);
    }
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    for r in admin.alter_configs(&[alter], &opts).await.map_err(fail)? {
        if let Err((_, code)) = r {
            return Err(fail(format!("setting retention of {name}: {code}")));
        }
    }
    Ok(())
}

fn show(settings: &[(String, String)]) -> String {
    settings
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs a future to completion on this thread.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
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
