//! The ingest side: [`KafkaLog`] appends batches to the topics.
//!
//! A batch is acknowledged only after the broker confirmed every record
//! (`acks=all`). Events in flight are bounded: when the broker is slow or
//! down the budget runs out and appends fail fast (ingest answers 503 with
//! `Retry-After`) instead of queueing without bound; records the broker
//! never confirms fail after the delivery timeout, and their batch is not
//! acknowledged.
//!
//! A batch without an idempotency key goes through one long-lived
//! idempotent producer (the fast path). A batch with a key is a Kafka
//! transaction under a claim on the key: see [`crate::keyed`].

use crate::keyed::TxnPool;
use crate::markers::MarkerRecord;
use crate::topics::KafkaConfig;
use async_trait::async_trait;
use hindsight_contracts::{
    AppendBatch, AppendOutcome, Error, EventLog, IdempotencyStore, Position, Result,
};
use hindsight_schemas::{codec, Event};
use hindsight_telemetry as tm;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How long an append waits for room in the in-flight budget.
const BUDGET_WAIT: Duration = Duration::from_secs(1);

pub struct KafkaLog {
    /// Replaced after a failed batch: a long-lived idempotent producer was
    /// seen never to recover from a broker restart, while a new one does.
    producer: RwLock<(Arc<FutureProducer>, Instant)>,
    pub(crate) delivery_timeout: Duration,
    pub(crate) config: KafkaConfig,
    budget: Arc<Semaphore>,
    /// Claims of idempotency keys; keyed batches are refused without one.
    pub(crate) idempotency: Option<Arc<dyn IdempotencyStore>>,
    /// The transactional producers of keyed batches.
    pub(crate) txns: TxnPool,
}

impl KafkaLog {
    /// `delivery_timeout`: how long the producer retries a record before the
    /// batch fails. `idempotency`: where keyed batches claim their key
    /// (required for keyed batches; shared by every ingest replica).
    pub fn new(
        config: KafkaConfig,
        idempotency: Option<Arc<dyn IdempotencyStore>>,
        delivery_timeout: Duration,
    ) -> Result<Self> {
        let producer = RwLock::new((
            Arc::new(Self::producer(&config, delivery_timeout)?),
            Instant::now(),
        ));
        let budget = Arc::new(Semaphore::new(config.max_in_flight));
        Ok(KafkaLog {
            producer,
            delivery_timeout,
            txns: TxnPool::new(&config.topic_prefix)?,
            config,
            budget,
            idempotency,
        })
    }

    /// Settings every producer of ingest shares: `acks=all`, idempotence,
    /// lz4, the delivery timeout and room for the in-flight budget.
    pub(crate) fn producer_settings(
        config: &KafkaConfig,
        delivery_timeout: Duration,
    ) -> ClientConfig {
        let mut c = config.client();
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", "lz4")
            .set("linger.ms", "5")
            .set("batch.num.messages", "10000")
            .set(
                "message.timeout.ms",
                delivery_timeout.as_millis().to_string(),
            )
            .set(
                "queue.buffering.max.messages",
                (config.max_in_flight + 1000).to_string(),
            );
        c
    }

    fn producer(config: &KafkaConfig, delivery_timeout: Duration) -> Result<FutureProducer> {
        Self::producer_settings(config, delivery_timeout)
            .create()
            .map_err(|e| Error::unavailable("kafka", format!("producer: {e}")))
    }

    /// Starts a new producer session after a failure, at most once per
    /// delivery timeout (so an outage does not churn producers).
    fn renew_producer(&self, failed: &Arc<FutureProducer>) {
        let mut current = self.producer.write().unwrap();
        if !Arc::ptr_eq(&current.0, failed) || current.1.elapsed() < self.delivery_timeout {
            return;
        }
        match Self::producer(&self.config, self.delivery_timeout) {
            Ok(p) => {
                tracing::warn!("kafka producer replaced after a failed batch");
                *current = (Arc::new(p), Instant::now());
            }
            Err(e) => tracing::error!(error = %e, "cannot create a new kafka producer"),
        }
    }

    /// Waits until every queued record is delivered (at shutdown).
    pub fn flush(&self, timeout: Duration) {
        let producer = self.producer.read().unwrap().0.clone();
        let _ = producer.flush(timeout);
    }

    /// Sends `events`, then `marker` if given, on `producer` within the
    /// in-flight budget, and waits until the broker confirmed every record.
    /// Returns where the marker landed.
    pub(crate) async fn send(
        &self,
        producer: &FutureProducer,
        events: &[Event],
        marker: Option<&MarkerRecord>,
    ) -> Result<Option<Position>> {
        let n = events.len().min(self.config.max_in_flight) as u32;
        let permits = match tokio::time::timeout(
            BUDGET_WAIT,
            self.budget.clone().acquire_many_owned(n),
        )
        .await
        {
            Ok(Ok(p)) => p,
            _ => {
                metrics::counter!(tm::INGEST_BACKPRESSURE).increment(1);
                return Err(Error::unavailable(
                    "kafka",
                    "in-flight budget exhausted; the broker is slow or down",
                ));
            }
        };
        metrics::gauge!(tm::INGEST_IN_FLIGHT).increment(n as f64);
        let started = Instant::now();
        let mut deliveries = Vec::with_capacity(events.len());
        let mut buf = Vec::with_capacity(128);
        let mut failure = None;
        for event in events {
            buf.clear();
            codec::encode_into(event, &mut buf);
            let topic = self.config.topic(KafkaConfig::kind_index(event.kind()));
            let record = FutureRecord::to(&topic).key(event.key()).payload(&buf);
            match producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((e, _)) => {
                    failure = Some(format!("enqueue: {e}"));
                    break;
                }
            }
        }
        let mut marker_delivery = None;
        if let (None, Some(marker)) = (&failure, marker) {
            let topic = self.config.markers_topic();
            let payload = marker.payload();
            let record = FutureRecord::to(&topic).key(&marker.key).payload(&payload);
            match producer.send_result(record) {
                Ok(delivery) => marker_delivery = Some(delivery),
                Err((e, _)) => failure = Some(format!("enqueue the marker: {e}")),
            }
        }
        let mut marker_at = None;
        let last = deliveries.len();
        for (i, delivery) in deliveries.into_iter().chain(marker_delivery).enumerate() {
            match delivery.await {
                Ok(Ok(d)) => {
                    if i == last {
                        marker_at = Some(Position {
                            partition: d.partition as u32,
                            offset: d.offset as u64,
                        });
                    }
                }
                Ok(Err((e, _))) => {
                    metrics::counter!(tm::KAFKA_DELIVERY_ERRORS, "reason" => "not_confirmed")
                        .increment(1);
                    failure.get_or_insert_with(|| format!("delivery: {e}"));
                }
                Err(_) => {
                    metrics::counter!(tm::KAFKA_DELIVERY_ERRORS, "reason" => "cancelled")
                        .increment(1);
                    failure.get_or_insert_with(|| "delivery cancelled".into());
                }
            }
        }
        metrics::gauge!(tm::INGEST_IN_FLIGHT).decrement(n as f64);
        drop(permits);
        metrics::histogram!(tm::LOG_APPEND_SECONDS).record(started.elapsed().as_secs_f64());
        match failure {
            None => Ok(marker_at),
            Some(reason) => Err(Error::unavailable("kafka", reason)),
        }
    }

    /// The fast path of a batch without a key: the shared idempotent
    /// producer, renewed after a failure.
    async fn produce(&self, events: &[Event]) -> Result<()> {
        let producer = self.producer.read().unwrap().0.clone();
        let sent = self.send(&producer, events, None).await;
        if sent.is_err() {
            self.renew_producer(&producer);
        }
        sent.map(|_| ())
    }
}

#[async_trait]
impl EventLog for KafkaLog {
    async fn ready(&self) -> Result<()> {
        let config = self.config.clone();
        let keyed = self.idempotency.is_some();
        tokio::task::spawn_blocking(move || {
            crate::topics::verify(&config, Duration::from_secs(2))?;
            if keyed {
                crate::topics::verify_markers(&config, Duration::from_secs(2))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::backend("kafka", e.to_string()))?
    }

    async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome> {
        match (&batch.idempotency, &self.idempotency) {
            (None, _) => {
                self.produce(&batch.events).await?;
                Ok(AppendOutcome::Appended {
                    count: batch.events.len(),
                })
            }
            (Some(idem), Some(store)) => {
                self.append_keyed(store.as_ref(), &batch.events, idem).await
            }
            (Some(idem), None) => Err(Error::backend(
                "kafka",
                format!(
                    "batch under Idempotency-Key {} but this log has no idempotency store",
                    idem.key
                ),
            )),
        }
    }
}
