//! The event log: ingest appends, projectors consume.
//!
//! The raw events in the log are the source of truth; every read table can
//! be rebuilt from them (`docs/contracts.md`, "The event log").

use crate::Result;
use async_trait::async_trait;
use hindsight_schemas::Event;
use std::time::Duration;

/// Where an event sits in the log: a partition and an offset in it. The
/// embedded log has a single partition, 0; Kafka numbers each (topic,
/// partition) pair it consumes (see `hindsight-kafka`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    pub partition: u32,
    pub offset: u64,
}

/// An event as the log delivers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    pub position: Position,
    pub event: Event,
}

/// A batch to append, with an optional idempotency key.
#[derive(Debug, Default)]
pub struct AppendBatch {
    pub events: Vec<Event>,
    pub idempotency: Option<Idempotency>,
}

#[derive(Debug, Clone)]
pub struct Idempotency {
    pub key: String,
    /// What ingest answered for the first append; returned on retries.
    pub response: Vec<u8>,
}

#[derive(Debug, PartialEq)]
pub enum AppendOutcome {
    /// Durably appended.
    Appended { count: usize },
    /// The idempotency key was seen before: nothing appended; here is the
    /// response of the first append.
    Duplicate { response: Vec<u8> },
}

/// The write side of the log.
///
/// Contract:
/// - **Durable before acknowledged**: `append` returns `Ok` only once every
///   event of the batch is durable (fsynced, or confirmed by every in-sync
///   replica). On `Err` the batch may be partly appended; the caller retries
///   it under the same idempotency key or not at all.
/// - **Ordered per key and stream**: events with one `Event::key()` (market
///   id) that feed the same tables — price ticks, book snapshots, metrics
///   samples, catalog records — are delivered in the order they were
///   appended. Nothing orders a market's ticks against its snapshots: the
///   Kafka log keeps one topic per stream, and every read-table row is fed
///   by one stream only.
/// - **Dense positions**: within a partition, consecutive events have
///   consecutive offsets (the projector's lag and replay checks count on
///   it).
/// - **At most once per idempotency key**: a batch appended under a key seen
///   in the last 24 h is not appended again; `AppendOutcome::Duplicate`
///   carries the first append's response.
/// - Failures that may pass are `ErrorKind::Unavailable`.
#[async_trait]
pub trait EventLog: Send + Sync {
    async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome>;

    /// `Ok` when the log can take appends now (readiness probes).
    async fn ready(&self) -> Result<()>;
}

/// Idempotency keys for a log that cannot record them atomically with an
/// append (Kafka): what ingest answered for each key, for 24 h.
///
/// Contract: `seen` returns the response recorded by `record` for the same
/// key within the last 24 h, from any process sharing the store.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    async fn seen(&self, key: &str) -> Result<Option<Vec<u8>>>;
    async fn record(&self, key: &str, response: Vec<u8>) -> Result<()>;
}

/// The read side of the log: one projector's view of its partitions.
///
/// Contract:
/// - `poll` delivers events of each partition in log order, every event
///   after the consumer's starting position exactly once per consumer
///   (re-delivery happens only across consumers: after a crash, a restart or
///   a rebalance, from the last committed position).
/// - `commit(upto)` records that everything up to and including `upto` is
///   durable in the read store; a new consumer of the same group starts
///   after it.
/// - `assignment_changed`, asked after each `poll`, returns true once when
///   the set of partitions this consumer owns changed during that poll or
///   before it — so before the caller uses any event of the new assignment;
///   the projector must then drop every cached row, since rows of a
///   partition it lost may since have been written by another projector. A
///   consumer alone in its group changes assignment at most once (its
///   first).
/// - `lag` counts, per owned partition, the events after the consumer's
///   position: zero once it has polled everything appended.
#[async_trait]
pub trait LogConsumer: Send {
    /// Up to `max` events after the consumer's position. Waits up to `wait`
    /// when none are there; may return empty.
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivered>>;

    async fn commit(&mut self, upto: &[Position]) -> Result<()>;

    /// Events in the log beyond the consumer's position, per owned partition.
    /// Empty while no partition is assigned.
    async fn lag(&mut self) -> Result<Vec<(u32, u64)>>;

    fn assignment_changed(&mut self) -> bool;
}

/// Opens a consumer positioned after the last durably projected event
/// (the projector reopens one after any failed step).
#[async_trait]
pub trait ConsumerSource: Send + Sync {
    async fn open(&self) -> Result<Box<dyn LogConsumer>>;
}

/// A shared log is a log: wrappers (metrics, faults) take either.
#[async_trait]
impl<T: EventLog + ?Sized> EventLog for std::sync::Arc<T> {
    async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome> {
        (**self).append(batch).await
    }

    async fn ready(&self) -> Result<()> {
        (**self).ready().await
    }
}
