//! The embedded read store: bucket tables, catalog and API keys in `store.db`
//! (and the rate-limit log in `limits.db`, [`crate::limits`]).

use crate::db::{blocking, open, Durability, Pool};
use crate::limits::RateLog;
use crate::{CResult, Error, Result};
use async_trait::async_trait;
use hindsight_contracts::*;
use hindsight_schemas::claims::{market_conflict, Lookups};
use hindsight_schemas::wire::Reject;
use hindsight_schemas::{codec, Event, MarketRecord, Timestamp, TradeSide};
use hindsight_telemetry as tm;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bumped when the layout below changes; recorded in `meta`. Version 3
/// adds `catalog_consumed` (created empty on open: a store of version 2
/// decided its catalog records already, and replays start after them).
/// Version 4 adds the tick-level tables `price_ticks`, `book_ticks`,
/// `trades` and `trade_ids`, created empty on open: events projected
/// before have no ticks until `hindsight rebuild` replays the log.
/// Version 5 adds the candle columns of `price_buckets` (`open_ts` …
/// `low`), NULL in rows an older version wrote: those buckets have no
/// candle until `hindsight rebuild` (the API says so rather than serve a
/// candle of part of a bucket).
pub const SCHEMA_VERSION: i64 = 5;

/// The candle columns of `price_buckets`, in order, as `migrate` adds them
/// to an older store (nullable: rows written before have none).
const CANDLE_COLUMNS: [(&str, &str); 8] = [
    ("open_ts", "INTEGER"),
    ("open_offset", "INTEGER"),
    ("open_p", "REAL"),
    ("close_ts", "INTEGER"),
    ("close_offset", "INTEGER"),
    ("close_p", "REAL"),
    ("high", "REAL"),
    ("low", "REAL"),
];

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

-- Buckets. `res` is the resolution name ('1m', …), `bucket` its start in
-- Unix milliseconds, `last_offset` the log offset of the last event folded in.
-- Price rows carry their candle: the open and close ticks (time, log
-- offset, probability) and the high and low; NULL in rows written before
-- version 5 (see CANDLE_COLUMNS).
CREATE TABLE IF NOT EXISTS price_buckets (
    token_id TEXT NOT NULL, res TEXT NOT NULL, bucket INTEGER NOT NULL,
    sum REAL NOT NULL, count INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    open_ts INTEGER, open_offset INTEGER, open_p REAL,
    close_ts INTEGER, close_offset INTEGER, close_p REAL, high REAL, low REAL,
    PRIMARY KEY (token_id, res, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metric_buckets (
    market_id TEXT NOT NULL, res TEXT NOT NULL, bucket INTEGER NOT NULL,
    volume_sum REAL NOT NULL, liquidity_sum REAL NOT NULL, spread_sum REAL NOT NULL,
    count INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (market_id, res, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS book_buckets (
    token_id TEXT NOT NULL, res TEXT NOT NULL, bucket INTEGER NOT NULL,
    ts INTEGER NOT NULL, snapshot_offset INTEGER NOT NULL,
    bids TEXT NOT NULL, asks TEXT NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (token_id, res, bucket)
) WITHOUT ROWID;

-- Tick level: every price tick, book snapshot and trade as ingested, per
-- token in (ts, log position) order. The key is the tick's identity, so a
-- replayed event rewrites its own row. `trade_ids` keeps, per token and
-- trade id, the position of the one trade stored under it.
CREATE TABLE IF NOT EXISTS price_ticks (
    token_id TEXT NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, p REAL NOT NULL,
    PRIMARY KEY (token_id, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS book_ticks (
    token_id TEXT NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, bids TEXT NOT NULL, asks TEXT NOT NULL,
    PRIMARY KEY (token_id, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trades (
    token_id TEXT NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, price REAL NOT NULL, size REAL NOT NULL,
    side TEXT NOT NULL, trade_id TEXT,
    PRIMARY KEY (token_id, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trade_ids (
    token_id TEXT NOT NULL, trade_id TEXT NOT NULL,
    log_partition INTEGER NOT NULL, log_offset INTEGER NOT NULL,
    PRIMARY KEY (token_id, trade_id)
) WITHOUT ROWID;

-- Per log partition, the offset after the last event the projector applied.
CREATE TABLE IF NOT EXISTS consumed (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);
-- Per log partition, the offset after the last catalog record decided
-- (stored, refused or older): a record before it is not decided again.
CREATE TABLE IF NOT EXISTS catalog_consumed (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);

-- Catalog. `body` is the record in the log's own envelope encoding; the
-- other columns exist to be filtered and sorted on. A record replaces the
-- stored one only if its (updated_at, version_offset) is greater.
-- `change_seq` orders changes for `catalog_changes`: a store-local sequence
-- (`meta.catalog_seq`), bumped by every stored change. Not the log offset,
-- which is per partition: with a Kafka log of several partitions a change
-- at a lower offset of another partition would hide behind a cursor.
CREATE TABLE IF NOT EXISTS series (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, title TEXT NOT NULL, tags TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL,
    change_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS series_slug ON series (slug);
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, series_id TEXT, title TEXT NOT NULL, tags TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL,
    change_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS events_slug ON events (slug);
CREATE INDEX IF NOT EXISTS events_series ON events (series_id);
CREATE TABLE IF NOT EXISTS markets (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, event_id TEXT, question TEXT, status TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL,
    change_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS markets_slug ON markets (slug);
CREATE INDEX IF NOT EXISTS markets_event ON markets (event_id);
CREATE TABLE IF NOT EXISTS tokens (
    token_id TEXT PRIMARY KEY, market_id TEXT NOT NULL, label TEXT NOT NULL, ord INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tokens_market ON tokens (market_id);

-- API keys: only a SHA-256 of the key is stored.
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY, hash BLOB NOT NULL UNIQUE, organization TEXT NOT NULL,
    plan TEXT NOT NULL, created_at INTEGER NOT NULL, revoked_at INTEGER
);
";

/// Tables `reset` empties: everything derived from the log. Keys are not.
const DERIVED_TABLES: &[&str] = &[
    "price_buckets",
    "metric_buckets",
    "book_buckets",
    "price_ticks",
    "book_ticks",
    "trades",
    "trade_ids",
    "consumed",
    "catalog_consumed",
    "series",
    "events",
    "markets",
    "tokens",
];

/// Brings a `store.db` of an older layout to [`SCHEMA_VERSION`]. Version 1
/// ordered catalog changes by log offset; version 2 adds `change_seq`.
/// Existing records keep sequence 0: a full read lists them, and every
/// cursor handed out before was held in memory by a process now restarted.
/// Version 5 adds the candle columns, NULL in existing rows.
fn migrate(conn: &Connection) -> Result<()> {
    for (column, kind) in CANDLE_COLUMNS {
        let present: bool = conn
            .prepare(&format!(
                "SELECT 1 FROM pragma_table_info('price_buckets') WHERE name = '{column}'"
            ))?
            .exists([])?;
        if !present {
            conn.execute_batch(&format!(
                "ALTER TABLE price_buckets ADD COLUMN {column} {kind};"
            ))?;
        }
    }
    for table in ["series", "events", "markets"] {
        let has_seq: bool = conn
            .prepare(&format!(
                "SELECT 1 FROM pragma_table_info('{table}') WHERE name = 'change_seq'"
            ))?
            .exists([])?;
        if !has_seq {
            conn.execute_batch(&format!(
                "ALTER TABLE {table} ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;
                 DROP INDEX IF EXISTS {table}_version;"
            ))?;
        }
        conn.execute_batch(&format!(
            "CREATE INDEX IF NOT EXISTS {table}_changes ON {table} (change_seq);"
        ))?;
    }
    Ok(())
}

/// Page cache of the store's writer connection, in KiB (the other
/// connections keep [`crate::db::WRITER_CACHE_KB`]).
const STORE_WRITER_CACHE_KB: i64 = 128_000;

pub struct SqliteStore {
    writer: Arc<Mutex<Connection>>,
    readers: Arc<Pool>,
    limits: RateLog,
    pub(crate) accounts: crate::accounts::Accounts,
    pub(crate) exports: crate::exports::ExportJobs,
}

impl SqliteStore {
    pub fn open(dir: &Path) -> CResult<Self> {
        Self::open_inner(dir).map_err(Into::into)
    }

    fn open_inner(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
        let path = dir.join(crate::db::STORE_FILE);
        let conn = open(&path, Durability::Normal)?;
        // The projector writes through this one connection. Its step's rows
        // land all over the bucket tables (each token's range, at every
        // resolution), so a cache that holds the tables' interior pages and
        // the hot leaves saves a read per row; SQLite allocates it only as
        // pages are read, so a small store costs no more.
        conn.pragma_update(None, "cache_size", -STORE_WRITER_CACHE_KB)?;
        conn.execute_batch(SCHEMA)?;
        migrate(&conn)?;
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?1)",
            params![SCHEMA_VERSION.to_string()],
        )?;
        let limits = RateLog::open(dir)?;
        let accounts = crate::accounts::Accounts::open(dir)?;
        let exports = crate::exports::ExportJobs::open(dir)?;
        Ok(SqliteStore {
            writer: Arc::new(Mutex::new(conn)),
            readers: Arc::new(Pool::new(path, Durability::Normal)),
            limits,
            accounts,
            exports,
        })
    }

    /// Runs a read on a pooled connection, timed and counted by `op`.
    ///
    /// Inline on the calling task when a pooled connection is idle: in WAL
    /// mode a reader never waits for a writer, and these reads are point
    /// lookups or bounded range scans of microseconds, cheaper than the two
    /// thread hand-offs of `spawn_blocking`. Opening a new connection may
    /// wait on another process's lock, so that happens on a blocking thread.
    async fn read<R: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Connection) -> Result<R> + Send + 'static,
    ) -> CResult<R> {
        let started = Instant::now();
        let out = match self.readers.take_idle() {
            Some(conn) => {
                let out = f(&conn);
                self.readers.put_back(conn);
                out.map_err(Into::into)
            }
            None => {
                let readers = self.readers.clone();
                blocking(move || readers.with(f)).await
            }
        };
        metrics::histogram!(tm::STORE_QUERY_SECONDS, "op" => op)
            .record(started.elapsed().as_secs_f64());
        if out.is_err() {
            metrics::counter!(tm::STORE_ERRORS, "op" => op).increment(1);
        }
        out
    }

    async fn write<R: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<R> + Send + 'static,
    ) -> CResult<R> {
        let conn = self.writer.clone();
        let started = Instant::now();
        let out = blocking(move || f(&mut conn.lock().unwrap())).await;
        metrics::histogram!(tm::STORE_QUERY_SECONDS, "op" => op)
            .record(started.elapsed().as_secs_f64());
        if out.is_err() {
            metrics::counter!(tm::STORE_ERRORS, "op" => op).increment(1);
        }
        out
    }
}

fn load_one(conn: &Connection, key: &RowKey) -> Result<Option<Row>> {
    let k = params![&*key.id, key.res.as_str(), key.bucket.millis()];
    let row = match key.table {
        Table::Prices => conn
            .prepare_cached(
                "SELECT sum, count, last_offset, open_ts, open_offset, open_p, close_ts, close_offset, close_p, high, low
                 FROM price_buckets WHERE token_id=?1 AND res=?2 AND bucket=?3",
            )?
            .query_row(k, |r| {
                Ok((
                    RowValue::Price {
                        sum: r.get(0)?,
                        count: r.get::<_, i64>(1)? as u64,
                        candle: candle_at(r, 3)?,
                    },
                    r.get::<_, i64>(2)?,
                ))
            })
            .optional()?,
        Table::Metrics => conn
            .prepare_cached(
                "SELECT volume_sum, liquidity_sum, spread_sum, count, last_offset FROM metric_buckets WHERE market_id=?1 AND res=?2 AND bucket=?3",
            )?
            .query_row(k, |r| {
                Ok((
                    RowValue::Metrics {
                        volume_sum: r.get(0)?,
                        liquidity_sum: r.get(1)?,
                        spread_sum: r.get(2)?,
                        count: r.get::<_, i64>(3)? as u64,
                    },
                    r.get::<_, i64>(4)?,
                ))
            })
            .optional()?,
        Table::Books => conn
            .prepare_cached(
                "SELECT ts, snapshot_offset, bids, asks, last_offset FROM book_buckets WHERE token_id=?1 AND res=?2 AND bucket=?3",
            )?
            .query_row(k, |r| {
                Ok((
                    RowValue::Book {
                        ts: Timestamp(r.get(0)?),
                        offset: r.get::<_, i64>(1)? as u64,
                        bids: r.get(2)?,
                        asks: r.get(3)?,
                    },
                    r.get::<_, i64>(4)?,
                ))
            })
            .optional()?,
    };
    Ok(row.map(|(value, last)| Row {
        key: key.clone(),
        value,
        last_offset: last as u64,
    }))
}

/// The candle in the eight columns from `first` on (`open_ts` … `low`);
/// `None` when the row has none (written before version 4).
fn candle_at(r: &rusqlite::Row, first: usize) -> rusqlite::Result<Option<Candle>> {
    let Some(open_ts) = r.get::<_, Option<i64>>(first)? else {
        return Ok(None);
    };
    let mark = |ts: i64, offset: usize, p: usize| -> rusqlite::Result<Mark> {
        Ok(Mark {
            ts: Timestamp(ts),
            offset: r.get::<_, i64>(first + offset)? as u64,
            p: r.get(first + p)?,
        })
    };
    Ok(Some(Candle {
        open: mark(open_ts, 1, 2)?,
        close: mark(r.get(first + 3)?, 4, 5)?,
        high: r.get(first + 6)?,
        low: r.get(first + 7)?,
    }))
}

/// The order of the bucket tables' primary key (`id`, `res` as text,
/// `bucket`), table by table. Rows written (and keys looked up) in this
/// order walk each B-tree from left to right: a step's thousands of rows,
/// scattered over every token's range, touch each page once while it is
/// in the page cache instead of in creation order, which revisits pages
/// long evicted. The sort is stable and the keys are distinct rows, so
/// the order changes no outcome.
fn key_order(a: &RowKey, b: &RowKey) -> std::cmp::Ordering {
    (a.table, &*a.id, a.res.as_str(), a.bucket.millis()).cmp(&(
        b.table,
        &*b.id,
        b.res.as_str(),
        b.bucket.millis(),
    ))
}

fn write_row(tx: &Transaction, row: &Row) -> Result<()> {
    let k = &row.key;
    let last = row.last_offset as i64;
    match &row.value {
        RowValue::Price { sum, count, candle } => {
            let open = candle.map(|c| c.open);
            let close = candle.map(|c| c.close);
            tx.prepare_cached(
                "INSERT OR REPLACE INTO price_buckets (token_id, res, bucket, sum, count, last_offset,
                   open_ts, open_offset, open_p, close_ts, close_offset, close_p, high, low)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            )?
            .execute(params![
                &*k.id,
                k.res.as_str(),
                k.bucket.millis(),
                sum,
                *count as i64,
                last,
                open.map(|m| m.ts.millis()),
                open.map(|m| m.offset as i64),
                open.map(|m| m.p),
                close.map(|m| m.ts.millis()),
                close.map(|m| m.offset as i64),
                close.map(|m| m.p),
                candle.map(|c| c.high),
                candle.map(|c| c.low),
            ])?;
        }
        RowValue::Metrics {
            volume_sum,
            liquidity_sum,
            spread_sum,
            count,
        } => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO metric_buckets VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                &*k.id,
                k.res.as_str(),
                k.bucket.millis(),
                volume_sum,
                liquidity_sum,
                spread_sum,
                *count as i64,
                last
            ])?;
        }
        RowValue::Book {
            ts,
            offset,
            bids,
            asks,
        } => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO book_buckets VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                &*k.id,
                k.res.as_str(),
                k.bucket.millis(),
                ts.millis(),
                *offset as i64,
                bids,
                asks,
                last
            ])?;
        }
    }
    Ok(())
}

/// Writes one tick under its key. A trade with an id is written only at
/// the position `trade_ids` holds for it: the first one given, recorded
/// here in the same transaction.
fn write_tick(tx: &Transaction, t: &Tick) -> Result<()> {
    let (ts, part, off) = (
        t.key.ts.millis(),
        t.key.partition as i64,
        t.key.offset as i64,
    );
    match &t.value {
        TickValue::Price { p } => {
            tx.prepare_cached("INSERT OR REPLACE INTO price_ticks VALUES (?1, ?2, ?3, ?4, ?5)")?
                .execute(params![t.token_id, ts, part, off, p])?;
        }
        TickValue::Book { bids, asks } => {
            tx.prepare_cached("INSERT OR REPLACE INTO book_ticks VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?
                .execute(params![t.token_id, ts, part, off, bids, asks])?;
        }
        TickValue::Trade {
            price,
            size,
            side,
            trade_id,
        } => {
            if let Some(id) = trade_id {
                tx.prepare_cached("INSERT OR IGNORE INTO trade_ids VALUES (?1, ?2, ?3, ?4)")?
                    .execute(params![t.token_id, id, part, off])?;
                let first: (i64, i64) = tx
                    .prepare_cached(
                        "SELECT log_partition, log_offset FROM trade_ids WHERE token_id = ?1 AND trade_id = ?2",
                    )?
                    .query_row(params![t.token_id, id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                if first != (part, off) {
                    return Ok(());
                }
            }
            tx.prepare_cached(
                "INSERT OR REPLACE INTO trades VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                t.token_id,
                ts,
                part,
                off,
                price,
                size,
                side.as_str(),
                trade_id
            ])?;
        }
    }
    Ok(())
}

/// The columns of a tick table after its key, and how to read them.
fn tick_columns(kind: TickKind) -> &'static str {
    match kind {
        TickKind::Price => "p",
        TickKind::Book => "bids, asks",
        TickKind::Trade => "price, size, side, trade_id",
    }
}

/// A tick from a row `ts, log_partition, log_offset, <tick_columns>`.
fn tick_from_row(kind: TickKind, token_id: &str, r: &rusqlite::Row) -> Result<Tick> {
    let key = TickKey {
        ts: Timestamp(r.get(0)?),
        partition: r.get::<_, i64>(1)? as u32,
        offset: r.get::<_, i64>(2)? as u64,
    };
    let value = match kind {
        TickKind::Price => TickValue::Price { p: r.get(3)? },
        TickKind::Book => TickValue::Book {
            bids: r.get(3)?,
            asks: r.get(4)?,
        },
        TickKind::Trade => {
            let side: String = r.get(5)?;
            TickValue::Trade {
                price: r.get(3)?,
                size: r.get(4)?,
                side: TradeSide::parse(&side)
                    .ok_or_else(|| Error::Corrupt(format!("trade side {side:?}")))?,
                trade_id: r.get(6)?,
            }
        }
    };
    Ok(Tick {
        token_id: token_id.to_string(),
        key,
        value,
    })
}

fn opt_ms(t: Option<Timestamp>) -> Option<i64> {
    t.map(|t| t.millis())
}

/// What became of one catalog record.
enum Decision {
    /// Stored, or older than the stored version (and so left out).
    Done,
    /// Not stored: it contradicts the stored catalog.
    Refused(Reject),
}

/// Why a market version may not be stored: one of its tokens is listed
/// under another market, or its slug is another market's. `None` also for
/// a version that is not newer than the stored one (the upsert leaves it
/// out anyway).
fn market_refusal(tx: &Transaction, m: &MarketRecord, off: i64) -> Result<Option<Reject>> {
    let stored: Option<(i64, i64)> = tx
        .prepare_cached("SELECT updated_at, version_offset FROM markets WHERE id = ?1")?
        .query_row(params![m.id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if stored.is_some_and(|v| (m.updated_at.millis(), off) <= v) {
        return Ok(None);
    }
    let mut claims = Lookups::default();
    for t in &m.tokens {
        let owner: Option<String> = tx
            .prepare_cached("SELECT market_id FROM tokens WHERE token_id = ?1")?
            .query_row(params![t.id], |r| r.get(0))
            .optional()?;
        if let Some(owner) = owner {
            claims.tokens.insert(t.id.clone(), owner);
        }
    }
    let slug_owner: Option<String> = tx
        .prepare_cached("SELECT id FROM markets WHERE slug = ?1 AND id <> ?2 ORDER BY id LIMIT 1")?
        .query_row(params![m.slug, m.id], |r| r.get(0))
        .optional()?;
    if let Some(owner) = slug_owner {
        claims.slugs.insert(m.slug.clone(), owner);
    }
    Ok(market_conflict(&claims, m))
}

/// Upserts one catalog record if it is newer than the stored version and,
/// for a market, takes no other market's token or slug.
fn write_catalog(
    tx: &Transaction,
    pos: Position,
    event: &Event,
    seq: &mut i64,
) -> Result<Decision> {
    let body = codec::encode(event);
    let off = pos.offset as i64;
    let next = *seq + 1;
    match event {
        Event::Series(s) => {
            let changed = tx.prepare_cached(
                "INSERT INTO series VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (id) DO UPDATE SET slug=excluded.slug, title=excluded.title, tags=excluded.tags,
                   start_date=excluded.start_date, end_date=excluded.end_date, created_at=excluded.created_at,
                   updated_at=excluded.updated_at, version_offset=excluded.version_offset, body=excluded.body, change_seq=excluded.change_seq
                 WHERE (excluded.updated_at, excluded.version_offset) > (series.updated_at, series.version_offset)",
            )?
            .execute(params![
                s.id,
                s.slug,
                s.title,
                serde_json::to_string(&s.tags).expect("strings serialize"),
                opt_ms(s.start_date),
                opt_ms(s.end_date),
                s.created_at.millis(),
                s.updated_at.millis(),
                off,
                body,
                next
            ])?;
            if changed > 0 {
                *seq = next;
            }
        }
        Event::Event(e) => {
            let changed = tx.prepare_cached(
                "INSERT INTO events VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (id) DO UPDATE SET slug=excluded.slug, series_id=excluded.series_id, title=excluded.title,
                   tags=excluded.tags, start_date=excluded.start_date, end_date=excluded.end_date,
                   created_at=excluded.created_at, updated_at=excluded.updated_at,
                   version_offset=excluded.version_offset, body=excluded.body, change_seq=excluded.change_seq
                 WHERE (excluded.updated_at, excluded.version_offset) > (events.updated_at, events.version_offset)",
            )?
            .execute(params![
                e.id,
                e.slug,
                e.series_id,
                e.title,
                serde_json::to_string(&e.tags).expect("strings serialize"),
                opt_ms(e.start_date),
                opt_ms(e.end_date),
                e.created_at.millis(),
                e.updated_at.millis(),
                off,
                body,
                next
            ])?;
            if changed > 0 {
                *seq = next;
            }
        }
        Event::Market(m) => {
            if let Some(reason) = market_refusal(tx, m, off)? {
                return Ok(Decision::Refused(reason));
            }
            let changed = tx
                .prepare_cached(
                    "INSERT INTO markets VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                     ON CONFLICT (id) DO UPDATE SET slug=excluded.slug, event_id=excluded.event_id,
                       question=excluded.question, status=excluded.status, start_date=excluded.start_date,
                       end_date=excluded.end_date, created_at=excluded.created_at, updated_at=excluded.updated_at,
                       version_offset=excluded.version_offset, body=excluded.body, change_seq=excluded.change_seq
                     WHERE (excluded.updated_at, excluded.version_offset) > (markets.updated_at, markets.version_offset)",
                )?
                .execute(params![
                    m.id,
                    m.slug,
                    m.event_id,
                    m.question,
                    m.status,
                    opt_ms(m.start_date),
                    opt_ms(m.end_date),
                    m.created_at.millis(),
                    m.updated_at.millis(),
                    off,
                    body,
                    next
                ])?;
            if changed > 0 {
                *seq = next;
                tx.prepare_cached("DELETE FROM tokens WHERE market_id = ?1")?
                    .execute(params![m.id])?;
                for (ord, t) in m.tokens.iter().enumerate() {
                    tx.prepare_cached("INSERT OR REPLACE INTO tokens VALUES (?1, ?2, ?3, ?4)")?
                        .execute(params![t.id, m.id, t.label, ord as i64])?;
                }
            }
        }
        other => return Err(not_catalog(other)),
    }
    Ok(Decision::Done)
}

fn not_catalog(event: &Event) -> Error {
    Error::Io(format!("{} is not a catalog record", event.kind().as_str()))
}

/// Writes the catalog records of one apply in order, each decided once (see
/// `catalog_consumed`); returns the refused ones.
fn write_catalog_records(tx: &Transaction, catalog: &[(Position, Event)]) -> Result<Applied> {
    let mut applied = Applied::default();
    if catalog.is_empty() {
        return Ok(applied);
    }
    let start: i64 = tx
        .prepare_cached("SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'catalog_seq'")?
        .query_row([], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    let mut seq = start;
    let mut decided: std::collections::BTreeMap<u32, u64> = Default::default();
    for (pos, event) in catalog {
        if !matches!(event, Event::Series(_) | Event::Event(_) | Event::Market(_)) {
            return Err(not_catalog(event));
        }
        let next = match decided.get(&pos.partition) {
            Some(next) => *next,
            None => tx
                .prepare_cached("SELECT next_offset FROM catalog_consumed WHERE partition = ?1")?
                .query_row(params![pos.partition as i64], |r| r.get::<_, i64>(0))
                .optional()?
                .map_or(0, |n| n as u64),
        };
        if pos.offset < next {
            decided.insert(pos.partition, next);
            continue;
        }
        if let Decision::Refused(reason) = write_catalog(tx, *pos, event, &mut seq)? {
            applied.refused.push(Refused {
                position: *pos,
                id: event.key().to_string(),
                reason,
            });
        }
        decided.insert(pos.partition, pos.offset + 1);
    }
    for (partition, next) in decided {
        tx.prepare_cached("INSERT OR REPLACE INTO catalog_consumed VALUES (?1, ?2)")?
            .execute(params![partition as i64, next as i64])?;
    }
    if seq != start {
        tx.prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES ('catalog_seq', ?1)")?
            .execute(params![seq.to_string()])?;
    }
    Ok(applied)
}

#[async_trait]
impl ProjectionStore for SqliteStore {
    async fn committed(&self) -> CResult<Vec<Position>> {
        self.read("committed", |conn| {
            let mut stmt =
                conn.prepare("SELECT partition, next_offset FROM consumed ORDER BY partition")?;
            let rows = stmt.query_map([], |r| {
                Ok(Position {
                    partition: r.get::<_, i64>(0)? as u32,
                    offset: r.get::<_, i64>(1)? as u64,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn load(&self, keys: Vec<RowKey>) -> CResult<Vec<Row>> {
        // On the writer connection: the projector is the only writer, and it
        // must see its own latest commit.
        self.write("load_rows", move |conn| {
            let mut keys = keys;
            keys.sort_unstable_by(key_order);
            let tx = conn.transaction()?;
            let mut out = Vec::with_capacity(keys.len());
            for key in &keys {
                if let Some(row) = load_one(&tx, key)? {
                    out.push(row);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn lookup_tokens(&self, token_ids: Vec<String>) -> CResult<Vec<TokenRef>> {
        self.read("read_token", move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT market_id, label FROM tokens WHERE token_id = ?1")?;
            let mut out = Vec::new();
            for id in token_ids {
                let found = stmt
                    .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                if let Some((market_id, label)) = found {
                    out.push(TokenRef {
                        token_id: id,
                        market_id,
                        label,
                    });
                }
            }
            Ok(out)
        })
        .await
    }

    async fn apply(&self, write: ProjectionWrite) -> CResult<Applied> {
        self.write("apply", move |conn| {
            // IMMEDIATE: take the write lock first (waiting for it), rather
            // than upgrading a read snapshot another writer may have moved
            // past — which SQLite refuses at once. Several Kafka-mode
            // projectors can share one embedded store.
            let mut write = write;
            write.rows.sort_by(|a, b| key_order(&a.key, &b.key));
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            for row in &write.rows {
                write_row(&tx, row)?;
            }
            for tick in &write.ticks {
                write_tick(&tx, tick)?;
            }
            let applied = write_catalog_records(&tx, &write.catalog)?;
            for pos in &write.consumed {
                tx.prepare_cached("INSERT OR REPLACE INTO consumed VALUES (?1, ?2)")?
                    .execute(params![pos.partition as i64, pos.offset as i64 + 1])?;
            }
            tx.commit()?;
            Ok(applied)
        })
        .await
    }

    async fn reset(&self) -> CResult<()> {
        self.write("reset", |conn| {
            let tx = conn.transaction()?;
            for table in DERIVED_TABLES {
                tx.execute(&format!("DELETE FROM {table}"), [])?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }
}

fn range_params(id: &str, r: &Range) -> (String, &'static str, i64, i64, i64) {
    (
        id.to_string(),
        r.res.as_str(),
        r.start.millis(),
        r.end.millis(),
        r.limit as i64,
    )
}

#[async_trait]
impl ReadStore for SqliteStore {
    async fn prices(&self, token_id: &str, range: Range) -> CResult<Vec<PricePoint>> {
        let p = range_params(token_id, &range);
        self.read("read_prices", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT bucket, sum, count FROM price_buckets
                 WHERE token_id=?1 AND res=?2 AND bucket>=?3 AND bucket<?4 ORDER BY bucket LIMIT ?5",
            )?;
            let rows = stmt.query_map(params![p.0, p.1, p.2, p.3, p.4], |r| {
                let sum: f64 = r.get(1)?;
                let count: i64 = r.get(2)?;
                Ok(PricePoint { t: Timestamp(r.get(0)?), p: sum / count as f64 })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn candles(&self, token_id: &str, range: Range) -> CResult<Vec<CandlePoint>> {
        let p = range_params(token_id, &range);
        self.read("read_candles", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT bucket, count, open_ts, open_offset, open_p, close_ts, close_offset, close_p, high, low
                 FROM price_buckets
                 WHERE token_id=?1 AND res=?2 AND bucket>=?3 AND bucket<?4 ORDER BY bucket LIMIT ?5",
            )?;
            let rows = stmt.query_map(params![p.0, p.1, p.2, p.3, p.4], |r| {
                Ok(CandlePoint {
                    t: Timestamp(r.get(0)?),
                    count: r.get::<_, i64>(1)? as u64,
                    candle: candle_at(r, 2)?,
                    trades: None,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn metrics(&self, market_id: &str, range: Range) -> CResult<Vec<MetricsPoint>> {
        let p = range_params(market_id, &range);
        self.read("read_metrics", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT bucket, volume_sum, liquidity_sum, spread_sum, count FROM metric_buckets
                 WHERE market_id=?1 AND res=?2 AND bucket>=?3 AND bucket<?4 ORDER BY bucket LIMIT ?5",
            )?;
            let rows = stmt.query_map(params![p.0, p.1, p.2, p.3, p.4], |r| {
                let n = r.get::<_, i64>(4)? as f64;
                Ok(MetricsPoint {
                    t: Timestamp(r.get(0)?),
                    volume: r.get::<_, f64>(1)? / n,
                    liquidity: r.get::<_, f64>(2)? / n,
                    spread: r.get::<_, f64>(3)? / n,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn books(&self, token_id: &str, range: Range) -> CResult<Vec<BookPoint>> {
        let p = range_params(token_id, &range);
        self.read("read_books", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT bucket, bids, asks FROM book_buckets
                 WHERE token_id=?1 AND res=?2 AND bucket>=?3 AND bucket<?4 ORDER BY bucket LIMIT ?5",
            )?;
            let rows = stmt.query_map(params![p.0, p.1, p.2, p.3, p.4], |r| {
                Ok(BookPoint { t: Timestamp(r.get(0)?), bids: r.get(1)?, asks: r.get(2)? })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn count(&self, table: Table, id: &str, range: Range) -> CResult<u64> {
        let p = range_params(id, &range);
        let (name, id_col) = match table {
            Table::Prices => ("price_buckets", "token_id"),
            Table::Metrics => ("metric_buckets", "market_id"),
            Table::Books => ("book_buckets", "token_id"),
        };
        let sql = format!(
            "SELECT count(*) FROM {name} WHERE {id_col}=?1 AND res=?2 AND bucket>=?3 AND bucket<?4"
        );
        self.read("count_rows", move |conn| {
            let n: i64 = conn
                .prepare_cached(&sql)?
                .query_row(params![p.0, p.1, p.2, p.3], |r| r.get(0))?;
            Ok(n as u64)
        })
        .await
    }

    async fn count_ticks(
        &self,
        kind: TickKind,
        token_id: &str,
        start: Timestamp,
        end: Timestamp,
    ) -> CResult<u64> {
        let id = token_id.to_string();
        // The primary key's index range: counted without reading the rows.
        let sql = format!(
            "SELECT count(*) FROM {} WHERE token_id = ?1 AND ts >= ?2 AND ts < ?3",
            kind.as_str()
        );
        self.read("count_ticks", move |conn| {
            let n: i64 = conn
                .prepare_cached(&sql)?
                .query_row(params![id, start.millis(), end.millis()], |r| r.get(0))?;
            Ok(n as u64)
        })
        .await
    }

    async fn ticks(&self, kind: TickKind, token_id: &str, range: TickRange) -> CResult<Vec<Tick>> {
        let id = token_id.to_string();
        self.read("read_ticks", move |conn| {
            // Row values: the primary key's index is scanned from `from`.
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT ts, log_partition, log_offset, {} FROM {}
                 WHERE token_id = ?1 AND (ts, log_partition, log_offset) >= (?2, ?3, ?4) AND ts < ?5
                 ORDER BY ts, log_partition, log_offset LIMIT ?6",
                tick_columns(kind),
                kind.as_str()
            ))?;
            let from = range.from;
            let mut rows = stmt.query(params![
                id,
                from.ts.millis(),
                from.partition as i64,
                from.offset as i64,
                range.end.millis(),
                range.limit as i64
            ])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(tick_from_row(kind, &id, r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn book_at(
        &self,
        token_id: &str,
        since: Timestamp,
        at: Timestamp,
    ) -> CResult<Option<Tick>> {
        let id = token_id.to_string();
        self.read("read_book_at", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT ts, log_partition, log_offset, bids, asks FROM book_ticks
                 WHERE token_id = ?1 AND ts >= ?2 AND ts <= ?3
                 ORDER BY ts DESC, log_partition DESC, log_offset DESC LIMIT 1",
            )?;
            let mut rows = stmt.query(params![id, since.millis(), at.millis()])?;
            rows.next()?
                .map(|r| tick_from_row(TickKind::Book, &id, r))
                .transpose()
        })
        .await
    }

    async fn token(&self, token_id: &str) -> CResult<Option<TokenRef>> {
        let id = token_id.to_string();
        self.read("read_token", move |conn| {
            Ok(conn
                .prepare_cached("SELECT market_id, label FROM tokens WHERE token_id = ?1")?
                .query_row(params![id], |r| {
                    Ok(TokenRef {
                        token_id: id.clone(),
                        market_id: r.get(0)?,
                        label: r.get(1)?,
                    })
                })
                .optional()?)
        })
        .await
    }

    async fn market(&self, id_or_slug: &str) -> CResult<Option<MarketRecord>> {
        let key = id_or_slug.to_string();
        self.read("read_market", move |conn| {
            let body: Option<Vec<u8>> = conn
                .prepare_cached(
                    "SELECT body FROM markets WHERE id = ?1
                     UNION ALL SELECT body FROM (SELECT body FROM markets WHERE slug = ?1 ORDER BY updated_at DESC LIMIT 1)
                     LIMIT 1",
                )?
                .query_row(params![key], |r| r.get(0))
                .optional()?;
            match body.map(|b| codec::decode(&b)) {
                None => Ok(None),
                Some(Ok(Event::Market(m))) => Ok(Some(m)),
                Some(other) => Err(Error::Corrupt(format!("market body decodes to {other:?}"))),
            }
        })
        .await
    }

    async fn catalog_changes(
        &self,
        since: Option<&CatalogCursor>,
    ) -> CResult<(Vec<Event>, CatalogCursor)> {
        // The cursor is the change sequence after the newest change seen
        // (see `change_seq` in the schema). The meta table, and so the
        // sequence, survives `reset`: cursors held across a rebuild stay valid.
        let since = since.map_or(0, |s| s.backend_value() as i64);
        self.read("catalog_changes", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT change_seq, body FROM series WHERE change_seq >= ?1
                 UNION ALL SELECT change_seq, body FROM events WHERE change_seq >= ?1
                 UNION ALL SELECT change_seq, body FROM markets WHERE change_seq >= ?1
                 ORDER BY 1",
            )?;
            let mut rows = stmt.query(params![since])?;
            let (mut out, mut last) = (Vec::new(), since);
            while let Some(r) = rows.next()? {
                let seq: i64 = r.get(0)?;
                out.push(decode_catalog(
                    seq,
                    r.get_ref(1)?
                        .as_blob()
                        .map_err(|e| Error::Corrupt(e.to_string()))?,
                )?);
                last = last.max(seq + 1);
            }
            Ok((out, CatalogCursor::from_backend(last as u64)))
        })
        .await
    }
}

fn decode_catalog(seq: i64, body: &[u8]) -> Result<Event> {
    codec::decode(body).map_err(|e| Error::Corrupt(format!("catalog body of change {seq}: {e}")))
}

/// A stored key whose hash is not 32 bytes is corrupt, not a key.
fn key_from_row(r: &rusqlite::Row) -> Result<ApiKeyRecord> {
    let key_id: String = r.get(0)?;
    let hash: Vec<u8> = r.get(1)?;
    let hash = hash.try_into().map_err(|h: Vec<u8>| {
        Error::Corrupt(format!("api key {key_id}: hash of {} bytes", h.len()))
    })?;
    Ok(ApiKeyRecord {
        key_id,
        hash,
        organization: r.get(2)?,
        plan: r.get(3)?,
        created_at: Timestamp(r.get(4)?),
        revoked_at: r.get::<_, Option<i64>>(5)?.map(Timestamp),
    })
}

#[async_trait]
impl AuthStore for SqliteStore {
    async fn put_key(&self, key: ApiKeyRecord) -> CResult<()> {
        self.write("put_key", move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO api_keys VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    key.key_id,
                    key.hash.to_vec(),
                    key.organization,
                    key.plan,
                    key.created_at.millis(),
                    key.revoked_at.map(|t| t.millis())
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn key_by_hash(&self, hash: [u8; 32]) -> CResult<Option<ApiKeyRecord>> {
        self.read("read_key", move |conn| {
            let mut stmt = conn.prepare_cached("SELECT * FROM api_keys WHERE hash = ?1")?;
            let mut rows = stmt.query(params![hash.to_vec()])?;
            rows.next()?.map(key_from_row).transpose()
        })
        .await
    }

    async fn take_hit(&self, key_id: &str, now: Timestamp, limit: u32) -> CResult<RateHits> {
        self.limits.take_hit(key_id, now, limit).await
    }

    async fn rate_hits(&self, key_id: &str, now: Timestamp) -> CResult<Vec<Timestamp>> {
        self.limits.rate_hits(key_id, now).await
    }

    async fn list_keys(&self) -> CResult<Vec<ApiKeyRecord>> {
        self.read("list_keys", |conn| {
            let mut stmt = conn.prepare("SELECT * FROM api_keys ORDER BY created_at")?;
            let mut rows = stmt.query([])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(key_from_row(r)?);
            }
            Ok(out)
        })
        .await
    }
}
