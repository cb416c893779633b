//! The projector side: [`KafkaConsumer`], one member of the projectors'
//! consumer group.
//!
//! Offsets are committed only after the buckets derived from them are
//! durable (the projector calls [`LogConsumer::commit`] after its store
//! write), never automatically. A crash re-delivers everything after the last
//! commit; the per-row offsets in the read store make those re-deliveries
//! no-ops. Rebalance callbacks run only inside `poll`, when the projector has
//! nothing uncommitted; after one, the projector drops its cached rows.

use crate::topics::{partition_id, split_partition_id, KafkaConfig};
use async_trait::async_trait;
use hindsight_contracts::{ConsumerSource, Delivered, Error, LogConsumer, Position, Result};
use hindsight_schemas::codec;
use hindsight_telemetry as tm;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Notes rebalances for the projector.
pub struct GroupContext {
    changed: Arc<AtomicBool>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions assigned")
            }
            Rebalance::Revoke(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions revoked")
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
        self.changed.store(true, Ordering::SeqCst);
    }
}

type Inner = BaseConsumer<GroupContext>;

pub struct KafkaConsumer {
    inner: Arc<Inner>,
    config: KafkaConfig,
    changed: Arc<AtomicBool>,
    last_lag: Option<(Instant, Vec<(u32, u64)>)>,
}

fn fail(e: KafkaError) -> Error {
    Error::unavailable("kafka", e)
}

impl KafkaConsumer {
    /// Joins `config.group`, subscribed to every topic. A new group starts
    /// from the earliest offsets.
    pub fn join(config: &KafkaConfig) -> Result<Self> {
        let changed = Arc::new(AtomicBool::new(false));
        let mut client = config.client();
        if let Some(id) = &config.instance_id {
            client.set("group.instance.id", id);
        }
        let inner: Inner = client
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .create_with_context(GroupContext {
                changed: changed.clone(),
            })
            .map_err(fail)?;
        let topics = config.topics();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        inner.subscribe(&names).map_err(fail)?;
        Ok(KafkaConsumer {
            inner: Arc::new(inner),
            config: config.clone(),
            changed,
            last_lag: None,
        })
    }

    fn poll_batch(
        inner: &Inner,
        config: &KafkaConfig,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivered>> {
        let mut out = Vec::new();
        let mut timeout = wait;
        while out.len() < max {
            let Some(message) = inner.poll(timeout) else {
                break;
            };
            // After the first message, take only what is already fetched.
            timeout = Duration::ZERO;
            let message = match message {
                Ok(m) => m,
                Err(KafkaError::PartitionEOF(_)) => continue,
                Err(e) => {
                    // The client reconnects by itself; report and try later.
                    tracing::warn!(error = %e, "kafka consumer error");
                    break;
                }
            };
            let Some(topic) = config.index_of(message.topic()) else {
                continue;
            };
            let position = Position {
                partition: partition_id(topic, message.partition()),
                offset: message.offset() as u64,
            };
            match codec::decode(message.payload().unwrap_or_default()) {
                Ok(event) => out.push(Delivered { position, event }),
                Err(e) => {
                    metrics::counter!(tm::PROJECTOR_DECODE_ERRORS).increment(1);
                    tracing::error!(topic = message.topic(), partition = message.partition(), offset = message.offset(),
                        error = %e, "undecodable record; skipped");
                }
            }
        }
        Ok(out)
    }
}

async fn blocking<R: Send + 'static>(f: impl FnOnce() -> Result<R> + Send + 'static) -> Result<R> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::backend("kafka", format!("blocking task failed: {e}")))?
}

#[async_trait]
impl LogConsumer for KafkaConsumer {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivered>> {
        let (inner, config) = (self.inner.clone(), self.config.clone());
        blocking(move || KafkaConsumer::poll_batch(&inner, &config, max, wait)).await
    }

    async fn commit(&mut self, upto: &[Position]) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for p in upto {
            let (topic, partition) = split_partition_id(p.partition);
            tpl.add_partition_offset(
                &self.config.topic(topic),
                partition,
                Offset::Offset(p.offset as i64 + 1),
            )
            .map_err(fail)?;
        }
        let inner = self.inner.clone();
        blocking(move || inner.commit(&tpl, CommitMode::Sync).map_err(fail)).await
    }

    async fn lag(&mut self) -> Result<Vec<(u32, u64)>> {
        // Watermarks are a round trip per partition: at most every second.
        if let Some((at, lag)) = &self.last_lag {
            if at.elapsed() < Duration::from_secs(1) {
                return Ok(lag.clone());
            }
        }
        let (inner, config) = (self.inner.clone(), self.config.clone());
        let lag = blocking(move || {
            let positions = inner.position().map_err(fail)?;
            let mut out = Vec::new();
            for e in positions.elements() {
                let Some(topic) = config.index_of(e.topic()) else {
                    continue;
                };
                let (_, high) = inner
                    .fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(2))
                    .map_err(fail)?;
                let at = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => inner
                        .committed_offsets(
                            {
                                let mut t = TopicPartitionList::new();
                                t.add_partition(e.topic(), e.partition());
                                t
                            },
                            Duration::from_secs(2),
                        )
                        .ok()
                        .and_then(|c| c.elements().first().and_then(|x| x.offset().to_raw()))
                        .unwrap_or(0)
                        .max(0),
                };
                out.push((
                    partition_id(topic, e.partition()),
                    (high - at).max(0) as u64,
                ));
            }
            Ok(out)
        })
        .await?;
        self.last_lag = Some((Instant::now(), lag.clone()));
        Ok(lag)
    }

    fn assignment_changed(&mut self) -> bool {
        self.changed.swap(false, Ordering::SeqCst)
    }
}

/// Joins the group; positions come from the group's committed offsets.
pub struct KafkaSource {
    pub config: KafkaConfig,
}

#[async_trait]
impl ConsumerSource for KafkaSource {
    async fn open(&self) -> Result<Box<dyn LogConsumer>> {
        Ok(Box::new(KafkaConsumer::join(&self.config)?))
    }
}
