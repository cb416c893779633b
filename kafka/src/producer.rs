//! The ingest side: [`KafkaLog`] appends batches to the topics.
//!
//! A batch is acknowledged only after the broker confirmed every record
//! (idempotent producer, `acks=all`). Events in flight are bounded: when the
//! broker is slow or down the budget runs out and appends fail fast (ingest
//! answers 503 with `Retry-After`) instead of queueing without bound; records
//! the broker never confirms fail after the delivery timeout, and their batch
//! is not acknowledged.

use crate::topics::KafkaConfig;
use async_trait::async_trait;
use hindsight_contracts::{AppendBatch, AppendOutcome, Error, EventLog, IdempotencyStore, Result};
use hindsight_schemas::codec;
use hindsight_telemetry as tm;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How long an append waits for room in the in-flight budget.
const BUDGET_WAIT: Duration = Duration::from_secs(1);

pub struct KafkaLog {
    /// Replaced after a failed batch: a long-lived idempotent producer was
    /// seen never to recover from a broker restart, while a new one does.
    producer: RwLock<(Arc<FutureProducer>, Instant)>,
    delivery_timeout: Duration,
    config: KafkaConfig,
    budget: Arc<Semaphore>,
    idempotency: Option<Arc<dyn IdempotencyStore>>,
    /// Idempotency keys of batches being appended right now.
    appending: Mutex<HashSet<String>>,
}

impl KafkaLog {
    /// `delivery_timeout`: how long the producer retries a record before the
    /// batch fails.
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
            config,
            budget,
            idempotency,
            appending: Mutex::new(HashSet::new()),
        })
    }

    fn producer(config: &KafkaConfig, delivery_timeout: Duration) -> Result<FutureProducer> {
        config
            .client()
            .set("enable.idempotence", "true")
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
            )
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

    async fn produce(&self, batch: &AppendBatch) -> Result<()> {
        let n = batch.events.len().min(self.config.max_in_flight) as u32;
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
        let producer = self.producer.read().unwrap().0.clone();
        let started = Instant::now();
        let mut deliveries = Vec::with_capacity(batch.events.len());
        let mut buf = Vec::with_capacity(128);
        let mut failure = None;
        for event in &batch.events {
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
        for delivery in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
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
            None => Ok(()),
            Some(reason) => {
                self.renew_producer(&producer);
                Err(Error::unavailable("kafka", reason))
            }
        }
    }
}

#[async_trait]
impl EventLog for KafkaLog {
    async fn ready(&self) -> Result<()> {
        let config = self.config.clone();
        tokio::task::spawn_blocking(move || crate::topics::verify(&config, Duration::from_secs(2)))
            .await
            .map_err(|e| Error::backend("kafka", e.to_string()))?
    }

    async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome> {
        let (Some(idem), Some(store)) = (&batch.idempotency, &self.idempotency) else {
            self.produce(&batch).await?;
            return Ok(AppendOutcome::Appended {
                count: batch.events.len(),
            });
        };
        if let Some(response) = store.seen(&idem.key).await? {
            return Ok(AppendOutcome::Duplicate { response });
        }
        // Two concurrent retries of one batch: the second waits its turn
        // rather than appending the same events again. The guard releases
        // the key on every path out, errors included.
        let _claim = Appending::claim(&self.appending, &idem.key).ok_or_else(|| {
            Error::unavailable(
                "kafka",
                "the same Idempotency-Key is being appended right now",
            )
        })?;
        self.produce(&batch).await?;
        store.record(&idem.key, idem.response.clone()).await?;
        Ok(AppendOutcome::Appended {
            count: batch.events.len(),
        })
    }
}

/// An idempotency key being appended by this process, released on drop.
struct Appending<'a> {
    set: &'a Mutex<HashSet<String>>,
    key: &'a str,
}

impl<'a> Appending<'a> {
    fn claim(set: &'a Mutex<HashSet<String>>, key: &'a str) -> Option<Self> {
        set.lock()
            .unwrap()
            .insert(key.to_string())
            .then_some(Appending { set, key })
    }
}

impl Drop for Appending<'_> {
    fn drop(&mut self) {
        self.set.lock().unwrap().remove(self.key);
    }
}
