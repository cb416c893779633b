//! The Kafka event log.
//!
//! - [`topics`]: one topic per data kind, their settings, `kafka init`.
//! - [`producer`]: [`KafkaLog`], the ingest side: idempotent, `acks=all`,
//!   acknowledged only once every record of a batch is confirmed, with a
//!   bounded in-flight budget (503 rather than unbounded memory).
//! - [`keyed`]: batches with an idempotency key, as Kafka transactions under
//!   a claim on the key, exactly once across ingest replicas; [`markers`]:
//!   their marker records.
//! - [`consumer`]: [`KafkaConsumer`], the projector side: a consumer group
//!   whose offsets are committed only after the buckets are durable.
//!
//! Each read-table row is fed by exactly one topic-partition (prices rows by
//! the prices topic, keyed by market id), which the projector's per-row
//! offset check relies on for replay safety without transactions.

pub mod consumer;
pub mod keyed;
pub mod markers;
pub mod producer;
pub mod topics;

pub use consumer::{KafkaConsumer, KafkaSource};
pub use producer::KafkaLog;
pub use topics::KafkaConfig;
