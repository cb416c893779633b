//! The event log interface.
//!
//! The raw events in the log are the source of truth; every read table can be
//! rebuilt from them. Two guarantees matter above all:
//! - [`EventLog::append`] returns only once the log durably holds the whole
//!   batch, so ingest never acknowledges what could still be lost;
//! - a [`LogConsumer`] delivers events of a partition in log order, each with
//!   its [`Position`], which the projector uses for replay safety.

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

/// A batch to append, with an optional idempotency key: a batch retried under
/// a key already seen is not appended again, and the response recorded with
/// the first append is returned instead.
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

#[async_trait]
pub trait EventLog: Send + Sync {
    /// Appends the batch; returns once every event is durable.
    async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome>;

    /// Whether the log can take appends now (for readiness probes).
    async fn ready(&self) -> Result<()>;
}

#[async_trait]
pub trait LogConsumer: Send {
    /// Up to `max` events after the consumer's position, in log order per
    /// partition. Waits up to `wait` when none are there; may return empty.
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivered>>;

    /// The projector has made everything up to and including `upto` durable
    /// in the read store. Backends whose position lives in the read store
    /// (embedded) have nothing to do here; Kafka commits group offsets.
    async fn commit(&mut self, upto: &[Position]) -> Result<()>;

    /// Events in the log beyond the consumer's position, per partition,
    /// when known.
    async fn lag(&mut self) -> Result<Vec<(u32, u64)>>;

    /// True once after this consumer's set of partitions changed (a
    /// consumer-group rebalance): rows cached for partitions it may no
    /// longer own must be dropped, since another projector now writes them.
    fn assignment_changed(&mut self) -> bool {
        false
    }
}
