//! The event log: ingest appends, projectors consume.
//!
//! The raw events in the log are the source of truth; every read table can
//! be rebuilt from them (`docs/contracts.md`, "The event log").

use crate::Result;
use async_trait::async_trait;
use hindsight_schemas::Event;
use std::sync::Arc;
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

/// A batch to append, with an optional idempotency key. Its events are
/// shared: a caller that may have to append them again (a backfill told
/// `Busy`) keeps them without copying every event's strings. They are
/// the `Vec` validation filled, shared as it is: an `Arc<[Event]>` would
/// copy every event into a new allocation once more.
#[derive(Debug, Default)]
pub struct AppendBatch {
    pub events: Arc<Vec<Event>>,
    pub idempotency: Option<Idempotency>,
}

/// What makes a batch safe to retry: the key the client chose, the digest
/// of the body it sent, and what ingest answers for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: String,
    /// The digest of the batch's body (ingest: the request body after its
    /// `Content-Encoding` is undone; backfill: the chunk's lines), as
    /// [`Idempotency::for_body`] takes it. A retry carries the same digest;
    /// another batch under the same key does not, and gets
    /// [`AppendOutcome::Conflict`] instead of a silent replay. (Stored in
    /// columns still named `body_sha256`, after what builds before
    /// 2026-11-27 kept there: see [`append_body`].)
    pub body_digest: [u8; 32],
    /// What ingest answered for the first append; returned on retries.
    pub response: Vec<u8>,
}

/// The second half of every digest [`Idempotency::for_body`] takes, which
/// tells it apart from a SHA-256 kept by an earlier build when the
/// stored bytes are read by hand.
const DIGEST_TAG: [u8; 16] = *b"hindsight:xxh3v1";

impl Idempotency {
    /// `key` for a batch whose body is `body`: the digest is the body's
    /// XXH3-128 followed by [`DIGEST_TAG`].
    ///
    /// Why not a cryptographic hash: the digest only tells a retry from
    /// another batch sent by mistake under the same key, and it is never
    /// shown, so nobody can aim a body at another's digest. SHA-256 (what
    /// earlier builds took) was an eighth of a backfill's validating
    /// thread on the dense `shapes` file; XXH3 reads the same bytes some
    /// ten times faster (docs/DESIGN.md, "A backfill is bound by the core
    /// that reads and parses").
    pub fn for_body(key: impl Into<String>, body: &[u8], response: Vec<u8>) -> Self {
        let mut body_digest = [0u8; 32];
        body_digest[..16].copy_from_slice(&twox_hash::XxHash3_128::oneshot(body).to_le_bytes());
        body_digest[16..].copy_from_slice(&DIGEST_TAG);
        Idempotency {
            key: key.into(),
            body_digest,
            response,
        }
    }

    /// The same key and response under the digest builds before
    /// 2026-11-27 kept: the body's SHA-256 ([`append_body`] asks with it).
    fn with_sha256_of(&self, body: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        Idempotency {
            body_digest: Sha256::digest(body).into(),
            ..self.clone()
        }
    }
}

/// Appends `batch`, whose key [`Idempotency::for_body`] made from `body`:
/// what ingest and backfill call.
///
/// A key recorded by a build before 2026-11-27 holds the body's SHA-256,
/// and every retry of its batch would look like another body: so a
/// [`AppendOutcome::Conflict`] is asked again, once, under that digest.
/// A retry of the earlier build's batch is then a `Duplicate`, another
/// body still a `Conflict`; keys live 24 h, so after a day past an upgrade
/// the second ask only ever confirms a conflict.
pub async fn append_body(
    log: &dyn EventLog,
    batch: AppendBatch,
    body: &[u8],
) -> Result<AppendOutcome> {
    let Some(idempotency) = batch.idempotency.clone() else {
        return log.append(batch).await;
    };
    let events = batch.events.clone();
    match log.append(batch).await? {
        AppendOutcome::Conflict => {
            let again = AppendBatch {
                events,
                idempotency: Some(idempotency.with_sha256_of(body)),
            };
            log.append(again).await
        }
        outcome => Ok(outcome),
    }
}

#[derive(Debug, PartialEq)]
pub enum AppendOutcome {
    /// Durably appended.
    Appended { count: usize },
    /// The idempotency key was seen before with the same body: nothing
    /// appended; here is the response of the first append.
    Duplicate { response: Vec<u8> },
    /// The idempotency key was used within the last 24 h for a batch with
    /// another body: nothing of this batch appended (ingest answers 409).
    Conflict,
    /// Another request is appending under the same key right now (in this
    /// process or another): nothing appended by this call. Retry after
    /// `retry_after`, when that request has finished or its lease ran out
    /// (ingest answers 503 with `Retry-After`). Only logs that keep their
    /// keys in an [`IdempotencyStore`] answer it.
    Busy { retry_after: Duration },
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
/// - **Increasing positions**: within a partition, each event has a greater
///   offset than the one before (the projector's replay check counts on
///   it). Batches appended without an idempotency key get consecutive
///   offsets; Kafka leaves a gap after a keyed batch (its transaction's
///   commit marker, and the records of an aborted attempt, which no consumer
///   delivers).
/// - **At most once per idempotency key**: a batch appended under a key seen
///   in the last 24 h is not appended again. With the same body digest the
///   outcome is `Duplicate`, carrying the first append's response; with
///   another digest it is `Conflict`. Whichever process takes a retry, and
///   whenever the first attempt died, an acknowledged batch is in the log
///   exactly once.
/// - Failures that may pass are `ErrorKind::Unavailable`.
#[async_trait]
pub trait EventLog: Send + Sync {
    async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome>;

    /// `Ok` when the log can take appends now (readiness probes).
    async fn ready(&self) -> Result<()>;
}

/// One attempt's hold on an idempotency key, as [`IdempotencyStore::claim`]
/// granted it; what `committing`, `done` and `release` need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub key: String,
    /// The attempt's owner id (random, one per attempt): a takeover gives
    /// the key another owner, and the previous owner's calls stop applying.
    pub owner: u128,
    /// When the key is forgotten (its first claim plus 24 h), in ms since
    /// the Unix epoch: later writes expire with the first.
    pub expires_at: i64,
}

/// Where an attempt at a keyed batch left its mark in the log, recorded at
/// `committing`: the position of its marker record, which a committed read
/// returns once the attempt's batch is visible, and the log's id of the
/// writer that appended it, which a later attempt fences before reading the
/// marker (Kafka: the producer's `transactional.id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub position: Position,
    pub writer: String,
}

/// What [`IdempotencyStore::claim`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This attempt holds the key: no attempt before it reached
    /// `committing`, and any earlier holder's lease ran out. Append.
    Owned(Hold),
    /// This attempt took the key over from one whose lease ran out after it
    /// marked `committing` with `marker`: whether that attempt's batch is in
    /// the log is the log's to say (once its writer is fenced, the marker
    /// record is visible to committed reads or it never will be). If it is,
    /// the answer is `response`.
    TakenOver {
        hold: Hold,
        marker: Marker,
        response: Vec<u8>,
    },
    /// The key's batch is in the log: replay its first response.
    Done { response: Vec<u8> },
    /// The key was claimed within 24 h for another body digest.
    Conflict,
    /// Another attempt holds the key and its lease runs for `retry_after`.
    Busy { retry_after: Duration },
}

/// Idempotency keys for a log that cannot record them atomically with an
/// append (Kafka): a claim on each key, shared by every ingest process, so
/// that a retry reaching any of them neither appends twice nor loses the
/// batch. The log appends a keyed batch as `claim` → append (not yet
/// visible) → `committing(marker)` → make visible → `done`; see
/// `docs/design/idempotency.md`.
///
/// Contract:
/// - **Linearizable claims**: of any claims of one key, by any processes
///   sharing the store, at most one attempt holds the key at a time;
///   concurrent claims of a free key grant exactly one `Owned`.
/// - **The body decides**: a key is remembered for 24 h from its first
///   claim; within them a claim with another digest is `Conflict` whatever
///   the key's state, and nothing changes.
/// - **States**: claimed (pending) → `committing` (with the attempt's
///   [`Marker`]) → `done`. A claim with the same digest answers
///   `Done` (with the first claim's response) once done; `Busy` while the
///   holder's lease runs; after the lease, takes the key over: `Owned` if
///   the holder had not reached `committing`, else `TakenOver` with its
///   marker.
/// - **Only the holder moves the key**: `committing`, `done` and `release`
///   apply only while `hold.owner` holds the key, and say whether they
///   did; after a takeover the previous holder's calls change nothing.
/// - `release` ends the holder's lease at once (after a failed attempt),
///   keeping the state: the next claim takes over without waiting.
/// - Failures that may pass are `ErrorKind::Unavailable`; a claim whose
///   answer was lost leaves a hold whose lease runs out.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Claims `key` for the attempt `owner` (random, never reused) with this
    /// body digest, storing `response` as the answer to replay if the key
    /// is new; the attempt's lease is `lease` from now. A claim repeated by
    /// the same owner (a lost answer retried) is granted again.
    async fn claim(
        &self,
        key: &str,
        body_digest: &[u8; 32],
        owner: u128,
        response: &[u8],
        lease: Duration,
    ) -> Result<Claim>;

    /// Records that the holder's batch is in the log, not yet visible, with
    /// its `marker`. False when `hold` no longer holds the key.
    async fn committing(&self, hold: &Hold, marker: &Marker) -> Result<bool>;

    /// Records that the holder's batch is visible in the log. False when
    /// `hold` no longer holds the key.
    async fn done(&self, hold: &Hold) -> Result<bool>;

    /// Ends the holder's lease now (its attempt failed); no-op when `hold`
    /// no longer holds the key.
    async fn release(&self, hold: &Hold) -> Result<()>;
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
/// - `reassigns` is true of a consumer whose `poll` may hand a partition
///   to another consumer (a consumer-group rebalance). The new owner starts
///   from the store's consumed positions, so the caller must have every
///   write of the events it was given durable before it polls such a
///   consumer again: a write landing after the new owner's would set its
///   rows and positions back.
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

    /// Whether `poll` may hand partitions to another consumer (see the
    /// contract above). A consumer alone with its partitions never does.
    fn reassigns(&self) -> bool {
        false
    }
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
