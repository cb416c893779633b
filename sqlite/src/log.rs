//! The embedded event log: batches of events in `log.db`.
//!
//! One row per appended batch (`first_offset`, `count`, `codec`, `payload`),
//! where the payload is the batch's events, packed ([`packed`]: price ticks
//! by their ids' index in the batch, other events as their envelopes) and
//! compressed as `codec` says ([`Codec`]; rows written before packing hold
//! length-prefixed envelopes, and stay readable). Offsets are dense: event
//! `i` of a batch has offset `first_offset + i`. A row per batch rather than
//! per event makes an append one small B-tree insert and one fsync, whatever
//! the batch size.
//!
//! The log is kept for years (it is the source of truth every table is
//! rebuilt from), so it is the largest file of a data directory: packing
//! names a tick's ids once per batch, and zstd at level 3 shrinks what is
//! left.
//!
//! A batch's idempotency key, its body digest and its response are written
//! in the same transaction as the batch: a key is either recorded with its
//! events or not at all, so no claim protocol is needed here (that is
//! [`crate::IdempotencyFile`]'s, for Kafka). The same key with another
//! digest within 24 h is a `Conflict`.

use crate::db::{blocking, open, Durability};
use crate::{CResult, Error, Result};
use async_trait::async_trait;
use hindsight_contracts::{
    AppendBatch, AppendOutcome, ConsumerSource, Delivered, EventLog, LogConsumer, Position,
    ProjectionStore,
};
use hindsight_schemas::{codec, Timestamp};
use hindsight_telemetry as tm;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

mod packed;
mod recent;
use recent::Recent;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS log_batches (
    first_offset INTEGER PRIMARY KEY,
    count        INTEGER NOT NULL,
    appended_at  INTEGER NOT NULL,
    payload      BLOB NOT NULL,
    codec        INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS idempotency (
    key          TEXT PRIMARY KEY,
    first_offset INTEGER NOT NULL,
    response     BLOB NOT NULL,
    created_at   INTEGER NOT NULL,
    body_sha256  BLOB
);
";

/// How long an idempotency key is remembered.
pub(crate) const IDEMPOTENCY_TTL_MS: i64 = 24 * 3600 * 1000;

/// How a batch row's payload is stored. Rows of every codec ever written
/// stay readable: a log written before compression has only `Raw` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    /// The length-prefixed envelopes as they are.
    Raw = 0,
    /// One zstd frame of them.
    Zstd = 1,
    /// One zstd frame of the batch packed: price ticks by their ids' index
    /// in the batch, time deltas and decimal prices, other events as
    /// envelopes ([`packed`]).
    Packed = 2,
}

/// zstd's level for new batches: level 3 (zstd's default) compressed the
/// benchmark's long-tail log of envelopes 4.6× against 3.9× at level 1, at
/// about the same speed on this data (measured before batches were packed).
const ZSTD_LEVEL: i32 = 3;

impl Codec {
    fn from_column(v: i64) -> Result<Self> {
        match v {
            0 => Ok(Codec::Raw),
            1 => Ok(Codec::Zstd),
            2 => Ok(Codec::Packed),
            other => Err(Error::Corrupt(format!("unknown log batch codec {other}"))),
        }
    }

    /// Calls `f` with a stored payload as it was before compression.
    fn expand<R>(self, first: u64, stored: &[u8], f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        match self {
            Codec::Raw => f(stored),
            Codec::Zstd | Codec::Packed => INFLATE.with_borrow_mut(|(zstd, buf)| {
                let corrupt = |e: &dyn std::fmt::Display| {
                    Error::Corrupt(format!("log batch at {first}: {e}"))
                };
                buf.clear();
                // Every frame this log wrote says its size
                // (`bulk::compress`); one that does not is streamed.
                match zstd::zstd_safe::get_frame_content_size(stored) {
                    Ok(Some(size)) if size <= u32::MAX as u64 => {
                        buf.reserve(size as usize);
                        zstd.decompress_to_buffer(stored, buf)
                            .map_err(|e| corrupt(&e))?;
                    }
                    _ => zstd::stream::copy_decode(stored, &mut *buf).map_err(|e| corrupt(&e))?,
                }
                let out = f(buf);
                if buf.capacity() > KEEP_ENVELOPES {
                    *buf = Vec::new();
                }
                out
            }),
        }
    }
}

/// The most of its payload buffers a thread keeps between batches: a
/// batch of 20 000 long-tail events was ~1.5 MB of envelopes (less
/// packed), and one outsized batch should not stay in memory.
const KEEP_ENVELOPES: usize = 8 << 20;

thread_local! {
    /// A thread's zstd contexts and the buffers it writes a batch's
    /// payload into before compressing it, and inflates payloads into.
    /// Made afresh for each batch (`bulk::compress`, `stream::decode_all`),
    /// each was a context of ~100 KB to allocate and set up, and a buffer
    /// grown by doubling to the batch's size: fresh memory the kernel
    /// zeroed on every step, the largest share of a dense `backfill
    /// --project`'s page faults.
    static COMPRESSOR: std::cell::RefCell<(zstd::bulk::Compressor<'static>, Vec<u8>)> =
        std::cell::RefCell::new((
            zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("a zstd context at level 3"),
            Vec::new(),
        ));
    static INFLATE: std::cell::RefCell<(zstd::bulk::Decompressor<'static>, Vec<u8>)> =
        std::cell::RefCell::new((
            zstd::bulk::Decompressor::new().expect("a zstd context"),
            Vec::new(),
        ));
}

/// Brings an existing `log.db` to the current schema, each step in place:
/// - files written before body digests were kept get the `body_sha256`
///   column; their keys have no digest and keep replaying their response
///   for any body until they expire (at most 24 h), as they did when they
///   were recorded;
/// - files written before compression get the `codec` column, 0 (`Raw`)
///   in every row they hold; new rows are compressed.
fn upgrade(conn: &mut Connection) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let has_column = |table: &str, column: &str| -> Result<bool> {
        Ok(tx.query_row(
            "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2",
            params![table, column],
            |r| r.get::<_, i64>(0).map(|n| n > 0),
        )?)
    };
    if !has_column("idempotency", "body_sha256")? {
        tx.execute("ALTER TABLE idempotency ADD COLUMN body_sha256 BLOB", [])?;
    }
    if !has_column("log_batches", "codec")? {
        tx.execute(
            "ALTER TABLE log_batches ADD COLUMN codec INTEGER NOT NULL DEFAULT 0",
            [],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Page cache of the log's connections, writer and consumers alike. The
/// writer appends each batch to new pages it never reads again, and a
/// consumer reads each page once, in order: a cache holds nothing either
/// reuses beyond the B-tree's right edge and the overflow chain being
/// read (the OS page cache keeps the file). With the writers' 16 MB,
/// `heaptrack` put ~50 MB of page cache under the appender during the
/// live benchmark (docs/DESIGN.md, "A live step's memory").
const LOG_CACHE_KB: i64 = 2_000;

/// `open`, with the log's page cache.
fn open_log(path: &Path) -> Result<Connection> {
    let conn = open(path, Durability::Full)?;
    conn.pragma_update(None, "cache_size", -LOG_CACHE_KB)?;
    Ok(conn)
}

pub struct SqliteLog {
    writer: Arc<Mutex<Connection>>,
    path: std::path::PathBuf,
    /// Offset after the newest event this process knows of; wakes in-process
    /// consumers immediately after an append.
    head: watch::Sender<u64>,
    /// The batches this process appended last, for its consumer.
    recent: Arc<Mutex<Recent>>,
    /// Told when the consumer moves on or goes; appends that wait for it
    /// ([`SqliteLog::lead_consumer`]) wait on this.
    consumer_moved: Arc<Notify>,
    /// Appends wait for the consumer ([`SqliteLog::lead_consumer`]).
    paced: AtomicBool,
}

impl SqliteLog {
    pub fn open(dir: &Path) -> CResult<Self> {
        Self::open_inner(dir).map_err(Into::into)
    }

    fn open_inner(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
        let path = dir.join(crate::db::LOG_FILE);
        let mut conn = open_log(&path)?;
        conn.execute_batch(SCHEMA)?;
        upgrade(&mut conn)?;
        let head = next_offset(&conn)?;
        metrics::gauge!(tm::LOG_HEAD, "partition" => "0").set(head as f64);
        Ok(SqliteLog {
            writer: Arc::new(Mutex::new(conn)),
            path,
            head: watch::Sender::new(head),
            recent: Arc::new(Mutex::new(Recent::new(0))),
            consumer_moved: Arc::new(Notify::new()),
            paced: AtomicBool::new(false),
        })
    }

    /// Keeps what this process appends, up to `lead` events ahead of its
    /// consumer, for the consumer to take from memory (`recent`), and makes
    /// each append wait until it lies within `lead` of the consumer.
    ///
    /// For `backfill --project`: its appends outran its own projector, which
    /// then read each batch back from the file well after it was written
    /// (a select, zstd's inflate and a decode of every envelope, 8–14 % of
    /// the command's samples). Held back instead, the appends leave their
    /// core to the projector, and it reads none of them from the file.
    /// Services do not call this: their appends never wait for a
    /// projector, and one far behind would find nothing kept anyway.
    pub fn lead_consumer(&self, lead: usize) {
        self.recent.lock().unwrap().set_cap(lead);
        self.paced.store(true, Ordering::Relaxed);
    }

    /// Waits until an append of `n` events lies within the lead of this
    /// process's consumer, if [`SqliteLog::lead_consumer`] asked for that.
    async fn pace(&self, n: usize) {
        if !self.paced.load(Ordering::Relaxed) {
            return;
        }
        loop {
            // Registered before the check, so a move in between is not lost.
            let moved = self.consumer_moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            let head = *self.head.borrow();
            if self.recent.lock().unwrap().has_room(head, n) {
                return;
            }
            moved.await;
        }
    }

    /// A consumer starting at `from` (the position after the last consumed
    /// event), with its own connection.
    pub fn consumer(&self, from: u64) -> CResult<SqliteConsumer> {
        self.consumer_inner(from).map_err(Into::into)
    }

    fn consumer_inner(&self, from: u64) -> Result<SqliteConsumer> {
        self.recent.lock().unwrap().attach(from);
        Ok(SqliteConsumer {
            conn: Arc::new(Mutex::new(open_log(&self.path)?)),
            recent: self.recent.clone(),
            moved: self.consumer_moved.clone(),
            next: from,
            head: self.head.subscribe(),
        })
    }

    /// Offset after the newest event, read from the file (sees other
    /// processes' appends too).
    pub async fn head(&self) -> CResult<u64> {
        let conn = self.writer.clone();
        blocking(move || next_offset(&conn.lock().unwrap())).await
    }
}

fn next_offset(conn: &Connection) -> Result<u64> {
    let next: Option<i64> = conn
        .query_row(
            "SELECT first_offset + count FROM log_batches ORDER BY first_offset DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(next.unwrap_or(0) as u64)
}

#[async_trait]
impl EventLog for SqliteLog {
    async fn ready(&self) -> CResult<()> {
        self.head().await.map(|_| ())
    }

    async fn append(&self, batch: AppendBatch) -> CResult<AppendOutcome> {
        self.pace(batch.events.len()).await;
        let conn = self.writer.clone();
        let started = Instant::now();
        let events = batch.events.clone();
        let recent = self.recent.clone();
        let (outcome, head) = blocking(move || {
            // Compressed before the write lock is taken: appends of other
            // requests wait only for the insert and the fsync.
            let payload = COMPRESSOR
                .with_borrow_mut(|(zstd, envelopes)| {
                    envelopes.clear();
                    packed::encode(batch.events.iter(), envelopes);
                    let frame = zstd.compress(envelopes);
                    if envelopes.capacity() > KEEP_ENVELOPES {
                        *envelopes = Vec::new();
                    }
                    frame
                })
                .map_err(|e| Error::Io(format!("compressing a log batch: {e}")))?;
            let now = Timestamp::now().millis();
            let mut conn = conn.lock().unwrap();
            // IMMEDIATE takes the write lock up front, so the next offset read
            // below cannot race another process appending.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if let Some(idem) = &batch.idempotency {
                let seen: Option<(Vec<u8>, Option<Vec<u8>>)> = tx
                    .query_row(
                        "SELECT response, body_sha256 FROM idempotency WHERE key = ?1 AND created_at > ?2",
                        params![idem.key, now - IDEMPOTENCY_TTL_MS],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                match seen {
                    // Recorded before digests were kept: replayed, as then.
                    Some((response, None)) => {
                        return Ok((AppendOutcome::Duplicate { response }, None))
                    }
                    Some((response, Some(digest))) if digest == idem.body_digest => {
                        return Ok((AppendOutcome::Duplicate { response }, None))
                    }
                    Some(_) => return Ok((AppendOutcome::Conflict, None)),
                    None => {}
                }
            }
            let first = next_offset(&tx)?;
            let count = batch.events.len();
            if count > 0 {
                tx.prepare_cached(
                    "INSERT INTO log_batches (first_offset, count, appended_at, payload, codec) VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![first as i64, count as i64, now, payload, Codec::Packed as i64])?;
            }
            if let Some(idem) = &batch.idempotency {
                tx.execute(
                    "INSERT OR REPLACE INTO idempotency (key, first_offset, response, created_at, body_sha256) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![idem.key, first as i64, idem.response, now, idem.body_digest],
                )?;
                // Forget expired keys now and then, in the same transaction.
                if first % 64 == 0 {
                    tx.execute(
                        "DELETE FROM idempotency WHERE created_at <= ?1",
                        params![now - IDEMPOTENCY_TTL_MS],
                    )?;
                }
            }
            tx.commit()?;
            // Under the write lock still: kept in the order committed.
            recent.lock().unwrap().keep(first, events);
            Ok((AppendOutcome::Appended { count }, Some(first + count as u64)))
        })
        .await?;
        metrics::histogram!(tm::LOG_APPEND_SECONDS).record(started.elapsed().as_secs_f64());
        if let Some(head) = head {
            self.head.send_replace(head);
            metrics::gauge!(tm::LOG_HEAD, "partition" => "0").set(head as f64);
        }
        Ok(outcome)
    }
}

/// Reads the embedded log in order from a position. Its position is not
/// stored here: the projector keeps it in the read store, in the same
/// transaction as the buckets.
pub struct SqliteConsumer {
    conn: Arc<Mutex<Connection>>,
    /// Its log's batches appended by this process, read before the file.
    recent: Arc<Mutex<Recent>>,
    /// Told each time this consumer moves on, and when it goes.
    moved: Arc<Notify>,
    next: u64,
    head: watch::Receiver<u64>,
}

impl SqliteConsumer {
    /// `out` (empty) filled with the events after the consumer's position,
    /// up to `max`.
    async fn fill(&self, mut out: Vec<Delivered>, max: usize) -> CResult<Vec<Delivered>> {
        while out.len() < max {
            let (conn, recent) = (self.conn.clone(), self.recent.clone());
            let from = out.last().map_or(self.next, |d| d.position.offset + 1);
            let (read, filled) = blocking(move || {
                let read =
                    SqliteConsumer::read(&conn.lock().unwrap(), &recent, from, max, &mut out)?;
                Ok((read, out))
            })
            .await?;
            out = filled;
            if !read {
                break;
            }
        }
        Ok(out)
    }

    /// Reads the events from `from` onwards into `out`, until it holds
    /// `max`: those [`Recent`] keeps, then the file's up to the next one it
    /// keeps. Says whether it read any.
    fn read(
        conn: &Connection,
        recent: &Mutex<Recent>,
        from: u64,
        max: usize,
        out: &mut Vec<Delivered>,
    ) -> Result<bool> {
        let before = out.len();
        let kept = recent.lock().unwrap().take(from, max, out);
        if out.len() < max {
            let from = out.last().map_or(from, |d| d.position.offset + 1);
            // The file's events up to the next kept one, at most.
            let upto = kept.map_or(max, |next| {
                max.min(out.len() + next.saturating_sub(from) as usize)
            });
            Self::read_file(conn, from, upto, out)?;
        }
        Ok(out.len() > before)
    }

    /// Reads the batch rows holding `from` onwards into `out`, until it
    /// holds `max` events (the rest of the last row is read again by the
    /// next poll) or 64 rows were read. Says whether it read any. A row
    /// that ends before `from` is not read: at the log's end every poll
    /// inflated the last batch only to skip all of it.
    fn read_file(
        conn: &Connection,
        from: u64,
        max: usize,
        out: &mut Vec<Delivered>,
    ) -> Result<bool> {
        let mut stmt = conn.prepare_cached(
            "SELECT first_offset, count, codec, payload FROM log_batches
             WHERE first_offset >= COALESCE((SELECT MAX(first_offset) FROM log_batches WHERE first_offset <= ?1), 0)
               AND first_offset + count > ?1
             ORDER BY first_offset LIMIT 64",
        )?;
        let mut rows = stmt.query(params![from as i64])?;
        let before = out.len();
        while let Some(row) = rows.next()? {
            let first = row.get::<_, i64>(0)? as u64;
            let count = row.get::<_, i64>(1)? as u64;
            let codec = Codec::from_column(row.get(2)?)?;
            let stored = row
                .get_ref(3)?
                .as_blob()
                .map_err(|e| Error::Corrupt(e.to_string()))?;
            codec.expand(first, stored, |payload| match codec {
                Codec::Packed => packed::decode(first, count, payload, from, max, out),
                Codec::Raw | Codec::Zstd => decode_batch(first, count, payload, from, max, out),
            })?;
            if out.len() >= max {
                break;
            }
        }
        Ok(out.len() > before)
    }
}

/// Decodes the envelope of the event at `offset` into `out`, or counts and
/// logs it when it does not decode: never silent, and the bytes stay in the
/// log for a fixed decoder to replay.
fn push_envelope(offset: u64, bytes: &[u8], out: &mut Vec<Delivered>) {
    match codec::decode(bytes) {
        Ok(event) => out.push(Delivered {
            position: Position {
                partition: 0,
                offset,
            },
            event,
        }),
        Err(e) => {
            metrics::counter!(tm::PROJECTOR_DECODE_ERRORS).increment(1);
            tracing::error!(offset, error = %e, "undecodable event in log; skipped");
        }
    }
}

/// Decodes the events of one batch row of length-prefixed envelopes
/// (codecs `Raw` and `Zstd`) from `from` on into `out`, until it holds
/// `max`.
fn decode_batch(
    first: u64,
    count: u64,
    payload: &[u8],
    from: u64,
    max: usize,
    out: &mut Vec<Delivered>,
) -> Result<()> {
    let mut rest = payload;
    for i in 0..count {
        if out.len() >= max {
            break;
        }
        let offset = first + i;
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(Error::Corrupt(format!(
                "log batch at {first} ends before event {offset}"
            )));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(Error::Corrupt(format!(
                "log batch at {first}: event {offset} is truncated"
            )));
        }
        let (bytes, tail) = tail.split_at(len);
        rest = tail;
        if offset < from {
            continue;
        }
        push_envelope(offset, bytes, out);
    }
    Ok(())
}

impl Drop for SqliteConsumer {
    fn drop(&mut self) {
        self.recent.lock().unwrap().detach();
        self.moved.notify_waiters();
    }
}

#[async_trait]
impl LogConsumer for SqliteConsumer {
    async fn poll(&mut self, max: usize, wait: Duration) -> CResult<Vec<Delivered>> {
        // Filled up to `max` whenever the log has that much: handing out
        // whole stored batches, and the rest of the last one as the next
        // poll, made every other step a small one, which the projector
        // cannot overlap with the large step's write. So a poll stops
        // decoding at `max` and the next one reads that batch row again
        // from where it stopped.
        //
        // The events are decoded into the buffer handed out, sized once
        // for `max`: it is fresh memory on every poll, and grown by
        // doubling it was copied and faulted in again at each size (a tenth
        // of a dense `backfill --project`'s samples). What a poll leaves
        // unused costs address space, not memory: pages are resident once
        // written.
        let mut out = self.fill(Vec::with_capacity(max), max).await?;
        if out.is_empty() {
            // Woken at once by an append in this process, and read again;
            // other processes' appends are seen on the next poll, at most
            // `wait` later.
            if let Ok(Ok(())) = tokio::time::timeout(wait, self.head.changed()).await {
                out = self.fill(out, max).await?;
            }
        }
        if let Some(last) = out.last() {
            self.next = last.position.offset + 1;
            self.recent.lock().unwrap().consumed_to(self.next);
            self.moved.notify_waiters();
        }
        Ok(out)
    }

    async fn commit(&mut self, _upto: &[Position]) -> CResult<()> {
        Ok(())
    }

    async fn lag(&mut self) -> CResult<Vec<(u32, u64)>> {
        let conn = self.conn.clone();
        let head = blocking(move || next_offset(&conn.lock().unwrap())).await?;
        Ok(vec![(0, head.saturating_sub(self.next))])
    }

    /// One partition, always this consumer's.
    fn assignment_changed(&mut self) -> bool {
        false
    }
}

/// The embedded log, resumed from the position stored in the read store.
pub struct EmbeddedSource {
    pub log: Arc<SqliteLog>,
    pub store: Arc<dyn ProjectionStore>,
}

#[async_trait]
impl ConsumerSource for EmbeddedSource {
    async fn open(&self) -> hindsight_contracts::Result<Box<dyn LogConsumer>> {
        let from = self
            .store
            .committed()
            .await?
            .into_iter()
            .find(|p| p.partition == 0);
        Ok(Box::new(self.log.consumer(from.map_or(0, |p| p.offset))?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_schemas::{Event, PriceTick};

    /// Appends each event's envelope to `out`, prefixed by its length (u32
    /// LE): a batch row's payload before compression, as builds before
    /// packed batches wrote it (codecs `Raw` and `Zstd`).
    fn put_envelopes<'e>(
        events: impl Iterator<Item = &'e hindsight_schemas::Event>,
        out: &mut Vec<u8>,
    ) {
        let mut scratch = Vec::with_capacity(256);
        for event in events {
            scratch.clear();
            codec::encode_into(event, &mut scratch);
            out.extend_from_slice(&(scratch.len() as u32).to_le_bytes());
            out.extend_from_slice(&scratch);
        }
    }

    /// A poll hands out `max` events whenever the log holds that many, even
    /// when the stored batches it reads end past `max`: the projector
    /// overlaps one step's write with the next step's fold, which only pays
    /// when steps are alike.
    #[tokio::test]
    async fn a_poll_fills_up_to_max_across_stored_batches() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(dir.path()).unwrap();
        for batch in 0..5 {
            let events = (0..100)
                .map(|i| {
                    Event::Price(PriceTick {
                        market_id: "m".into(),
                        token_id: "t".into(),
                        ts: Timestamp(1_756_684_800_000 + batch * 100 + i),
                        p: 0.5,
                    })
                })
                .collect::<Vec<_>>();
            log.append(AppendBatch {
                events: events.into(),
                idempotency: None,
            })
            .await
            .unwrap();
        }
        let mut consumer = log.consumer(0).unwrap();
        let wait = Duration::from_millis(1);
        let mut sizes = Vec::new();
        let mut next = 0;
        loop {
            let got = consumer.poll(150, wait).await.unwrap();
            if got.is_empty() {
                break;
            }
            for d in &got {
                assert_eq!(d.position.offset, next, "in order, each once");
                next += 1;
            }
            sizes.push(got.len());
        }
        assert_eq!(sizes, [150, 150, 150, 50]);
    }

    /// A poll that finds the log drained waits for an append, and hands
    /// out what the append woke it for: the caller does not poll again to
    /// get it.
    #[tokio::test]
    async fn a_poll_woken_by_an_append_hands_it_out() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(SqliteLog::open(dir.path()).unwrap());
        let mut consumer = log.consumer(0).unwrap();
        let appender = log.clone();
        let appended = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let tick = Event::Price(PriceTick {
                market_id: "m".into(),
                token_id: "t".into(),
                ts: Timestamp(1_756_684_800_000),
                p: 0.5,
            });
            appender
                .append(AppendBatch {
                    events: vec![tick].into(),
                    idempotency: None,
                })
                .await
                .unwrap();
        });
        let started = std::time::Instant::now();
        let got = consumer.poll(10, Duration::from_secs(10)).await.unwrap();
        assert_eq!(got.len(), 1, "after {:?}", started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(5));
        appended.await.unwrap();
    }

    /// What this process appended is handed to its consumer from memory
    /// when near it, and from the file when not: either way the same
    /// events under the same offsets as a reader of the file alone gets.
    #[tokio::test]
    async fn a_consumer_reads_from_memory_what_the_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(dir.path()).unwrap();
        log.recent.lock().unwrap().set_cap(250);
        let mut consumer = log.consumer(0).unwrap();
        let wait = Duration::from_millis(1);
        let batch = |n: u64| {
            (0..100)
                .map(|i| {
                    Event::Price(PriceTick {
                        market_id: "m".into(),
                        token_id: format!("t{}", n * 100 + i),
                        ts: Timestamp(1_756_684_800_000 + (n * 100 + i) as i64),
                        p: 0.5,
                    })
                })
                .collect::<Vec<_>>()
        };
        let mut got = Vec::new();
        for n in 0..10 {
            log.append(AppendBatch {
                events: batch(n).into(),
                idempotency: None,
            })
            .await
            .unwrap();
            let kept = log.recent.lock().unwrap().len();
            match n {
                // Near the consumer: kept.
                0 => assert_eq!(kept, 100),
                1 => assert_eq!(kept, 200),
                // Ends 300 past the consumer, more than 250: not kept.
                2 => assert_eq!(kept, 200),
                // The consumer read up to 300.
                3 => assert_eq!(kept, 100),
                _ => {}
            }
            // The consumer reads after every third batch, 150 at a time.
            if n % 3 == 2 || n == 9 {
                loop {
                    let polled = consumer.poll(150, wait).await.unwrap();
                    if polled.is_empty() {
                        break;
                    }
                    got.extend(polled);
                }
            }
        }
        assert_eq!(log.recent.lock().unwrap().len(), 0, "all taken");
        let file = SqliteLog::open(dir.path()).unwrap();
        let mut reader = file.consumer(0).unwrap();
        let mut want = Vec::new();
        loop {
            let polled = reader.poll(1000, wait).await.unwrap();
            if polled.is_empty() {
                break;
            }
            want.extend(polled);
        }
        assert_eq!(want.len(), 1000);
        assert_eq!(got, want);
        let appended: Vec<Event> = (0..10).flat_map(batch).collect();
        let read: Vec<Event> = got.into_iter().map(|d| d.event).collect();
        assert_eq!(read, appended);
    }

    /// With a lead, an append waits until it lies within the lead of the
    /// consumer, goes on once the consumer has read on, and does not wait
    /// for a consumer that is gone.
    #[tokio::test]
    async fn appends_wait_for_the_consumer_they_lead() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(SqliteLog::open(dir.path()).unwrap());
        log.lead_consumer(200);
        let mut consumer = log.consumer(0).unwrap();
        let batch = || AppendBatch {
            events: vec![
                Event::Price(PriceTick {
                    market_id: "m".into(),
                    token_id: "t".into(),
                    ts: Timestamp(1_756_684_800_000),
                    p: 0.5,
                });
                100
            ]
            .into(),
            idempotency: None,
        };
        log.append(batch()).await.unwrap();
        log.append(batch()).await.unwrap();
        let third = tokio::spawn({
            let log = log.clone();
            async move { log.append(batch()).await.unwrap() }
        });
        let wait = Duration::from_millis(1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!third.is_finished(), "300 ahead of a lead of 200: waits");
        assert_eq!(consumer.poll(100, wait).await.unwrap().len(), 100);
        tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .expect("goes on once the consumer has read on")
            .unwrap();
        let fourth = tokio::spawn({
            let log = log.clone();
            async move { log.append(batch()).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!fourth.is_finished());
        drop(consumer);
        tokio::time::timeout(Duration::from_secs(5), fourth)
            .await
            .expect("no consumer, nothing to wait for")
            .unwrap();
    }

    /// A consumer at the log's end does not read the last batch again:
    /// spoilt after it was read, it goes unnoticed until the consumer
    /// starts over.
    #[tokio::test]
    async fn a_poll_at_the_end_reads_no_batch() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(dir.path()).unwrap();
        let tick = Event::Price(PriceTick {
            market_id: "m".into(),
            token_id: "t".into(),
            ts: Timestamp(1_756_684_800_000),
            p: 0.5,
        });
        log.append(AppendBatch {
            events: vec![tick.clone(), tick].into(),
            idempotency: None,
        })
        .await
        .unwrap();
        let mut consumer = log.consumer(0).unwrap();
        let wait = Duration::from_millis(1);
        assert_eq!(consumer.poll(10, wait).await.unwrap().len(), 2);
        log.writer
            .lock()
            .unwrap()
            .execute("UPDATE log_batches SET payload = x'00'", [])
            .unwrap();
        assert!(consumer.poll(10, wait).await.unwrap().is_empty());
        let mut again = log.consumer(0).unwrap();
        assert!(
            again.poll(10, wait).await.is_err(),
            "the spoilt batch is read from 0"
        );
    }

    /// Every payload a batch row may hold reads back as its events: a
    /// frame this log wrote (which says its size, inflated into the
    /// thread's buffer), a frame that does not say it (streamed), and a
    /// row written before compression. A frame that does not inflate is
    /// `Corrupt`, naming the batch.
    #[tokio::test]
    async fn every_stored_payload_reads_back_and_a_broken_frame_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(dir.path()).unwrap();
        let tick = |i: i64| {
            Event::Price(PriceTick {
                market_id: "m".into(),
                token_id: format!("t{i}"),
                ts: Timestamp(1_756_684_800_000 + i),
                p: 0.5,
            })
        };
        log.append(AppendBatch {
            events: (0..3).map(tick).collect::<Vec<_>>().into(),
            idempotency: None,
        })
        .await
        .unwrap();
        let envelopes = |events: std::ops::Range<i64>| {
            let mut out = Vec::new();
            put_envelopes(events.map(tick).collect::<Vec<_>>().iter(), &mut out);
            out
        };
        let unsized_frame = {
            let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
            std::io::Write::write_all(&mut encoder, &envelopes(3..6)).unwrap();
            encoder.finish().unwrap()
        };
        assert_eq!(
            zstd::zstd_safe::get_frame_content_size(&unsized_frame).unwrap(),
            None,
            "the streamed frame leaves its size out"
        );
        {
            let conn = log.writer.lock().unwrap();
            let row = "INSERT INTO log_batches (first_offset, count, appended_at, payload, codec) VALUES (?1, 3, 0, ?2, ?3)";
            conn.execute(row, params![3, unsized_frame, Codec::Zstd as i64])
                .unwrap();
            conn.execute(row, params![6, envelopes(6..9), Codec::Raw as i64])
                .unwrap();
        }
        let mut consumer = log.consumer(0).unwrap();
        let got = consumer.poll(100, Duration::from_millis(1)).await.unwrap();
        let events: Vec<Event> = got.into_iter().map(|d| d.event).collect();
        assert_eq!(events, (0..9).map(tick).collect::<Vec<_>>());

        {
            let conn = log.writer.lock().unwrap();
            conn.execute(
                "INSERT INTO log_batches (first_offset, count, appended_at, payload, codec) VALUES (9, 1, 0, ?1, ?2)",
                params![b"\x28\xb5\x2f\xfd not a frame".to_vec(), Codec::Zstd as i64],
            )
            .unwrap();
        }
        let err = consumer
            .poll(100, Duration::from_millis(1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("log batch at 9"), "{err}");
    }
}
