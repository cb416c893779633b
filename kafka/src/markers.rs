//! Marker records of keyed appends, and reading one back.
//!
//! Every attempt to append a keyed batch sends, in the batch's transaction,
//! one marker record to `{prefix}.ingest-markers` (key: the idempotency key;
//! value: the body digest and the attempt's owner id). Its position
//! identifies the attempt: once the transaction is committed a
//! `read_committed` reader returns the marker, once it is aborted the
//! reader skips it. So a retry that finds a dead attempt `committing` asks
//! the log itself whether that attempt's batch landed (after fencing the
//! attempt's producer, so that the answer cannot change).

use crate::topics::KafkaConfig;
use hindsight_contracts::{Error, Position, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// One attempt's marker record.
pub(crate) struct MarkerRecord {
    pub key: String,
    pub body_digest: [u8; 32],
    pub owner: u128,
}

impl MarkerRecord {
    /// The record's value: the body digest, then the owner id.
    pub fn payload(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48);
        out.extend_from_slice(&self.body_digest);
        out.extend_from_slice(&self.owner.to_be_bytes());
        out
    }
}

fn fail(e: impl std::fmt::Display) -> Error {
    Error::unavailable("kafka", e.to_string())
}

/// Whether the marker at `at` (of an attempt at `key`) is committed: true
/// when a `read_committed` reader returns it, false when the reader moves
/// past it. Call after fencing the attempt's producer (`init_transactions`
/// under its transactional id), which completes or aborts its transaction.
/// Blocking; fails
/// (`Unavailable`) when it cannot tell within `timeout` (another open
/// transaction holds the partition's stable offset back).
pub(crate) fn landed(
    config: &KafkaConfig,
    at: Position,
    key: &str,
    timeout: Duration,
) -> Result<bool> {
    let topic = config.markers_topic();
    // librdkafka assigns partitions only to a consumer with a group; this
    // one never joins it (no subscribe) and never commits.
    let reader: BaseConsumer = config
        .client()
        .set(
            "group.id",
            format!("{}-ingest-markers", config.topic_prefix),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(fail)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(
        &topic,
        at.partition as i32,
        Offset::Offset(at.offset as i64),
    )
    .map_err(fail)?;
    reader.assign(&tpl).map_err(fail)?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match reader.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) if m.offset() as u64 == at.offset => {
                if m.key() != Some(key.as_bytes()) {
                    return Err(Error::corrupt(
                        "kafka",
                        format!(
                            "the marker of Idempotency-Key {key} at {at:?} belongs to another key"
                        ),
                    ));
                }
                return Ok(true);
            }
            Some(Ok(m)) if m.offset() as u64 > at.offset => return Ok(false),
            Some(Ok(_)) => {}
            Some(Err(KafkaError::PartitionEOF(_))) => {
                // At the end of what is committed: past the marker without
                // returning it means it was aborted; at or before it, an
                // open transaction still holds the stable offset back.
                let position = reader.position().map_err(fail)?;
                let next = position
                    .elements_for_topic(&topic)
                    .iter()
                    .find(|e| e.partition() == at.partition as i32)
                    .and_then(|e| e.offset().to_raw());
                if next.is_some_and(|n| n > at.offset as i64) {
                    return Ok(false);
                }
            }
            Some(Err(e)) => return Err(fail(format!("reading the marker at {at:?}: {e}"))),
        }
    }
    Err(fail(format!(
        "cannot tell within {timeout:?} whether the attempt with the marker at {at:?} committed"
    )))
}
