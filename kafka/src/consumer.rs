//! The projector side: [`KafkaConsumer`], one member of the projectors'
//! consumer group.
//!
//! Where a partition is read from when it is assigned is the read store's
//! consumed position (`ProjectionStore::committed`), not the group's
//! committed offset: the store may lose the last writes it acknowledged (a
//! single Cassandra node SIGKILLed loses the ~100 ms after its last
//! commit-log sync marker, and the positions with them, since they are
//! written last), while the group's offset — committed after the store
//! acknowledged — would skip those events for good. Group offsets are still
//! committed after every durable step, for lag monitoring and for stores
//! without positions. The per-row offsets in the read store make the
//! re-deliveries no-ops. Rebalance callbacks run only inside `poll`, when the projector has
//! written and committed everything it returned before; records taken from a
//! revoked partition earlier in the same batch are dropped (redelivered to
//! the partition's next owner), and [`LogConsumer::assignment_changed`] is
//! true before any record of a new assignment is returned, so the projector
//! drops its cached rows first.
//!
//! Consumers read committed records only (`isolation.level=read_committed`):
//! keyed batches are Kafka transactions, and the records of an aborted
//! attempt are never delivered. The marker topic of keyed appends is not
//! subscribed.

use crate::topics::{partition_id, split_partition_id, KafkaConfig};
use async_trait::async_trait;
use hindsight_contracts::{
    ConsumerSource, Delivered, Error, LogConsumer, Position, ProjectionStore, Result,
};
use hindsight_schemas::codec;
use hindsight_telemetry as tm;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Notes rebalances for the projector.
///
/// Both callbacks run on the thread calling `poll`, inside it (the classic
/// group protocol with the eager assignor, rdkafka's default: every
/// rebalance revokes every partition, then assigns anew from the committed
/// offsets).
pub struct GroupContext {
    changed: Arc<AtomicBool>,
    /// Where assigned partitions start: the store's consumed positions.
    store: Option<(Arc<dyn ProjectionStore>, tokio::runtime::Handle)>,
    /// Set when the store could not say where to start: `poll` fails, and
    /// the projector joins again.
    start_failed: Arc<Mutex<Option<String>>>,
    /// Partitions revoked since `poll_batch` last looked: records already
    /// taken from them in the current batch must not be returned.
    revoked: Arc<Mutex<Vec<(String, i32)>>>,
    config: KafkaConfig,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let (Rebalance::Assign(tpl), Some((store, runtime))) = (rebalance, &self.store) {
            // Runs on the blocking thread inside `poll`, never on a runtime
            // worker, so waiting on the store here is allowed.
            match runtime.block_on(store.committed()) {
                Ok(positions) => {
                    for e in tpl.elements() {
                        let id = self
                            .config
                            .index_of(e.topic())
                            .map(|t| partition_id(t, e.partition()));
                        let Some(pos) = positions.iter().find(|p| Some(p.partition) == id) else {
                            continue;
                        };
                        if let Some(mut e) = tpl.find_partition(e.topic(), e.partition()) {
                            if let Err(err) = e.set_offset(Offset::Offset(pos.offset as i64)) {
                                *self.start_failed.lock().unwrap() = Some(err.to_string());
                            }
                        }
                    }
                }
                Err(e) => *self.start_failed.lock().unwrap() = Some(e.to_string()),
            }
        }
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut revoked = self.revoked.lock().unwrap();
            for e in tpl.elements() {
                revoked.push((e.topic().to_string(), e.partition()));
            }
        }
        // Set before the new assignment is applied, so no record of it can
        // be returned before `assignment_changed` says so.
        self.changed.store(true, Ordering::SeqCst);
    }

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
    inner: Closing,
    config: KafkaConfig,
    changed: Arc<AtomicBool>,
    revoked: Arc<Mutex<Vec<(String, i32)>>>,
    start_failed: Arc<Mutex<Option<String>>>,
    /// A client of its own for the end offsets `lag` needs: on the group
    /// consumer's connection each query waits behind the in-flight fetch
    /// (up to `fetch.wait.max.ms` per partition, seconds per call); here it
    /// is a round trip of a few milliseconds.
    watermarks: Arc<BaseConsumer>,
    last_lag: Option<(Instant, Vec<(u32, u64)>)>,
}

/// The group consumer, closed on a blocking thread when the last handle
/// drops. Closing leaves the group, and librdkafka serves the rebalance
/// callbacks still queued as it does; the assignment callback waits on the
/// store (`GroupContext::pre_rebalance`), which a runtime worker must not
/// do — and a projector drops its consumer on a worker after a failed step.
struct Closing(Option<Arc<Inner>>);

impl std::ops::Deref for Closing {
    type Target = Arc<Inner>;

    fn deref(&self) -> &Arc<Inner> {
        self.0.as_ref().expect("taken only when dropped")
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let (Some(inner), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn_blocking(move || drop(inner));
        }
    }
}

fn fail(e: KafkaError) -> Error {
    Error::unavailable("kafka", e)
}

impl KafkaConsumer {
    /// Joins `config.group`, subscribed to every topic. Assigned partitions
    /// start at `store`'s consumed positions (see the module doc); without a
    /// store, or for a partition the store has no position for, at the
    /// group's committed offset, else the earliest. Call from a runtime.
    pub fn join(config: &KafkaConfig, store: Option<Arc<dyn ProjectionStore>>) -> Result<Self> {
        let changed = Arc::new(AtomicBool::new(false));
        let revoked = Arc::new(Mutex::new(Vec::new()));
        let start_failed = Arc::new(Mutex::new(None));
        let store = store.map(|s| (s, tokio::runtime::Handle::current()));
        let mut client = config.client();
        if let Some(id) = &config.instance_id {
            client.set("group.instance.id", id);
        }
        let inner: Inner = client
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            // librdkafka's default, set explicitly because exactly-once
            // depends on it: a keyed batch is a transaction, and an attempt
            // that died or was fenced is aborted; only committed records
            // may be projected.
            .set("isolation.level", "read_committed")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .create_with_context(GroupContext {
                changed: changed.clone(),
                store,
                start_failed: start_failed.clone(),
                revoked: revoked.clone(),
                config: config.clone(),
            })
            .map_err(fail)?;
        let topics = config.topics();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        inner.subscribe(&names).map_err(fail)?;
        let watermarks: BaseConsumer = config.client().create().map_err(fail)?;
        Ok(KafkaConsumer {
            inner: Closing(Some(Arc::new(inner))),
            config: config.clone(),
            changed,
            revoked,
            start_failed,
            watermarks: Arc::new(watermarks),
            last_lag: None,
        })
    }

    /// The partitions this member holds now, as log partition ids.
    pub fn assignment(&self) -> Result<Vec<u32>> {
        let tpl = self.inner.assignment().map_err(fail)?;
        Ok(tpl
            .elements()
            .iter()
            .filter_map(|e| {
                let topic = self.config.index_of(e.topic())?;
                Some(partition_id(topic, e.partition()))
            })
            .collect())
    }

    /// Up to `max` records. A rebalance inside the batch drops the records
    /// already taken from the revoked partitions: they are uncommitted, so
    /// their new owner (or this member, re-assigned from the committed
    /// offset) delivers them again, and projecting them here would race
    /// with that owner's writes to the same rows.
    fn poll_batch(
        inner: &Inner,
        config: &KafkaConfig,
        revoked: &Mutex<Vec<(String, i32)>>,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivered>> {
        let mut out: Vec<Delivered> = Vec::new();
        let mut timeout = wait;
        while out.len() < max {
            let polled = inner.poll(timeout);
            let gone = std::mem::take(&mut *revoked.lock().unwrap());
            if !gone.is_empty() {
                let gone: Vec<u32> = gone
                    .iter()
                    .filter_map(|(t, p)| Some(partition_id(config.index_of(t)?, *p)))
                    .collect();
                out.retain(|d| !gone.contains(&d.position.partition));
            }
            let Some(message) = polled else {
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
        let (inner, config, revoked) = (
            self.inner.clone(),
            self.config.clone(),
            self.revoked.clone(),
        );
        let batch =
            blocking(move || KafkaConsumer::poll_batch(&inner, &config, &revoked, max, wait))
                .await?;
        if let Some(e) = self.start_failed.lock().unwrap().take() {
            // Partitions were assigned at the group's offsets instead of the
            // store's positions: nothing of this assignment may be projected.
            return Err(Error::unavailable(
                "kafka",
                format!("cannot read the store's consumed positions for new partitions: {e}"),
            ));
        }
        Ok(batch)
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
        let (inner, watermarks, config) = (
            self.inner.clone(),
            self.watermarks.clone(),
            self.config.clone(),
        );
        let lag = blocking(move || {
            let positions = inner.position().map_err(fail)?;
            let mut out = Vec::new();
            for e in positions.elements() {
                let Some(topic) = config.index_of(e.topic()) else {
                    continue;
                };
                let (_, high) = watermarks
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

    /// A rebalance inside `poll` may give a partition to another member.
    fn reassigns(&self) -> bool {
        true
    }
}

/// Joins the group; assigned partitions start at the store's consumed
/// positions.
pub struct KafkaSource {
    pub config: KafkaConfig,
    /// The store the projector writes (its positions say where to start).
    pub store: Option<Arc<dyn ProjectionStore>>,
}

#[async_trait]
impl ConsumerSource for KafkaSource {
    async fn open(&self) -> Result<Box<dyn LogConsumer>> {
        Ok(Box::new(KafkaConsumer::join(
            &self.config,
            self.store.clone(),
        )?))
    }
}
