//! The embedded read store: bucket tables, catalog and API keys in `store.db`
//! (and the rate-limit log in `limits.db`, [`crate::limits`]).

use crate::bucketblock::{self, Entry};
use crate::checkpoint::{backstop_pages, Checkpointer};
use crate::db::{blocking, open, open_paged, Durability, Pool, ReadTx};
use crate::head::{self, Head};
use crate::headmerge;
use crate::limits::RateLog;
use crate::rowcodec;
use crate::stamp::Stamps;
use crate::tickblock::{self, PriceTick};
use crate::{CResult, Error, Result};
use async_trait::async_trait;
use hindsight_contracts::*;
use hindsight_schemas::claims::{market_conflict, Lookups};
use hindsight_schemas::wire::Reject;
use hindsight_schemas::{codec, Event, MarketRecord, Resolution, Timestamp, TradeSide};
use hindsight_telemetry as tm;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use rustc_hash::FxHashMap;
use std::borrow::Cow;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bumped when the layout below changes; recorded in `meta`. Version 3
/// adds `catalog_consumed` (created empty on open: a store of version 2
/// decided its catalog records already, and replays start after them).
/// Version 4 adds the tick-level tables `price_ticks`, `book_ticks`,
/// `trades` and `trade_ids`, created empty on open: events projected
/// before have no ticks until `hindsight rebuild` replays the log.
/// Version 5 adds the candle of `price_buckets`, absent in rows an older
/// version wrote: those buckets have no candle until `hindsight rebuild`
/// (the API says so rather than serve a candle of part of a bucket).
/// Version 6 keys the series tables by integer `sid` (`series_ids`) and
/// integer `res` ([`res_code`]), and packs a price bucket's sum and candle
/// into one blob (`crate::rowcodec`); opening an older store converts it
/// in place (`migrate_series_tables`), history intact, without a replay.
/// Version 7 keeps price ticks in blocks of up to
/// `tickblock::BLOCK_TICKS` (`price_tick_blocks`, `crate::tickblock`)
/// instead of a row each; opening an older store packs its `price_ticks`
/// into blocks (`migrate_price_ticks`).
/// Version 8 keeps price buckets in blocks of a window of
/// `bucketblock::BLOCK_BUCKETS` buckets (`price_bucket_blocks`,
/// `crate::bucketblock`) instead of a row each; opening an older store
/// packs its `price_buckets` into blocks (`migrate_v7_price_buckets`).
/// Version 9 keys `price_bucket_blocks` by time first, `(res, block,
/// sid)`, with an index by series (`price_bucket_blocks_by_series`): a
/// live step rewrites the open block of every token it touches, and keyed
/// by series first those blocks lay one to a page all over the table. An
/// older store's blocks are copied into the new key order
/// (`migrate_v8_price_blocks`), byte for byte.
/// Version 10 keeps each token's newest price block at every resolution
/// and its newest price tick block in one row of `price_heads`
/// (`crate::head`), the others in `price_bucket_blocks_past` and
/// `price_tick_blocks_past`; the views `price_bucket_blocks` and
/// `price_tick_blocks` show the two parts as one, as version 9's tables
/// were. An older store's tables are renamed and each token's newest
/// blocks moved into its head (`migrate_v9_heads`), byte for byte.
pub const SCHEMA_VERSION: i64 = 10;

/// The code of a resolution in the bucket tables' `res` column: its width
/// in minutes. Stored in every bucket row, so stable forever: a new
/// resolution takes its own width, an existing one never changes code.
pub const fn res_code(r: Resolution) -> i64 {
    match r {
        Resolution::M1 => 1,
        Resolution::M5 => 5,
        Resolution::M10 => 10,
        Resolution::M15 => 15,
        Resolution::H1 => 60,
        Resolution::H6 => 360,
        Resolution::D1 => 1440,
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

-- Series ids: the integer `sid` each series table keys a token (or, in
-- `metric_buckets`, a market) by, so keys compare as integers and rows
-- do not repeat the id's text. An id allocation, not derived data:
-- `reset` keeps it, and a sid never changes meaning in this file (the
-- writer caches them). One namespace for tokens and markets.
CREATE TABLE IF NOT EXISTS series_ids (sid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);

-- Buckets. `res` is the resolution's code (its width in minutes, see
-- `res_code`), `bucket` its start in Unix milliseconds, `last_offset` the
-- log offset of the last event folded in.
--
-- Price buckets in blocks: a row holds a token's buckets at `res` in the
-- window of `bucketblock::BLOCK_BUCKETS` buckets starting at `block`; `n`
-- is how many, `ticks` the sum of their counts, and `v` the buckets (see
-- `bucketblock`), each with its count, `last_offset` and a value packing
-- its sum and candle (the open and close ticks, the high and the low;
-- none in a bucket migrated from before version 5, see `rowcodec`).
-- A token's newest block at each resolution is in its head
-- (`price_heads`, `crate::head`); this table holds the others. Keyed by
-- time first (from version 9, when it held the newest blocks too, which
-- a step rewrites: side by side in the windows being filled rather than
-- one to a page across the table). A series' blocks are read through
-- `price_bucket_blocks_by_series`, named in each such query (`INDEXED
-- BY`): on `res = ?` the planner would rather scan the key.
CREATE TABLE IF NOT EXISTS price_bucket_blocks_past (
    sid INTEGER NOT NULL, res INTEGER NOT NULL, block INTEGER NOT NULL,
    n INTEGER NOT NULL, ticks INTEGER NOT NULL, v BLOB NOT NULL,
    PRIMARY KEY (res, block, sid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS price_bucket_blocks_by_series
    ON price_bucket_blocks_past (sid, res, block);
CREATE TABLE IF NOT EXISTS metric_buckets (
    sid INTEGER NOT NULL, res INTEGER NOT NULL, bucket INTEGER NOT NULL,
    volume_sum REAL NOT NULL, liquidity_sum REAL NOT NULL, spread_sum REAL NOT NULL,
    count INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (sid, res, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS book_buckets (
    sid INTEGER NOT NULL, res INTEGER NOT NULL, bucket INTEGER NOT NULL,
    ts INTEGER NOT NULL, snapshot_offset INTEGER NOT NULL,
    bids TEXT NOT NULL, asks TEXT NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (sid, res, bucket)
) WITHOUT ROWID;

-- Tick level: every price tick, book snapshot and trade as ingested, per
-- token in (ts, log position) order. The key is the tick's identity, so a
-- replayed event rewrites its own row (or, for price ticks, its own entry
-- of its block). `trade_ids` keeps, per token and trade id, the position
-- of the one trade stored under it.
--
-- Price ticks: a row holds `n` of a token's ticks, encoded by `tickblock`,
-- and is keyed by the first; a tick is in the block with the greatest key
-- at or before its own. A token's last block is in its head
-- (`price_heads`); this table holds the others.
CREATE TABLE IF NOT EXISTS price_tick_blocks_past (
    sid INTEGER NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, n INTEGER NOT NULL, v BLOB NOT NULL,
    PRIMARY KEY (sid, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS book_ticks (
    sid INTEGER NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, bids TEXT NOT NULL, asks TEXT NOT NULL,
    PRIMARY KEY (sid, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trades (
    sid INTEGER NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, price REAL NOT NULL, size REAL NOT NULL,
    side TEXT NOT NULL, trade_id TEXT,
    PRIMARY KEY (sid, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trade_ids (
    sid INTEGER NOT NULL, trade_id TEXT NOT NULL,
    log_partition INTEGER NOT NULL, log_offset INTEGER NOT NULL,
    PRIMARY KEY (sid, trade_id)
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
    "price_heads",
    "price_bucket_blocks_past",
    "metric_buckets",
    "book_buckets",
    "price_tick_blocks_past",
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

/// Brings the catalog tables of an older `store.db` to [`SCHEMA_VERSION`].
/// Version 1 ordered catalog changes by log offset; version 2 adds
/// `change_seq`. Existing records keep sequence 0: a full read lists them,
/// and every cursor handed out before was held in memory by a process now
/// restarted.
fn migrate_catalog(conn: &Connection) -> Result<()> {
    for table in ["series", "events", "markets"] {
        if !has_column(conn, table, "change_seq")? {
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

fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists(params![table, column])?)
}

/// The series tables, each with the text id column that keyed it before
/// version 6 (now `sid`). Every other column kept its name and place.
const SERIES_TABLES: [(&str, &str); 7] = [
    ("price_buckets", "token_id"),
    ("metric_buckets", "market_id"),
    ("book_buckets", "token_id"),
    ("price_ticks", "token_id"),
    ("book_ticks", "token_id"),
    ("trades", "token_id"),
    ("trade_ids", "token_id"),
];

/// Moves the series tables of a store older than version 6 aside (as
/// `v5_<table>`), for [`migrate_series_tables`] to copy once [`SCHEMA`]
/// created the new ones. Returns those moved: a store older than version 4
/// has no tick tables. Nothing on a store of version 6 or a new one.
fn move_old_series_tables(conn: &Connection) -> Result<Vec<(&'static str, &'static str)>> {
    if !has_column(conn, "price_buckets", "token_id")? {
        return Ok(Vec::new());
    }
    let mut moved = Vec::new();
    for (table, id) in SERIES_TABLES {
        if has_column(conn, table, id)? {
            conn.execute_batch(&format!("ALTER TABLE {table} RENAME TO v5_{table}"))?;
            moved.push((table, id));
        }
    }
    Ok(moved)
}

/// Copies the series tables [`move_old_series_tables`] moved aside into
/// the version 6 layout and drops them: each id gets its `sid`, each
/// resolution name its code, each price bucket its `v` (no candle in rows
/// from before version 5: they keep answering without one). In the open's
/// transaction, so a crash leaves the old layout whole and the next open
/// starts over; no replay, since a Kafka log may have lost the events.
fn migrate_series_tables(conn: &Connection, moved: &[(&str, &str)]) -> Result<()> {
    if moved.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    let mut rows = 0;
    for (table, id) in moved {
        conn.execute(
            &format!(
                "INSERT OR IGNORE INTO series_ids (name) SELECT DISTINCT {id} FROM v5_{table}"
            ),
            [],
        )?;
    }
    for (table, id) in moved {
        rows += match *table {
            "price_buckets" => {
                conn.execute_batch(V7_PRICE_BUCKETS)?;
                migrate_price_buckets(conn)?
            }
            "price_ticks" => migrate_price_ticks(
                conn,
                "SELECT s.sid, o.ts, o.log_partition, o.log_offset, o.p
                 FROM v5_price_ticks o JOIN series_ids s ON s.name = o.token_id",
            )?,
            _ => migrate_series_table(conn, table, id)?,
        };
        conn.execute_batch(&format!("DROP TABLE v5_{table}"))?;
    }
    tracing::info!(
        rows,
        tables = moved.len(),
        seconds = started.elapsed().as_secs_f64(),
        "store.db: series tables migrated to schema version {SCHEMA_VERSION}"
    );
    Ok(())
}

/// The resolution code of a stored resolution name; `Corrupt` for a name
/// no resolution has.
fn res_code_of_name(table: &str, name: &str) -> Result<i64> {
    Resolution::parse(name)
        .map(res_code)
        .ok_or_else(|| Error::Corrupt(format!("{table}: unknown resolution {name:?}")))
}

/// Copies one old series table other than `price_buckets` in SQL: its
/// columns but the id are the new table's (`res` translated to its code).
fn migrate_series_table(conn: &Connection, table: &str, id: &str) -> Result<usize> {
    let columns: Vec<String> = conn
        .prepare(&format!(
            "SELECT name FROM pragma_table_info('{table}') WHERE name <> 'sid' ORDER BY cid"
        ))?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if columns.iter().any(|c| c == "res") {
        let names: Vec<String> = conn
            .prepare(&format!("SELECT DISTINCT res FROM v5_{table}"))?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for name in names {
            res_code_of_name(table, &name)?;
        }
    }
    let res_case: String = Resolution::ALL
        .iter()
        .map(|r| format!(" WHEN '{}' THEN {}", r.as_str(), res_code(*r)))
        .collect();
    let select: Vec<String> = columns
        .iter()
        .map(|c| match c.as_str() {
            "res" => format!("CASE o.res{res_case} END"),
            c => format!("o.{c}"),
        })
        .collect();
    Ok(conn.execute(
        &format!(
            "INSERT INTO {table} (sid, {}) SELECT s.sid, {} FROM v5_{table} o
             JOIN series_ids s ON s.name = o.{id}",
            columns.join(", "),
            select.join(", ")
        ),
        [],
    )?)
}

/// Packs the price ticks of an older store into blocks: `select` yields
/// `sid, ts, log_partition, log_offset, p`. A store of version 6 keeps
/// them in `price_ticks` (dropped once packed); an older one in the table
/// [`move_old_series_tables`] moved aside.
fn migrate_price_ticks(conn: &Connection, select: &str) -> Result<usize> {
    let mut read = conn.prepare(&format!("{select} ORDER BY 1, 2, 3, 4"))?;
    let mut rows = read.query([])?;
    let mut inserts = Inserts::new(conn);
    let (mut sid, mut ticks) = (0, Vec::new());
    let mut n = 0;
    while let Some(r) = rows.next()? {
        let next_sid: i64 = r.get(0)?;
        if next_sid != sid && !ticks.is_empty() {
            inserts.put_price_blocks(sid, &ticks)?;
            ticks.clear();
        }
        sid = next_sid;
        ticks.push((key_at(r, 1)?, r.get::<_, f64>(4)?));
        n += 1;
    }
    if !ticks.is_empty() {
        inserts.put_price_blocks(sid, &ticks)?;
    }
    Ok(n)
}

/// Packs the `price_ticks` of a version 6 store into blocks and drops it.
/// Nothing on a store without that table (new, or of version 7).
fn migrate_v6_price_ticks(conn: &Connection) -> Result<()> {
    if !has_column(conn, "price_ticks", "sid")? {
        return Ok(());
    }
    let started = Instant::now();
    let ticks = migrate_price_ticks(
        conn,
        "SELECT sid, ts, log_partition, log_offset, p FROM price_ticks",
    )?;
    conn.execute_batch("DROP TABLE price_ticks")?;
    tracing::info!(
        ticks,
        seconds = started.elapsed().as_secs_f64(),
        "store.db: price ticks packed into blocks (schema version {SCHEMA_VERSION})"
    );
    Ok(())
}

/// `price_buckets` as versions 6 and 7 kept it, a row per bucket: an
/// older store's buckets are copied into it ([`migrate_price_buckets`]),
/// then packed into blocks ([`migrate_v7_price_buckets`]).
const V7_PRICE_BUCKETS: &str = "CREATE TABLE price_buckets (
    sid INTEGER NOT NULL, res INTEGER NOT NULL, bucket INTEGER NOT NULL,
    count INTEGER NOT NULL, last_offset INTEGER NOT NULL, v BLOB NOT NULL,
    PRIMARY KEY (sid, res, bucket)
) WITHOUT ROWID;";

/// Packs the `price_buckets` of a version 6 or 7 store (or one an older
/// store's migration just filled) into blocks, and drops it. Nothing on a
/// store without that table (new, or of version 8). Each bucket's value is
/// kept as stored, so a bucket without a candle keeps answering without.
fn migrate_v7_price_buckets(conn: &Connection) -> Result<()> {
    if !has_column(conn, "price_buckets", "sid")? {
        return Ok(());
    }
    let started = Instant::now();
    let mut read = conn.prepare(
        "SELECT sid, res, bucket, count, last_offset, v FROM price_buckets
         ORDER BY sid, res, bucket",
    )?;
    let mut rows = read.query([])?;
    let mut inserts = Inserts::new(conn);
    // The block being filled, and its buckets' columns.
    let mut block: Option<(i64, i64, i64)> = None;
    let mut pending: Vec<MigratedBucket> = Vec::new();
    let mut n = 0;
    while let Some(r) = rows.next()? {
        let (sid, res, bucket): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        let at = (sid, res, bucketblock::block_of(bucket, width_of_code(res)?));
        if let Some(done) = block.filter(|b| *b != at) {
            put_migrated(&mut inserts, done, &mut pending)?;
        }
        block = Some(at);
        pending.push((
            bucket,
            r.get::<_, i64>(3)? as u64,
            r.get::<_, i64>(4)? as u64,
            r.get(5)?,
        ));
        n += 1;
    }
    if let Some(at) = block {
        put_migrated(&mut inserts, at, &mut pending)?;
    }
    drop(rows);
    drop(read);
    drop(inserts);
    conn.execute_batch("DROP TABLE price_buckets")?;
    tracing::info!(
        buckets = n,
        seconds = started.elapsed().as_secs_f64(),
        "store.db: price buckets packed into blocks (schema version {SCHEMA_VERSION})"
    );
    Ok(())
}

/// Moves a `price_bucket_blocks` keyed by series first (version 8) aside,
/// as `v8_price_bucket_blocks`, for [`migrate_v8_price_blocks`] to copy
/// once [`SCHEMA`] created the table keyed by time first. Whether it did.
fn move_v8_price_blocks(conn: &Connection) -> Result<bool> {
    let sid_first = conn
        .prepare_cached(
            "SELECT 1 FROM pragma_table_info('price_bucket_blocks') WHERE name = 'sid' AND pk = 1",
        )?
        .exists([])?;
    if sid_first {
        conn.execute_batch("ALTER TABLE price_bucket_blocks RENAME TO v8_price_bucket_blocks")?;
    }
    Ok(sid_first)
}

/// Whether `conn` holds a table named `name`.
fn has_table(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")?
        .exists([name])?)
}

/// Renames the block tables of a version 7 to 9 store (a table where
/// version 10 has a view of the same name) to their version 10 names; the
/// index by series follows its table. [`migrate_v9_heads`] then moves
/// each token's newest blocks into its head.
fn move_v9_blocks(conn: &Connection) -> Result<()> {
    for (old, new) in [
        ("price_bucket_blocks", "price_bucket_blocks_past"),
        ("price_tick_blocks", "price_tick_blocks_past"),
    ] {
        if has_table(conn, old)? {
            conn.execute_batch(&format!("ALTER TABLE {old} RENAME TO {new}"))?;
        }
    }
    Ok(())
}

/// Moves each token's newest price block at each resolution and its
/// newest tick block out of the full tables into its head (`crate::head`),
/// bytes unchanged: the layout of version 10 for a store written before.
/// One token at a time, so memory stays one head whatever the store holds.
fn migrate_v9_heads(conn: &Connection) -> Result<()> {
    let started = Instant::now();
    let sids: Vec<i64> = conn
        .prepare(
            "SELECT sid FROM price_bucket_blocks_past INDEXED BY price_bucket_blocks_by_series
             GROUP BY sid UNION SELECT sid FROM price_tick_blocks_past ORDER BY 1",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut newest_price = conn.prepare(
        "SELECT block, n, ticks, v FROM price_bucket_blocks_past
         INDEXED BY price_bucket_blocks_by_series
         WHERE sid = ?1 AND res = ?2 ORDER BY block DESC LIMIT 1",
    )?;
    let mut newest_ticks = conn.prepare(
        "SELECT ts, log_partition, log_offset, n, v FROM price_tick_blocks_past
         WHERE sid = ?1 ORDER BY ts DESC, log_partition DESC, log_offset DESC LIMIT 1",
    )?;
    for &sid in &sids {
        let mut h = Head::default();
        for res in Resolution::ALL {
            let code = res_code(res);
            let block = newest_price
                .query_row(params![sid, code], |r| {
                    Ok(head::PriceBlock {
                        block: r.get(0)?,
                        n: r.get::<_, i64>(1)? as u64,
                        ticks: r.get::<_, i64>(2)? as u64,
                        v: r.get(3)?,
                    })
                })
                .optional()?;
            if let Some(p) = &block {
                conn.prepare_cached(
                    "DELETE FROM price_bucket_blocks_past WHERE res = ?1 AND block = ?2 AND sid = ?3",
                )?
                .execute(params![code, p.block, sid])?;
            }
            h.prices[res.index()] = block;
        }
        h.ticks = newest_ticks
            .query_row([sid], |r| {
                Ok(head::TickBlock {
                    start: key_at(r, 0)?,
                    n: r.get::<_, i64>(3)? as u64,
                    v: r.get(4)?,
                })
            })
            .optional()?;
        if let Some(t) = &h.ticks {
            conn.prepare_cached(
                "DELETE FROM price_tick_blocks_past
                 WHERE sid = ?1 AND ts = ?2 AND log_partition = ?3 AND log_offset = ?4",
            )?
            .execute(params![
                sid,
                t.start.ts.millis(),
                t.start.partition,
                t.start.offset as i64
            ])?;
        }
        h.write(conn, sid)?;
    }
    tracing::info!(
        heads = sids.len(),
        seconds = started.elapsed().as_secs_f64(),
        "store.db: each token's newest blocks moved into its head (schema version {SCHEMA_VERSION})"
    );
    Ok(())
}

/// Copies version 8's price blocks into the table keyed by time first, in
/// its key order, and drops the old table. The blocks are the same bytes:
/// only their key order changes.
fn migrate_v8_price_blocks(conn: &Connection) -> Result<()> {
    let started = Instant::now();
    let n = conn.execute(
        "INSERT INTO price_bucket_blocks_past (sid, res, block, n, ticks, v)
         SELECT sid, res, block, n, ticks, v FROM v8_price_bucket_blocks ORDER BY res, block, sid",
        [],
    )?;
    conn.execute_batch("DROP TABLE v8_price_bucket_blocks")?;
    tracing::info!(
        blocks = n,
        seconds = started.elapsed().as_secs_f64(),
        "store.db: price blocks keyed by time first (schema version {SCHEMA_VERSION})"
    );
    Ok(())
}

/// A migrated bucket: its `bucket`, `count`, `last_offset` and `v`.
type MigratedBucket = (i64, u64, u64, Vec<u8>);

/// Writes the block `at` holding `buckets` (ascending), and empties them.
fn put_migrated(
    inserts: &mut Inserts,
    at: (i64, i64, i64),
    buckets: &mut Vec<MigratedBucket>,
) -> Result<()> {
    let mut v = Vec::new();
    let mut block = bucketblock::Encoder::new(&mut v, at.2, width_of_code(at.1)?);
    for (bucket, count, last_offset, value) in buckets.iter() {
        block.push(Entry {
            bucket: *bucket,
            count: *count,
            last_offset: *last_offset,
            v: value,
        })?;
    }
    let counts = block.finish();
    inserts.put_price_block(at, counts, &v)?;
    buckets.clear();
    Ok(())
}

/// The width in ms of the resolution stored as `code` ([`res_code`]);
/// `Corrupt` for a code no resolution has.
fn width_of_code(code: i64) -> Result<i64> {
    res_of_code(code).map(Resolution::width_ms)
}

/// The resolution stored as `code` ([`res_code`]); `Corrupt` for a code
/// no resolution has.
fn res_of_code(code: i64) -> Result<Resolution> {
    Resolution::ALL
        .into_iter()
        .find(|r| res_code(*r) == code)
        .ok_or_else(|| Error::Corrupt(format!("unknown resolution code {code}")))
}

/// Copies the old `price_buckets`, row by row: the sum and candle columns
/// become `v`. Before version 5 the table had no candle columns.
fn migrate_price_buckets(conn: &Connection) -> Result<usize> {
    let candle = if has_column(conn, "v5_price_buckets", "open_ts")? {
        "open_ts, open_offset, open_p, close_ts, close_offset, close_p, high, low"
    } else {
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
    };
    let mut read = conn.prepare(&format!(
        "SELECT s.sid, o.res, o.bucket, o.count, o.last_offset, o.sum, {candle}
         FROM v5_price_buckets o JOIN series_ids s ON s.name = o.token_id"
    ))?;
    let mut write = conn.prepare("INSERT INTO price_buckets VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?;
    let mut rows = read.query([])?;
    let mut n = 0;
    while let Some(r) = rows.next()? {
        let res: String = r.get(1)?;
        let bucket: i64 = r.get(2)?;
        let last: i64 = r.get(4)?;
        let v = rowcodec::encode(r.get(5)?, candle_at(r, 6)?.as_ref(), bucket, last as u64);
        write.execute(params![
            r.get::<_, i64>(0)?,
            res_code_of_name("price_buckets", &res)?,
            bucket,
            r.get::<_, i64>(3)?,
            last,
            v
        ])?;
        n += 1;
    }
    Ok(n)
}

/// Page cache of the store's writer connection, in KiB (the other
/// connections keep [`crate::db::WRITER_CACHE_KB`]).
const STORE_WRITER_CACHE_KB: i64 = 32_000;

/// Bytes per page of a store file this version creates; SQLite's default
/// is 4 096, and a file created before keeps its own (`crate::db::open_paged`).
///
/// Why larger: a step's commit appends every page it changed to the WAL,
/// a frame each (two writes and a checksum), and the checkpoint copies
/// each into the file; a step touches the heads of most tokens and the
/// newest blocks of every table, so its cost follows its pages, and at
/// 16 KiB it changes fewer of them. On a long tail (2 000 000 ticks over
/// 2 000 tokens) a `rebuild` wrote with a quarter of the `pwrite` calls
/// (26 837 against 102 042) and half the bytes, and `backfill --project`,
/// alternated three times, took 1.53–1.54 s against 1.72–1.80 s at 4 KiB.
/// Over 20 s of live sending (20 000 tokens, 500 000 events/s) a step's
/// write took 180–187 ms against 236–237 ms, and ack → visible p99 was
/// 0.90–0.92 s against 1.09–1.19 s. 32 KiB measured the same on both and
/// made the dense file's store a tenth larger again (docs/DESIGN.md, "The
/// store's pages are 16 KiB").
const STORE_PAGE_SIZE: u32 = 16_384;

/// The store's one writer connection and its cache of committed sids
/// (`series_ids`): a sid never changes meaning, so once committed it is
/// looked up here rather than in the file.
struct Writer {
    conn: Connection,
    sids: FxHashMap<Arc<str>, i64>,
    /// Woken after each write (see `crate::checkpoint`).
    checkpointer: Checkpointer,
}

pub struct SqliteStore {
    writer: Arc<Mutex<Writer>>,
    readers: Arc<Pool>,
    /// [`ReadStore::version`] and [`AuthStore::version`] (`crate::stamp`).
    stamps: Arc<Stamps>,
    /// The projector's row loads ([`ProjectionStore::load`]), which run
    /// while the writer is busy with the previous segment's write.
    loader: Arc<Mutex<Connection>>,
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
        let mut conn = open_paged(&path, Durability::Normal, Some(STORE_PAGE_SIZE))?;
        // The projector writes through this one connection. Its step's rows
        // land all over the bucket tables (each token's range, at every
        // resolution), so a cache that holds the tables' interior pages and
        // the hot leaves saves a read per row; SQLite allocates it only as
        // pages are read, so a small store costs no more. A larger one
        // (128 MB) measured no faster, on a rebuild or a live drain: a page
        // past it is read from the OS's cache, not the disk, and the
        // process's RSS counts only this one.
        conn.pragma_update(None, "cache_size", -STORE_WRITER_CACHE_KB)?;
        conn.pragma_update(None, "wal_autocheckpoint", backstop_pages(&conn)?)?;
        // One transaction: a crash mid-migration leaves the old layout, and
        // of several processes opening one file the first migrates it.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // A file written before version 10 (it has tables, but no heads)
        // gets its heads from its blocks; a new file has nothing to move.
        let written_before = tx
            .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table'")?
            .exists([])?;
        let headless = written_before && !has_table(&tx, "price_heads")?;
        let moved = move_old_series_tables(&tx)?;
        let v8_blocks = move_v8_price_blocks(&tx)?;
        move_v9_blocks(&tx)?;
        tx.execute_batch(SCHEMA)?;
        tx.execute_batch(head::table_sql())?;
        tx.execute_batch(head::views_sql())?;
        migrate_catalog(&tx)?;
        migrate_series_tables(&tx, &moved)?;
        migrate_v6_price_ticks(&tx)?;
        migrate_v7_price_buckets(&tx)?;
        if v8_blocks {
            migrate_v8_price_blocks(&tx)?;
        }
        if headless {
            migrate_v9_heads(&tx)?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?1)",
            params![SCHEMA_VERSION.to_string()],
        )?;
        tx.commit()?;
        Ok(SqliteStore {
            writer: Arc::new(Mutex::new(Writer {
                conn,
                sids: FxHashMap::default(),
                checkpointer: Checkpointer::start(&path)?,
            })),
            stamps: Arc::new(Stamps::open(&path)?),
            loader: Arc::new(Mutex::new(open(&path, Durability::Normal)?)),
            readers: Arc::new(Pool::new(path, Durability::Normal)),
            limits: RateLog::new(dir),
            accounts: crate::accounts::Accounts::new(dir),
            exports: crate::exports::ExportJobs::new(dir),
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

    /// Runs `f` on the writer connection, then wakes the checkpoint
    /// thread for whatever it committed (see `crate::checkpoint`).
    async fn write<R: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Writer) -> Result<R> + Send + 'static,
    ) -> CResult<R> {
        self.on(op, &self.writer, |w| {
            let out = f(w);
            w.checkpointer.wake();
            out
        })
        .await
    }

    /// Runs `f` on a blocking thread with `conn` locked, timed and counted
    /// by `op`.
    async fn on<C: Send + 'static, R: Send + 'static>(
        &self,
        op: &'static str,
        conn: &Arc<Mutex<C>>,
        f: impl FnOnce(&mut C) -> Result<R> + Send + 'static,
    ) -> CResult<R> {
        let conn = conn.clone();
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

/// The stored row of `key`, whose id has `sid`.
fn load_one(conn: &Connection, sid: i64, key: &RowKey) -> Result<Option<Row>> {
    let k = params![sid, res_code(key.res), key.bucket.millis()];
    let row = match key.table {
        Table::Prices => {
            let at = price_block_of(sid, key);
            // Nothing is stored past the head's window (`crate::head`).
            let v = match head::price_block(conn, sid, key.res)? {
                Some(newest) if newest.block == at.2 => newest.v,
                Some(newest) if newest.block > at.2 => match read_price_block(conn, at)? {
                    Some(v) => v,
                    None => return Ok(None),
                },
                _ => return Ok(None),
            };
            let bucket = key.bucket.millis();
            let mut entries = bucketblock::entries(&v, at.2, key.res.width_ms());
            match entries.find(|e| e.as_ref().map_or(true, |e| e.bucket == bucket)) {
                None => None,
                Some(e) => {
                    let e = e?;
                    let (sum, candle) = rowcodec::decode(e.v, bucket, e.last_offset)?;
                    let count = e.count;
                    Some((RowValue::Price { sum, count, candle }, e.last_offset as i64))
                }
            }
        }
        Table::Metrics => conn
            .prepare_cached(
                "SELECT volume_sum, liquidity_sum, spread_sum, count, last_offset FROM metric_buckets WHERE sid=?1 AND res=?2 AND bucket=?3",
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
                "SELECT ts, snapshot_offset, bids, asks, last_offset FROM book_buckets WHERE sid=?1 AND res=?2 AND bucket=?3",
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

/// The end of the last bucket stored of series `sid` in `table` at `res`
/// (`i64::MIN` when none is): a price block's last entry, the greatest
/// bucket of the other tables. One descent of the table's key each.
fn frontier(conn: &Connection, table: Table, sid: i64, res: Resolution) -> Result<Timestamp> {
    let width = res.width_ms();
    let k = params![sid, res_code(res)];
    let last = match table {
        Table::Prices => {
            // The head holds the series' newest block (`crate::head`).
            match head::price_block(conn, sid, res)? {
                Some(head::PriceBlock { block, v, .. }) => {
                    match bucketblock::entries(&v, block, width).last() {
                        Some(e) => Some(e?.bucket),
                        None => {
                            return Err(Error::Corrupt(format!(
                                "price block {block} of series {sid} is empty"
                            )))
                        }
                    }
                }
                None => None,
            }
        }
        Table::Metrics => conn
            .prepare_cached("SELECT MAX(bucket) FROM metric_buckets WHERE sid = ?1 AND res = ?2")?
            .query_row(k, |r| r.get(0))?,
        Table::Books => conn
            .prepare_cached("SELECT MAX(bucket) FROM book_buckets WHERE sid = ?1 AND res = ?2")?
            .query_row(k, |r| r.get(0))?,
    };
    Ok(Timestamp(last.map_or(i64::MIN, |b: i64| b + width)))
}

/// The candle in the eight columns from `first` on (`open_ts` … `low`) of
/// a `price_buckets` row older than version 6; `None` when the row has
/// none (written before version 5).
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

/// The sids of one write: the writer's cache of committed ones, and those
/// this transaction looked up or inserted — cached only once it commits,
/// so a rolled-back insert leaves no sid behind.
///
/// A write's rows and ticks share their series' ids (see
/// [`hindsight_contracts::Tick`]), so each id is looked up by name once
/// and then by its address: comparing names against the cache's copies,
/// spread over memory, was most of the lookups' time (~8 % of the live
/// writer's samples, a step's ~160 000 ticks). Measured, alternated five
/// times: the long tail's `backfill --project` 1.60–1.65 s against
/// 1.64–1.77; live writes no shorter beyond noise. The map keeps a clone
/// of each id it keys, so no address in it is freed and reused meanwhile.
struct SidLookup<'a> {
    committed: &'a FxHashMap<Arc<str>, i64>,
    fresh: FxHashMap<Arc<str>, i64>,
    by_address: FxHashMap<usize, (Arc<str>, i64)>,
}

impl<'a> SidLookup<'a> {
    fn new(committed: &'a FxHashMap<Arc<str>, i64>) -> Self {
        SidLookup {
            committed,
            fresh: FxHashMap::default(),
            by_address: FxHashMap::default(),
        }
    }

    /// The sid of `id`, allocated if it has none.
    fn sid(&mut self, tx: &Transaction, id: &Arc<str>) -> Result<i64> {
        let address = Arc::as_ptr(id) as *const u8 as usize;
        if let Some((_, sid)) = self.by_address.get(&address) {
            return Ok(*sid);
        }
        let sid = self.by_name(tx, id)?;
        self.by_address.insert(address, (id.clone(), sid));
        Ok(sid)
    }

    /// The sid of `name`, allocated if it has none. `INSERT OR IGNORE`
    /// then `SELECT`: another process sharing the file may have
    /// allocated it since this one cached. The cache keys the caller's
    /// `Arc` (the rollup's interned id), not a copy of it.
    fn by_name(&mut self, tx: &Transaction, name: &Arc<str>) -> Result<i64> {
        if let Some(sid) = self.committed.get(name).or_else(|| self.fresh.get(name)) {
            return Ok(*sid);
        }
        tx.prepare_cached("INSERT OR IGNORE INTO series_ids (name) VALUES (?1)")?
            .execute(params![&**name])?;
        let sid = tx
            .prepare_cached("SELECT sid FROM series_ids WHERE name = ?1")?
            .query_row(params![&**name], |r| r.get(0))?;
        self.fresh.insert(name.clone(), sid);
        Ok(sid)
    }
}

/// The sid of `name` if it has one, read in `conn`'s committed state and
/// so cached at once.
fn committed_sid(
    conn: &Connection,
    cache: &mut FxHashMap<Arc<str>, i64>,
    name: &Arc<str>,
) -> Result<Option<i64>> {
    if let Some(sid) = cache.get(name) {
        return Ok(Some(*sid));
    }
    let sid: Option<i64> = conn
        .prepare_cached("SELECT sid FROM series_ids WHERE name = ?1")?
        .query_row(params![&**name], |r| r.get(0))
        .optional()?;
    if let Some(sid) = sid {
        cache.insert(name.clone(), sid);
    }
    Ok(sid)
}

/// A row's table, sid, resolution code and bucket: see [`key_order`].
pub(crate) type RowOrder = (Table, i64, i64, i64);

/// The order of the bucket tables' primary key (`sid`, `res`, `bucket`;
/// a price block's key, `block`, is its first bucket), table by table.
/// Rows written (and keys looked up) in this order walk each B-tree from
/// left to right: a step's thousands of rows, scattered over every token's
/// range, touch each page once while it is in the page cache instead of in
/// creation order, which revisits pages long evicted, and the rows of one
/// price block come together. The keys are distinct rows, so the order
/// changes no outcome.
fn key_order(sid: i64, key: &RowKey) -> RowOrder {
    (key.table, sid, res_code(key.res), key.bucket.millis())
}

/// A price tick's sid and key (time, partition, offset) flat, so that
/// they take 32 bytes where `(i64, TickKey)` takes 40 with its padding: a
/// live step's 640 000 price ticks stay in this form for its whole write.
type PriceOrder = (i64, i64, u32, u64);

fn price_order(sid: i64, key: TickKey) -> PriceOrder {
    (sid, key.ts.millis(), key.partition, key.offset)
}

fn tick_key(&(_, ts, partition, offset): &PriceOrder) -> TickKey {
    TickKey {
        ts: Timestamp(ts),
        partition,
        offset,
    }
}

/// `items` in the order of their keys, found by sid first: each sid's
/// items in the order their keys give, items with equal keys in the order
/// given (the sort is stable). A step's sids are few and dense (allocated
/// from 1), so they are counted into place, and only each sid's items
/// compared — usually already in order (a log in time order), and checked
/// as such: one sort of a long-tail step's ~400 000 rows and ~250 000
/// ticks was a tenth of its write. The keys start with the table before
/// the sid, so a series' tables come out one after the other, each
/// table's B-tree still walked from left to right (see [`key_order`]).
fn in_sid_order<K: Copy + Ord, V: Copy>(
    items: Vec<(K, V)>,
    sid: impl Fn(&K) -> i64,
) -> Vec<(K, V)> {
    let sid = |item: &(K, V)| sid(&item.0);
    let (min, max) = items
        .iter()
        .map(&sid)
        .fold((i64::MAX, i64::MIN), |(lo, hi), s| (lo.min(s), hi.max(s)));
    let dense = min >= 0 && max as u64 <= 4 * items.len() as u64 + 1024;
    if items.is_empty() || !dense {
        let mut out = items;
        out.sort_by_key(|(key, _)| *key);
        return out;
    }
    // `starts[s]`: where sid `s`'s items begin in the output.
    let mut starts = vec![0usize; max as usize + 2];
    for item in &items {
        starts[sid(item) as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut next = starts.clone();
    let mut out = items.clone();
    for item in &items {
        let at = &mut next[sid(item) as usize];
        out[*at] = *item;
        *at += 1;
    }
    for group in starts.windows(2) {
        let group = &mut out[group[0]..group[1]];
        if !group.is_sorted_by_key(|(key, _)| *key) {
            group.sort_by_key(|(key, _)| *key);
        }
    }
    out
}

/// Appends a price row's value as its block keeps it ([`rowcodec`]) to
/// `out`; returns the row's count.
pub(crate) fn put_price_value(out: &mut Vec<u8>, row: &Row) -> Result<u64> {
    let RowValue::Price { sum, count, candle } = &row.value else {
        return Err(Error::Corrupt(format!(
            "a {:?} row among price rows",
            row.key.table
        )));
    };
    rowcodec::encode_into(
        out,
        *sum,
        candle.as_ref(),
        row.key.bucket.millis(),
        row.last_offset,
    );
    Ok(*count)
}

/// [`price_block_of`] a price row's order, and the row's resolution: read
/// from the order, held inline, and not through the row, which lies
/// wherever the step's buffer put it (a cache miss per row of a long tail).
pub(crate) fn price_block_at(&(_, sid, res, bucket): &RowOrder) -> ((i64, i64, i64), Resolution) {
    let resolution = res_of_code(res).expect("a row's order holds a code of res_code");
    let block = bucketblock::block_of(bucket, resolution.width_ms());
    ((sid, res, block), resolution)
}

/// The key of the block holding the price bucket of `key`, whose id has
/// `sid`: (`sid`, `res`, `block`).
fn price_block_of(sid: i64, key: &RowKey) -> (i64, i64, i64) {
    (
        sid,
        res_code(key.res),
        bucketblock::block_of(key.bucket.millis(), key.res.width_ms()),
    )
}

/// The stored blob of the price block `at` (see [`price_block_of`]), if any.
fn read_price_block(conn: &Connection, at: (i64, i64, i64)) -> Result<Option<Vec<u8>>> {
    Ok(conn
        .prepare_cached(READ_PRICE_BLOCK)?
        .query_row(params![at.0, at.1, at.2], |r| r.get(0))
        .optional()?)
}

const READ_PRICE_BLOCK: &str =
    "SELECT v FROM price_bucket_blocks_past WHERE sid = ?1 AND res = ?2 AND block = ?3";

/// Tokens read and waiting for [`crate::headmerge`] at most: enough that
/// the merger never waits on the writer's reads, few enough that the heads
/// in the queue (a few KB each) stay small.
const MERGE_QUEUE: usize = 256;

/// The statements an `apply` writes with, each prepared once for the whole
/// step: looking a statement up in the connection's cache and handing it
/// back for every row and tick showed as a tenth of a rebuild's profile.
struct Inserts<'t> {
    tx: &'t Connection,
    prepared: [Option<rusqlite::CachedStatement<'t>>; Insert::COUNT],
}

#[derive(Clone, Copy)]
enum Insert {
    ReadPriceBlock,
    PriceBlock,
    MetricRow,
    BookRow,
    ReadTickBlocks,
    TickBlock,
    BookTick,
    TradeId,
    FirstTrade,
    Trade,
}

impl Insert {
    const COUNT: usize = 10;

    fn sql(self) -> &'static str {
        match self {
            Insert::ReadPriceBlock => READ_PRICE_BLOCK,
            // An update in place: the index by series changes only for a
            // new block, where a replace would delete and insert its entry.
            Insert::PriceBlock => {
                "INSERT INTO price_bucket_blocks_past VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (res, block, sid)
                 DO UPDATE SET n = excluded.n, ticks = excluded.ticks, v = excluded.v"
            }
            Insert::MetricRow => {
                "INSERT OR REPLACE INTO metric_buckets VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            }
            Insert::BookRow => {
                "INSERT OR REPLACE INTO book_buckets VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            }
            // From the block holding `?2..?4` back to the first block
            // starting at or before the caller's least key (it stops
            // reading there).
            Insert::ReadTickBlocks => {
                "SELECT ts, log_partition, log_offset, v FROM price_tick_blocks_past
                 WHERE sid = ?1 AND (ts, log_partition, log_offset) <= (?2, ?3, ?4)
                 ORDER BY ts DESC, log_partition DESC, log_offset DESC"
            }
            Insert::TickBlock => {
                "INSERT OR REPLACE INTO price_tick_blocks_past VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
            }
            Insert::BookTick => "INSERT OR REPLACE INTO book_ticks VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            Insert::TradeId => "INSERT OR IGNORE INTO trade_ids VALUES (?1, ?2, ?3, ?4)",
            Insert::FirstTrade => {
                "SELECT log_partition, log_offset FROM trade_ids WHERE sid = ?1 AND trade_id = ?2"
            }
            Insert::Trade => {
                "INSERT OR REPLACE INTO trades VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            }
        }
    }
}

impl<'t> Inserts<'t> {
    fn new(tx: &'t Connection) -> Self {
        Inserts {
            tx,
            prepared: Default::default(),
        }
    }

    fn get(&mut self, which: Insert) -> Result<&mut rusqlite::CachedStatement<'t>> {
        let slot = &mut self.prepared[which as usize];
        if slot.is_none() {
            *slot = Some(self.tx.prepare_cached(which.sql())?);
        }
        Ok(slot.as_mut().expect("prepared above"))
    }

    /// Takes a token's price rows (in key order) and merges into the full
    /// table those behind its head's block at their resolution (a late
    /// event): each such block is read, the rows merged in (each replacing
    /// the stored bucket it keys) and written back. Returns the rest, which
    /// [`crate::headmerge`] merges into the head.
    fn behind_price_rows<'r>(
        &mut self,
        head: &Head,
        run: &'r [(RowOrder, &'r Row)],
    ) -> Result<Cow<'r, [(RowOrder, &'r Row)]>> {
        let at = |(order, _): &(RowOrder, &Row)| price_block_at(order).0;
        let behind = |(order, _): &(RowOrder, &Row)| {
            let ((.., block), res) = price_block_at(order);
            head.prices[res.index()]
                .as_ref()
                .is_some_and(|h| block < h.block)
        };
        if !run.iter().any(behind) {
            return Ok(Cow::Borrowed(run));
        }
        let (late, rest): (Vec<_>, Vec<_>) = run.iter().partition(|item| behind(item));
        let (mut values, mut parts, mut merged) = (Vec::new(), Vec::new(), Vec::new());
        for rows in late.chunk_by(|a, b| at(a) == at(b)) {
            let (sid, res, block) = at(&rows[0]);
            let width = rows[0].1.key.res.width_ms();
            merged.clear();
            let counts = {
                let mut found = self
                    .get(Insert::ReadPriceBlock)?
                    .query(params![sid, res, block])?;
                let stored = match found.next()? {
                    Some(r) => blob(r, 0)?,
                    None => &[],
                };
                let new = headmerge::entries(rows, &mut values, &mut parts)?;
                bucketblock::merge_into(&mut merged, stored, block, width, new)?
            };
            self.put_price_block((sid, res, block), counts, &merged)?;
        }
        Ok(Cow::Owned(rest))
    }

    /// Writes a token's merged head ([`crate::headmerge`]) and the blocks
    /// the merge moved out of it into the full tables.
    fn write_head(&mut self, done: headmerge::Done) -> Result<()> {
        for ((res, block), counts, v) in &done.price_blocks {
            self.put_price_block((done.sid, *res, *block), *counts, v)?;
        }
        for (start, n, v) in &done.tick_blocks {
            self.put_tick_block(done.sid, *start, *n, v)?;
        }
        done.head.write(self.tx, done.sid)
    }

    /// Writes the price block `at` (see [`price_block_of`]): `v` holding
    /// `n` buckets that counted `ticks`.
    fn put_price_block(
        &mut self,
        at: (i64, i64, i64),
        (n, ticks): (u64, u64),
        v: &[u8],
    ) -> Result<()> {
        let (sid, res, block) = at;
        self.get(Insert::PriceBlock)?.execute(params![
            sid,
            res,
            block,
            n as i64,
            ticks as i64,
            v
        ])?;
        Ok(())
    }

    fn row(&mut self, sid: i64, row: &Row) -> Result<()> {
        let k = &row.key;
        let (res, bucket) = (res_code(k.res), k.bucket.millis());
        let last = row.last_offset as i64;
        match &row.value {
            RowValue::Price { .. } => {
                return Err(Error::Corrupt(
                    "a price row among the rows written one by one: they go through heads".into(),
                ))
            }
            RowValue::Metrics {
                volume_sum,
                liquidity_sum,
                spread_sum,
                count,
            } => {
                self.get(Insert::MetricRow)?.execute(params![
                    sid,
                    res,
                    bucket,
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
                self.get(Insert::BookRow)?.execute(params![
                    sid,
                    res,
                    bucket,
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

    /// Takes one token's price ticks of a step (in key order; of two with
    /// one key the later wins, as a row written twice would) and merges
    /// into the blocks of the full table those before the start of its
    /// head's tick block ([`Inserts::past_price_ticks`]). Returns the rest,
    /// distinct keys in key order, which [`crate::headmerge`] merges into
    /// the head.
    fn behind_price_ticks(
        &mut self,
        head: &Head,
        sid: i64,
        ticks: impl Iterator<Item = PriceTick>,
    ) -> Result<Vec<PriceTick>> {
        let mut new: Vec<PriceTick> = Vec::with_capacity(ticks.size_hint().0);
        for t in ticks {
            match new.last_mut() {
                Some(last) if last.0 == t.0 => *last = t,
                _ => new.push(t),
            }
        }
        let behind = head
            .ticks
            .as_ref()
            .map_or(0, |h| new.partition_point(|t| t.0 < h.start));
        self.past_price_ticks(sid, &new[..behind])?;
        new.drain(..behind);
        Ok(new)
    }

    /// Writes price ticks of one token (in key order, distinct keys), all
    /// before its head's block, into the blocks of the full table: each
    /// block the ticks fall in is read, merged and written back, cut in
    /// pieces if it outgrew the cap; ticks before every block make blocks
    /// of their own.
    fn past_price_ticks(&mut self, sid: i64, new: &[PriceTick]) -> Result<()> {
        let (Some(&(first, _)), Some(&(last, _))) = (new.first(), new.last()) else {
            return Ok(());
        };
        // The blocks starting at or before the last new key, back to the
        // one holding the first: every block a new tick falls in.
        let mut stored: Vec<(TickKey, Vec<u8>)> = Vec::new();
        {
            let mut rows = self.get(Insert::ReadTickBlocks)?.query(params![
                sid,
                last.ts.millis(),
                last.partition,
                last.offset as i64
            ])?;
            while let Some(r) = rows.next()? {
                let start = key_at(r, 0)?;
                stored.push((start, blob(r, 3)?.to_vec()));
                if start <= first {
                    break;
                }
            }
        }
        stored.reverse();
        let mut rest = new;
        if let Some((start, _)) = stored.first() {
            let before = rest.partition_point(|t| t.0 < *start);
            self.put_price_blocks(sid, &rest[..before])?;
            rest = &rest[before..];
        }
        for (i, (start, v)) in stored.iter().enumerate() {
            let next = stored.get(i + 1).map(|(next, _)| *next);
            let mine = rest.partition_point(|t| next.is_none_or(|next| t.0 < next));
            if mine > 0 {
                let merged = tickblock::merge(tickblock::decode(*start, v)?, &rest[..mine]);
                self.put_price_blocks(sid, &merged)?;
                rest = &rest[mine..];
            }
        }
        self.put_price_blocks(sid, rest)
    }

    /// Writes `ticks` (key order, distinct keys) as blocks of `sid`, each
    /// under its first tick's key: the first replaces the block it was
    /// merged from, which starts there.
    fn put_price_blocks(&mut self, sid: i64, ticks: &[PriceTick]) -> Result<()> {
        if ticks.is_empty() {
            return Ok(());
        }
        for piece in tickblock::pieces(ticks) {
            let v = tickblock::encode(piece);
            self.put_tick_block(sid, piece[0].0, piece.len() as u64, &v)?;
        }
        Ok(())
    }

    /// Writes the tick block of `sid` starting at `start`: `v` holding `n`
    /// ticks.
    fn put_tick_block(&mut self, sid: i64, start: TickKey, n: u64, v: &[u8]) -> Result<()> {
        self.get(Insert::TickBlock)?.execute(params![
            sid,
            start.ts.millis(),
            start.partition,
            start.offset as i64,
            n as i64,
            v
        ])?;
        Ok(())
    }

    /// Writes one book snapshot or trade under its key (price ticks go
    /// through the heads, [`crate::headmerge`]). A trade with an id is written
    /// only at the position `trade_ids` holds for it: the first one given,
    /// recorded here in the same transaction.
    fn tick(&mut self, sid: i64, t: &Tick) -> Result<()> {
        let (ts, part, off) = (
            t.key.ts.millis(),
            t.key.partition as i64,
            t.key.offset as i64,
        );
        match &t.value {
            TickValue::Price { .. } => {
                return Err(Error::Corrupt(
                    "a price tick among the ticks written one by one: they go in blocks".into(),
                ))
            }
            TickValue::Book { bids, asks } => {
                self.get(Insert::BookTick)?
                    .execute(params![sid, ts, part, off, bids, asks])?;
            }
            TickValue::Trade {
                price,
                size,
                side,
                trade_id,
            } => {
                if let Some(id) = trade_id {
                    self.get(Insert::TradeId)?
                        .execute(params![sid, id, part, off])?;
                    let first: (i64, i64) = self
                        .get(Insert::FirstTrade)?
                        .query_row(params![sid, id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                    if first != (part, off) {
                        return Ok(());
                    }
                }
                self.get(Insert::Trade)?.execute(params![
                    sid,
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
}

/// The order a step's book snapshots and trades are written in: book
/// snapshots by (`sid`, key) — the table's key order, for the reason of
/// [`key_order`]; their keys are distinct positions, so the order changes
/// no outcome. Trades last, in the order given: the first position given
/// for a trade id is the one kept.
fn tick_order(sid: i64, t: &Tick) -> (u8, i64, Option<TickKey>) {
    match t.value {
        TickValue::Trade { .. } => (1, 0, None),
        _ => (0, sid, Some(t.key)),
    }
}

/// The tick kinds kept a row per tick; price ticks are kept in blocks
/// ([`price_ticks`], [`count_price_ticks`]).
#[derive(Clone, Copy)]
enum RowTicks {
    Book,
    Trade,
}

impl RowTicks {
    /// How `kind` is kept: none for price ticks.
    fn of(kind: TickKind) -> Option<Self> {
        match kind {
            TickKind::Price => None,
            TickKind::Book => Some(RowTicks::Book),
            TickKind::Trade => Some(RowTicks::Trade),
        }
    }

    fn table(self) -> &'static str {
        match self {
            RowTicks::Book => "book_ticks",
            RowTicks::Trade => "trades",
        }
    }

    /// The columns after the key, as [`tick_from_row`] reads them.
    fn columns(self) -> &'static str {
        match self {
            RowTicks::Book => "bids, asks",
            RowTicks::Trade => "price, size, side, trade_id",
        }
    }
}

/// The tick key in columns `first` to `first + 2` (`ts, log_partition,
/// log_offset`), as every tick table and `price_tick_blocks` keep it.
fn key_at(r: &rusqlite::Row, first: usize) -> rusqlite::Result<TickKey> {
    Ok(TickKey {
        ts: Timestamp(r.get(first)?),
        partition: r.get::<_, i64>(first + 1)? as u32,
        offset: r.get::<_, i64>(first + 2)? as u64,
    })
}

/// A tick from a row `ts, log_partition, log_offset, <columns>`.
fn tick_from_row(kind: RowTicks, token_id: &str, r: &rusqlite::Row) -> Result<Tick> {
    let key = key_at(r, 0)?;
    let value = match kind {
        RowTicks::Book => TickValue::Book {
            bids: r.get(3)?,
            asks: r.get(4)?,
        },
        RowTicks::Trade => {
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
        token_id: token_id.into(),
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
        // On a connection of its own, not the writer: the projector loads
        // the rows of its next segment while the store writes the last
        // one. A load never needs the rows of a write still running (the
        // projector keeps those in memory), and its read transaction sees
        // every write committed before it began.
        self.on("load_rows", &self.loader, move |conn| {
            let tx = conn.transaction()?;
            let mut sids = FxHashMap::default();
            let mut found = Vec::with_capacity(keys.len());
            for key in &keys {
                // A key whose id has no sid has no row.
                if let Some(sid) = committed_sid(&tx, &mut sids, &key.id)? {
                    found.push((sid, key));
                }
            }
            found.sort_by_key(|(sid, key)| key_order(*sid, key));
            let mut out = Vec::with_capacity(found.len());
            for (sid, key) in found {
                if let Some(row) = load_one(&tx, sid, key)? {
                    out.push(row);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn frontiers(&self, series: Vec<Series>) -> CResult<Vec<Frontiers>> {
        // On the loader's connection, for the reason `load` is.
        self.on("read_frontiers", &self.loader, move |conn| {
            let tx = conn.transaction()?;
            let mut sids = FxHashMap::default();
            let mut out = Vec::with_capacity(series.len());
            for (table, id) in &series {
                let mut bounds = [Timestamp(i64::MIN); Resolution::ALL.len()];
                // An id with no sid has no row.
                if let Some(sid) = committed_sid(&tx, &mut sids, id)? {
                    for res in Resolution::ALL {
                        bounds[res.index()] = frontier(&tx, *table, sid, res)?;
                    }
                }
                out.push(bounds);
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
        self.write("apply", move |w| {
            let Writer { conn, sids, .. } = w;
            // IMMEDIATE: take the write lock first (waiting for it), rather
            // than upgrading a read snapshot another writer may have moved
            // past — which SQLite refuses at once. Several Kafka-mode
            // projectors can share one embedded store.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut lookup = SidLookup::new(sids);
            // Sorted by keys held inline, not read through each row.
            let mut rows = Vec::with_capacity(write.rows.len());
            for row in &write.rows {
                let sid = lookup.sid(&tx, &row.key.id)?;
                rows.push((key_order(sid, &row.key), row));
            }
            let rows = in_sid_order(rows, |(_, sid, ..)| *sid);
            // Price ticks go to their blocks, the others to a row each.
            // Taken by value: a price tick keeps its sid, key and price
            // (40 bytes), and the write's ticks (a step's largest buffer,
            // 104 bytes a tick; its token's name is its rows') are freed
            // before the blocks are written, while the projector polls and
            // folds its next step beside this write.
            let mut prices: Vec<(PriceOrder, f64)> = Vec::with_capacity(write.ticks.len());
            let mut ticks = Vec::new();
            for tick in write.ticks {
                let sid = lookup.sid(&tx, &tick.token_id)?;
                match tick.value {
                    TickValue::Price { p } => prices.push((price_order(sid, tick.key), p)),
                    _ => ticks.push((sid, tick)),
                }
            }
            // Stable: of two ticks with one key, the later wins
            // (`Inserts::behind_price_ticks`).
            let prices = in_sid_order(prices, |(sid, ..)| *sid);
            ticks.sort_by_key(|(sid, tick)| tick_order(*sid, tick));
            {
                let mut inserts = Inserts::new(&tx);
                // A series' rows of one table are one run. A token's price
                // rows and price ticks go through its head, read and
                // written once (`crate::head`), in sid order.
                let mut price_rows = Vec::new();
                for run in rows.chunk_by(|a, b| (a.0 .0, a.0 .1) == (b.0 .0, b.0 .1)) {
                    match run[0].0 .0 {
                        Table::Prices => price_rows.push(run),
                        _ => {
                            for ((_, sid, ..), row) in run {
                                inserts.row(*sid, row)?;
                            }
                        }
                    }
                }
                let mut price_rows = price_rows.into_iter().peekable();
                let mut price_ticks = prices.chunk_by(|a, b| a.0 .0 == b.0 .0).peekable();
                // This thread reads each head and writes it back merged;
                // the merging runs beside it (`crate::headmerge`).
                std::thread::scope(|scope| -> Result<()> {
                    let (to_merge, jobs) = mpsc::sync_channel(MERGE_QUEUE);
                    let (to_write, merged) = mpsc::channel();
                    scope.spawn(move || headmerge::run(jobs, to_write));
                    loop {
                        let rows_sid = price_rows.peek().map(|run| run[0].0 .1);
                        let ticks_sid = price_ticks.peek().map(|token| token[0].0 .0);
                        let Some(sid) = rows_sid.into_iter().chain(ticks_sid).min() else {
                            break;
                        };
                        let head = Head::read(&tx, sid)?;
                        let rows = match rows_sid == Some(sid) {
                            true => inserts
                                .behind_price_rows(&head, price_rows.next().expect("peeked"))?,
                            false => Cow::Borrowed(&[][..]),
                        };
                        let ticks = match ticks_sid == Some(sid) {
                            true => {
                                let token = price_ticks.next().expect("peeked");
                                let ticks = token.iter().map(|(order, p)| (tick_key(order), *p));
                                inserts.behind_price_ticks(&head, sid, ticks)?
                            }
                            false => Vec::new(),
                        };
                        let job = headmerge::Job {
                            sid,
                            head,
                            rows,
                            ticks,
                        };
                        if to_merge.send(job).is_err() {
                            // The merger panicked: the scope raises it.
                            break;
                        }
                        while let Ok(done) = merged.try_recv() {
                            inserts.write_head(done?)?;
                        }
                    }
                    drop(to_merge);
                    for done in merged {
                        inserts.write_head(done?)?;
                    }
                    Ok(())
                })?;
                for (sid, tick) in &ticks {
                    inserts.tick(*sid, tick)?;
                }
            }
            let applied = write_catalog_records(&tx, &write.catalog)?;
            for pos in &write.consumed {
                tx.prepare_cached("INSERT OR REPLACE INTO consumed VALUES (?1, ?2)")?
                    .execute(params![pos.partition as i64, pos.offset as i64 + 1])?;
            }
            let fresh = lookup.fresh;
            tx.commit()?;
            sids.extend(fresh);
            Ok(applied)
        })
        .await
    }

    async fn reset(&self) -> CResult<()> {
        self.write("reset", |w| {
            // `series_ids` stays: sids are allocations, and the cache
            // holds them.
            let tx = w.conn.transaction()?;
            for table in DERIVED_TABLES {
                tx.execute(&format!("DELETE FROM {table}"), [])?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }
}

/// The sid of `name`, if it has one.
fn sid_of(conn: &Connection, name: &str) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT sid FROM series_ids WHERE name = ?1")?
        .query_row([name], |r| r.get::<_, i64>(0))
        .optional()?)
}

/// What [`price_blocks`] calls with each block: its start, count and blob,
/// and the next block's start; it answers whether to go on.
type TickBlockVisit<'v> = dyn FnMut(TickKey, u64, &[u8], Option<TickKey>) -> Result<bool> + 'v;

/// Visits, in key order, the price tick blocks of `id` that may hold
/// ticks at or after `from` and before `end`: from the block holding
/// `from` (the one starting at or before it, or the first) to the last
/// starting before `end`. `visit` gets each block's start, count and blob
/// and the next block's start, if one was read, and says whether to go on.
/// The full table and the head are read in one transaction, so a block
/// moving from one to the other (a write committing between two reads)
/// is seen once.
fn price_blocks(
    conn: &Connection,
    id: &str,
    from: TickKey,
    end: Timestamp,
    mut visit: impl FnMut(TickKey, u64, &[u8], Option<TickKey>) -> Result<bool>,
) -> Result<()> {
    let tx = ReadTx::begin(conn)?;
    let Some(sid) = sid_of(&tx, id)? else {
        return Ok(());
    };
    // A token with no head block has no ticks (`crate::head`).
    let Some(newest) = head::tick_block(&tx, sid)? else {
        return Ok(());
    };
    // The head's block, visited last: it holds every tick from its start
    // on, after every block of the full table.
    let visit_newest = |visit: &mut TickBlockVisit| {
        if newest.start.ts < end {
            visit(newest.start, newest.n, &newest.v, None)?;
        }
        Ok(())
    };
    if newest.start <= from {
        return visit_newest(&mut visit);
    }
    let holder = tx
        .prepare_cached(
            "SELECT ts, log_partition, log_offset FROM price_tick_blocks_past
             WHERE sid = ?1 AND (ts, log_partition, log_offset) <= (?2, ?3, ?4)
             ORDER BY ts DESC, log_partition DESC, log_offset DESC LIMIT 1",
        )?
        .query_row(
            params![sid, from.ts.millis(), from.partition, from.offset as i64],
            |r| key_at(r, 0),
        )
        .optional()?;
    let first = holder.map_or((i64::MIN, 0, 0), |k| {
        (k.ts.millis(), k.partition as i64, k.offset as i64)
    });
    {
        let mut stmt = tx.prepare_cached(
            "SELECT ts, log_partition, log_offset, n, v FROM price_tick_blocks_past
             WHERE sid = ?1 AND (ts, log_partition, log_offset) >= (?2, ?3, ?4) AND ts < ?5
             ORDER BY ts, log_partition, log_offset",
        )?;
        let mut rows = stmt.query(params![sid, first.0, first.1, first.2, end.millis()])?;
        // One block behind, so each is visited knowing where the next starts.
        let mut held: Option<(TickKey, u64, Vec<u8>)> = None;
        while let Some(r) = rows.next()? {
            let start = key_at(r, 0)?;
            if let Some((at, n, v)) = held.take() {
                if !visit(at, n, &v, Some(start))? {
                    return Ok(());
                }
            }
            held = Some((start, r.get::<_, i64>(3)? as u64, blob(r, 4)?.to_vec()));
        }
        // The head's block starts after every block of the full table.
        if let Some((at, n, v)) = held {
            if !visit(at, n, &v, Some(newest.start))? {
                return Ok(());
            }
        }
    }
    visit_newest(&mut visit)
}

/// The price ticks of `id` in `range`, read from their blocks.
fn price_ticks(conn: &Connection, id: &str, range: &TickRange) -> Result<Vec<Tick>> {
    let mut out = Vec::new();
    price_blocks(conn, id, range.from, range.end, |start, _, v, _| {
        let wanted = tickblock::decode(start, v)?
            .into_iter()
            .skip_while(|(key, _)| *key < range.from)
            .take_while(|(key, _)| key.ts < range.end)
            .take(range.limit - out.len());
        out.extend(wanted.map(|(key, p)| Tick {
            token_id: id.into(),
            key,
            value: TickValue::Price { p },
        }));
        Ok(out.len() < range.limit)
    })?;
    Ok(out)
}

/// How many price ticks `id` has in [start, end): a block inside the range
/// (starting in it, and the next block too) counts by its `n`, without
/// decoding; the blocks at its edges tick by tick.
fn count_price_ticks(conn: &Connection, id: &str, start: i64, end: i64) -> Result<u64> {
    let from = TickKey {
        ts: Timestamp(start),
        partition: 0,
        offset: 0,
    };
    let mut n = 0u64;
    price_blocks(conn, id, from, Timestamp(end), |at, count, v, next| {
        // A block's ticks lie between its start and the next block's.
        n += if at.ts.millis() >= start && next.is_some_and(|next| next.ts.millis() < end) {
            count
        } else {
            tickblock::decode(at, v)?
                .iter()
                .filter(|(key, _)| (start..end).contains(&key.ts.millis()))
                .count() as u64
        };
        Ok(true)
    })?;
    Ok(n)
}

/// The blocks of a series' price buckets in the full table (its head holds
/// the newest, see `crate::head`) whose windows overlap `?3..?4` at
/// resolution code `?2`: the first may start up to a window before. In
/// key order, so a caller may stop reading at any block.
const PRICE_BLOCKS_IN_RANGE: &str = "SELECT block, n, v
     FROM price_bucket_blocks_past INDEXED BY price_bucket_blocks_by_series
     WHERE sid = ?1 AND res = ?2 AND block > ?3 AND block < ?4 ORDER BY block";

/// Visits the price blocks of `id` at `res` whose windows overlap
/// `start..end`, in order: `visit` gets each block's start, `n` and blob
/// and says whether to go on. The full table's, then the head's, read in
/// one transaction (see [`price_blocks`]).
fn price_bucket_blocks(
    conn: &Connection,
    id: &str,
    res: Resolution,
    (start, end): (i64, i64),
    mut visit: impl FnMut(i64, u64, &[u8]) -> Result<bool>,
) -> Result<()> {
    let tx = ReadTx::begin(conn)?;
    let Some(sid) = sid_of(&tx, id)? else {
        return Ok(());
    };
    // A series with no head block at `res` has no buckets there.
    let Some(newest) = head::price_block(&tx, sid, res)? else {
        return Ok(());
    };
    let after = start.saturating_sub(bucketblock::BLOCK_BUCKETS * res.width_ms());
    {
        let mut stmt = tx.prepare_cached(PRICE_BLOCKS_IN_RANGE)?;
        let mut rows = stmt.query(params![sid, res_code(res), after, end.min(newest.block)])?;
        while let Some(r) = rows.next()? {
            if !visit(r.get(0)?, r.get::<_, i64>(1)? as u64, blob(r, 2)?)? {
                return Ok(());
            }
        }
    }
    if newest.block > after && newest.block < end {
        visit(newest.block, newest.n, &newest.v)?;
    }
    Ok(())
}

/// Visits the price buckets of `id` in `range`, in bucket order, up to
/// `range.limit` of them.
fn price_buckets(
    conn: &Connection,
    id: &str,
    range: &Range,
    mut visit: impl FnMut(Entry) -> Result<()>,
) -> Result<()> {
    let width = range.res.width_ms();
    let (start, end) = (range.start.millis(), range.end.millis());
    let mut n = 0;
    price_bucket_blocks(conn, id, range.res, (start, end), |block, _, v| {
        for e in bucketblock::entries(v, block, width) {
            let e = e?;
            if e.bucket < start {
                continue;
            }
            if e.bucket >= end || n == range.limit {
                return Ok(false);
            }
            visit(e)?;
            n += 1;
        }
        Ok(true)
    })
}

/// How many price buckets of `id` a range holds ([`range_params`]): a block
/// wholly inside counts its `n` unread; one across an edge is decoded.
fn count_price_buckets(conn: &Connection, p: &(String, i64, i64, i64)) -> Result<u64> {
    let (id, res, start, end) = (&p.0, res_of_code(p.1)?, p.2, p.3);
    let width = res.width_ms();
    let span = bucketblock::BLOCK_BUCKETS * width;
    let mut n = 0;
    price_bucket_blocks(conn, id, res, (start, end), |block, count, v| {
        if block >= start && block.saturating_add(span) <= end {
            n += count;
        } else {
            for e in bucketblock::entries(v, block, width) {
                n += u64::from((start..end).contains(&e?.bucket));
            }
        }
        Ok(true)
    })?;
    Ok(n)
}

/// The bound parameters of a bucket range: id, resolution code, start, end.
///
/// The range reads have no `LIMIT ?`: after an `ORDER BY`, a bound limit
/// makes SQLite re-prepare the statement on every run (the plan may depend
/// on its value), which was a tenth of the API's CPU on a 200-point page.
/// Rows come in the primary key's order, so the reader stops after
/// `limit` rows and SQLite reads no further.
fn range_params(id: &str, r: &Range) -> (String, i64, i64, i64) {
    (
        id.to_string(),
        res_code(r.res),
        r.start.millis(),
        r.end.millis(),
    )
}

impl SqliteStore {
    /// The stamp of everything in `store.db` (buckets, ticks, catalog,
    /// keys): [`ReadStore::version`] and [`AuthStore::version`]. A few
    /// loads from the WAL index's header, mapped (`crate::stamp`): no
    /// transaction, no lock shared with a writer.
    fn stamp(&self) -> Option<u64> {
        match self.stamps.read() {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "reading the store's stamp failed");
                None
            }
        }
    }
}

#[async_trait]
impl ReadStore for SqliteStore {
    fn version(&self) -> Option<u64> {
        self.stamp()
    }

    async fn prices(&self, token_id: &str, range: Range) -> CResult<Vec<PricePoint>> {
        let id = token_id.to_string();
        self.read("read_prices", move |conn| {
            let mut out = Vec::new();
            price_buckets(conn, &id, &range, |e| {
                let p = rowcodec::sum(e.v)? / e.count as f64;
                out.push(PricePoint {
                    t: Timestamp(e.bucket),
                    p,
                });
                Ok(())
            })?;
            Ok(out)
        })
        .await
    }

    async fn candles(&self, token_id: &str, range: Range) -> CResult<Vec<CandlePoint>> {
        let id = token_id.to_string();
        self.read("read_candles", move |conn| {
            let mut out = Vec::new();
            price_buckets(conn, &id, &range, |e| {
                let (_, candle) = rowcodec::decode(e.v, e.bucket, e.last_offset)?;
                out.push(CandlePoint {
                    t: Timestamp(e.bucket),
                    count: e.count,
                    candle,
                    trades: None,
                });
                Ok(())
            })?;
            Ok(out)
        })
        .await
    }

    async fn metrics(&self, market_id: &str, range: Range) -> CResult<Vec<MetricsPoint>> {
        let p = range_params(market_id, &range);
        let limit = range.limit;
        self.read("read_metrics", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT bucket, volume_sum, liquidity_sum, spread_sum, count FROM metric_buckets
                 WHERE sid=(SELECT sid FROM series_ids WHERE name=?1) AND res=?2 AND bucket>=?3 AND bucket<?4 ORDER BY bucket",
            )?;
            let rows = stmt.query_map(params![p.0, p.1, p.2, p.3], |r| {
                let n = r.get::<_, i64>(4)? as f64;
                Ok(MetricsPoint {
                    t: Timestamp(r.get(0)?),
                    volume: r.get::<_, f64>(1)? / n,
                    liquidity: r.get::<_, f64>(2)? / n,
                    spread: r.get::<_, f64>(3)? / n,
                })
            })?;
            Ok(rows.take(limit).collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn books(&self, token_id: &str, range: Range) -> CResult<Vec<BookPoint>> {
        let p = range_params(token_id, &range);
        let limit = range.limit;
        self.read("read_books", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT bucket, bids, asks FROM book_buckets
                 WHERE sid=(SELECT sid FROM series_ids WHERE name=?1) AND res=?2 AND bucket>=?3 AND bucket<?4 ORDER BY bucket",
            )?;
            let rows = stmt.query_map(params![p.0, p.1, p.2, p.3], |r| {
                Ok(BookPoint { t: Timestamp(r.get(0)?), bids: r.get(1)?, asks: r.get(2)? })
            })?;
            Ok(rows.take(limit).collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn count(&self, table: Table, id: &str, range: Range) -> CResult<u64> {
        let p = range_params(id, &range);
        let name = match table {
            Table::Prices => {
                return self
                    .read("count_rows", move |conn| count_price_buckets(conn, &p))
                    .await
            }
            Table::Metrics => "metric_buckets",
            Table::Books => "book_buckets",
        };
        let sql = format!(
            "SELECT count(*) FROM {name} WHERE sid=(SELECT sid FROM series_ids WHERE name=?1) AND res=?2 AND bucket>=?3 AND bucket<?4"
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
        let Some(kind) = RowTicks::of(kind) else {
            return self
                .read("count_ticks", move |conn| {
                    count_price_ticks(conn, &id, start.millis(), end.millis())
                })
                .await;
        };
        // The primary key's index range: counted without reading the rows.
        let sql = format!(
            "SELECT count(*) FROM {} WHERE sid = (SELECT sid FROM series_ids WHERE name = ?1) AND ts >= ?2 AND ts < ?3",
            kind.table()
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
        let Some(kind) = RowTicks::of(kind) else {
            return self
                .read("read_ticks", move |conn| price_ticks(conn, &id, &range))
                .await;
        };
        self.read("read_ticks", move |conn| {
            // Row values: the primary key's index is scanned from `from`.
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT ts, log_partition, log_offset, {} FROM {}
                 WHERE sid = (SELECT sid FROM series_ids WHERE name = ?1)
                   AND (ts, log_partition, log_offset) >= (?2, ?3, ?4) AND ts < ?5
                 ORDER BY ts, log_partition, log_offset",
                kind.columns(),
                kind.table()
            ))?;
            let from = range.from;
            let mut rows = stmt.query(params![
                id,
                from.ts.millis(),
                from.partition as i64,
                from.offset as i64,
                range.end.millis(),
            ])?;
            // No `LIMIT ?`: see `range_params`.
            let mut out = Vec::new();
            while out.len() < range.limit {
                let Some(r) = rows.next()? else { break };
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
                 WHERE sid = (SELECT sid FROM series_ids WHERE name = ?1) AND ts >= ?2 AND ts <= ?3
                 ORDER BY ts DESC, log_partition DESC, log_offset DESC LIMIT 1",
            )?;
            let mut rows = stmt.query(params![id, since.millis(), at.millis()])?;
            rows.next()?
                .map(|r| tick_from_row(RowTicks::Book, &id, r))
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
                Some(Ok(Event::Market(m))) => Ok(Some(*m)),
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

/// Column `i` as a blob; any other type is corrupt.
fn blob<'r>(r: &'r rusqlite::Row, i: usize) -> Result<&'r [u8]> {
    r.get_ref(i)?
        .as_blob()
        .map_err(|e| Error::Corrupt(format!("column {i}: {e}")))
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
    fn version(&self) -> Option<u64> {
        self.stamp()
    }

    async fn put_key(&self, key: ApiKeyRecord) -> CResult<()> {
        self.write("put_key", move |w| {
            w.conn.execute(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift generator of numbers below `n`: the tests' data is
    /// irregular, and the same on every run.
    fn below() -> impl FnMut(u64) -> u64 {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// A write of `ticks` alone.
    async fn write_ticks(store: &SqliteStore, ticks: Vec<Tick>) {
        store
            .apply(ProjectionWrite {
                ticks,
                ..Default::default()
            })
            .await
            .unwrap();
    }

    /// Counted into place or sorted, by dense sids or sparse ones (and
    /// negative), in order or not: the order of a stable sort by key
    /// (items with equal keys, told apart by their values, keep theirs).
    #[test]
    fn items_in_sid_order_are_in_key_order() {
        let mut next = below();
        for (len, sids, spread) in [
            (0, 1, 1),
            (1, 1, 1),
            (500, 1, 1),
            (500, 40, 1),
            (500, 40, 1_000_000),
        ] {
            for shuffled in [false, true] {
                let mut items: Vec<((i64, i64), usize)> = (0..len)
                    .map(|i| {
                        let sid = next(sids) as i64 * spread as i64 - i64::from(spread > 1);
                        ((sid, i as i64 / 3), i)
                    })
                    .collect();
                if shuffled {
                    // Equal keys out of their values' order too.
                    items.reverse();
                    items.sort_by_key(|(k, _)| k.1 % 7);
                }
                let mut want = items.clone();
                want.sort_by_key(|(k, _)| *k);
                assert_eq!(
                    in_sid_order(items, |k| k.0),
                    want,
                    "{len} {sids} {spread} {shuffled}"
                );
            }
        }
    }

    #[test]
    fn every_resolution_has_a_distinct_code_its_width_in_minutes() {
        let codes: Vec<i64> = Resolution::ALL.iter().map(|r| res_code(*r)).collect();
        for (r, code) in Resolution::ALL.iter().zip(&codes) {
            assert_eq!(code * 60_000, r.width_ms(), "{}", r.as_str());
            let back: Vec<_> = Resolution::ALL
                .iter()
                .filter(|o| res_code(**o) == *code)
                .collect();
            assert_eq!(back, [r], "code {code} names one resolution");
            assert_eq!(res_code_of_name("t", r.as_str()).unwrap(), *code);
        }
        assert!(matches!(
            res_code_of_name("t", "2m"),
            Err(Error::Corrupt(_))
        ));
    }

    /// Price ticks through many steps — appends, late ticks before and
    /// between blocks, replays, a key given twice in a step, steps large
    /// enough to cut many blocks — read back as a map of key to price
    /// would: every page from any cursor, every count; and the blocks keep
    /// their rules (capped, first tick at the start, counts exact).
    #[tokio::test]
    async fn price_tick_blocks_read_as_one_row_per_tick() {
        use std::collections::BTreeMap;
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let mut model: BTreeMap<TickKey, f64> = BTreeMap::new();
        let mut next = below();
        let t0 = 1_756_684_800_000i64;
        let key = |ts: i64, partition: u32, offset: u64| TickKey {
            ts: Timestamp(ts),
            partition,
            offset,
        };
        let mut offset = 0u64;
        for step in 0..40 {
            let size = [1, 3, 50, 400][(step % 4) as usize];
            let mut ticks = Vec::new();
            for _ in 0..size {
                offset += 1;
                let k = match next(10) {
                    // A replay of a stored tick, at a new price: the key
                    // is its identity, so it replaces it.
                    0 if !model.is_empty() => {
                        *model.keys().nth(next(model.len() as u64) as usize).unwrap()
                    }
                    // Late: anywhere in the past, even before every block.
                    1 => key(t0 + next(100_000) as i64 - 50_000, 1, offset),
                    _ => key(t0 + step * 10_000 + next(10_000) as i64, 0, offset),
                };
                let p = next(1_000) as f64 / 1_000.0;
                ticks.push(Tick {
                    token_id: "tok".into(),
                    key: k,
                    value: TickValue::Price { p },
                });
                model.insert(k, p);
            }
            if step % 5 == 0 {
                // One key twice in a step: the later wins.
                let mut again = ticks[0].clone();
                again.value = TickValue::Price { p: 0.999 };
                model.insert(again.key, 0.999);
                ticks.push(again);
            }
            write_ticks(&store, ticks).await;

            let end = Timestamp(t0 + 1_000_000);
            let keys: Vec<TickKey> = model.keys().copied().collect();
            for _ in 0..5 {
                let from = keys[next(keys.len() as u64) as usize];
                let limit = 1 + next(300) as usize;
                let page = store
                    .ticks(TickKind::Price, "tok", TickRange { from, end, limit })
                    .await
                    .unwrap();
                let want: Vec<(TickKey, f64)> = model
                    .range(from..)
                    .take(limit)
                    .map(|(k, p)| (*k, *p))
                    .collect();
                let got: Vec<(TickKey, f64)> = page
                    .iter()
                    .map(|t| match t.value {
                        TickValue::Price { p } => (t.key, p),
                        _ => unreachable!(),
                    })
                    .collect();
                assert_eq!(got, want, "step {step}: {limit} from {from:?}");
                let (a, b) = (
                    t0 - 60_000 + next(500_000) as i64,
                    t0 - 60_000 + next(500_000) as i64,
                );
                let (a, b) = (a.min(b), a.max(b));
                let count = store
                    .count_ticks(TickKind::Price, "tok", Timestamp(a), Timestamp(b))
                    .await
                    .unwrap();
                let want = model
                    .keys()
                    .filter(|k| (a..b).contains(&k.ts.millis()))
                    .count();
                assert_eq!(count, want as u64, "step {step}: count [{a}, {b})");
            }
            let (blocks, ticks, most): (i64, i64, i64) =
                Connection::open(dir.path().join("store.db"))
                    .unwrap()
                    .query_row(
                        "SELECT count(*), sum(n), max(n) FROM price_tick_blocks",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                    .unwrap();
            assert_eq!(ticks as usize, model.len(), "step {step}: counts exact");
            assert!(
                most as usize <= tickblock::BLOCK_TICKS,
                "step {step}: {most}"
            );
            assert!(blocks as usize >= model.len() / tickblock::BLOCK_TICKS);
        }
    }

    /// Price rows spread over several blocks at two resolutions, written
    /// in two steps — the second replacing some buckets of blocks the
    /// first wrote and adding others, next to a row of another table —
    /// load back as last written, and read back in range (averages,
    /// candles, count, limit) as those rows say.
    #[tokio::test]
    async fn price_rows_written_into_blocks_load_and_read_back_as_last_written() {
        use hindsight_contracts::{Candle, Mark};
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let t0 = 1_756_684_800_000i64;
        let row = |i: i64, step: u64| {
            let (id, res) = match i % 3 {
                0 => ("a", Resolution::ALL[0]),
                1 => ("b", Resolution::ALL[0]),
                _ => ("a", Resolution::ALL[3]),
            };
            let bucket = Timestamp(t0 + i * res.width_ms());
            let open = Mark {
                ts: bucket,
                offset: i as u64,
                p: 0.25,
            };
            let close = Mark {
                ts: Timestamp(bucket.millis() + 1_000),
                offset: i as u64 + 1,
                p: 0.5 + i as f64 / 1_000.0,
            };
            Row {
                key: RowKey {
                    table: Table::Prices,
                    id: id.into(),
                    res,
                    bucket,
                },
                value: RowValue::Price {
                    sum: 0.75 + i as f64 / 1_000.0 + step as f64,
                    count: 2 + i as u64 + step,
                    candle: (i % 7 != 0).then_some(Candle {
                        open,
                        close,
                        high: close.p,
                        low: open.p,
                    }),
                },
                last_offset: i as u64 + 1 + 1_000 * step,
            }
        };
        let n = 3 * bucketblock::BLOCK_BUCKETS * 3 + 5;
        let mut expected = std::collections::BTreeMap::new();
        for (step, keep) in [(0, 2), (1, 3)] {
            let rows: Vec<Row> = (0..n)
                .filter(|i| i % keep == 0)
                .map(|i| row(i, step))
                .collect();
            let mut write = rows.clone();
            write.push(Row {
                key: RowKey {
                    table: Table::Metrics,
                    id: "m".into(),
                    res: Resolution::ALL[0],
                    bucket: Timestamp(t0),
                },
                value: RowValue::Metrics {
                    volume_sum: 1.0,
                    liquidity_sum: 2.0,
                    spread_sum: 3.0,
                    count: 1,
                },
                last_offset: 9,
            });
            store
                .apply(ProjectionWrite {
                    rows: write,
                    ..Default::default()
                })
                .await
                .unwrap();
            for r in rows {
                expected.insert((r.key.id.clone(), r.key.res, r.key.bucket), r);
            }
        }
        let expected: Vec<Row> = expected.into_values().collect();
        let mut loaded = store
            .load(expected.iter().map(|r| r.key.clone()).collect())
            .await
            .unwrap();
        loaded.sort_by_key(|r| (r.key.id.clone(), r.key.res, r.key.bucket));
        assert_eq!(loaded, expected);

        let m1 = Resolution::ALL[0];
        let range = |limit| Range {
            res: m1,
            start: Timestamp(t0 + 10 * m1.width_ms()),
            end: Timestamp(t0 + 250 * m1.width_ms()),
            limit,
        };
        let want: Vec<&Row> = expected
            .iter()
            .filter(|r| &*r.key.id == "a" && r.key.res == m1)
            .filter(|r| (range(0).start..range(0).end).contains(&r.key.bucket))
            .collect();
        assert!(want.len() > 2 * bucketblock::BLOCK_BUCKETS as usize / 3);
        let prices = store.prices("a", range(1_000)).await.unwrap();
        let candles = store.candles("a", range(1_000)).await.unwrap();
        assert_eq!(prices.len(), want.len());
        assert_eq!(candles.len(), want.len());
        for ((p, c), r) in prices.iter().zip(&candles).zip(&want) {
            let RowValue::Price { sum, count, candle } = &r.value else {
                unreachable!("price rows")
            };
            assert_eq!((p.t, p.p), (r.key.bucket, sum / *count as f64));
            assert_eq!((c.t, c.count, &c.candle), (r.key.bucket, *count, candle));
        }
        assert_eq!(
            store.count(Table::Prices, "a", range(0)).await.unwrap(),
            want.len() as u64
        );
        let first = store.prices("a", range(5)).await.unwrap();
        assert_eq!(first, prices[..5]);

        // Frontiers are exact here: the end of the last bucket stored (a
        // price block's last entry), the least bucket where none is.
        let series: Vec<Series> = ["a", "b", "m", "nothing"]
            .map(|id| {
                (
                    if id == "m" {
                        Table::Metrics
                    } else {
                        Table::Prices
                    },
                    id.into(),
                )
            })
            .into();
        let bounds = store.frontiers(series.clone()).await.unwrap();
        for ((table, id), got) in series.iter().zip(bounds) {
            let want = Resolution::ALL.map(|res| {
                let last = match table {
                    Table::Metrics => (res == m1).then_some(t0),
                    _ => expected
                        .iter()
                        .filter(|r| (&r.key.id, r.key.res) == (id, res))
                        .map(|r| r.key.bucket.millis())
                        .max(),
                };
                Timestamp(last.map_or(i64::MIN, |b| b + res.width_ms()))
            });
            assert_eq!(got, want, "{id}");
        }
    }

    /// The writer's backstop checkpoint is the same bytes of WAL whatever
    /// the file's page size: a new store (16 KiB pages) and one created
    /// with SQLite's 4 KiB pages both set it at 256 MiB.
    #[tokio::test]
    async fn the_backstop_is_the_same_bytes_of_wal_at_any_page_size() {
        let old = tempfile::tempdir().unwrap();
        rusqlite::Connection::open(old.path().join(crate::db::STORE_FILE))
            .unwrap()
            .execute_batch("PRAGMA page_size = 4096; PRAGMA journal_mode = WAL;")
            .unwrap();
        let new = tempfile::tempdir().unwrap();
        for (dir, page_size) in [(old.path(), 4096), (new.path(), 16_384)] {
            let store = SqliteStore::open(dir).unwrap();
            let writer = store.writer.lock().unwrap();
            let pragma = |name: &str| -> i64 {
                writer
                    .conn
                    .pragma_query_value(None, name, |r| r.get(0))
                    .unwrap()
            };
            assert_eq!(pragma("page_size"), page_size);
            assert_eq!(pragma("wal_autocheckpoint") * page_size, 256 << 20);
        }
    }

    /// Commits are copied into the database file by the checkpoint thread,
    /// not left in the WAL until the writer's backstop: a write far below
    /// the backstop still reaches `store.db` soon after its commit. The
    /// WAL is gone once the store is closed.
    #[tokio::test]
    async fn the_checkpoint_thread_copies_commits_into_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let file = dir.path().join(crate::db::STORE_FILE);
        let size = || std::fs::metadata(&file).unwrap().len();
        let before = size();
        let ticks: Vec<Tick> = (0..20_000)
            .map(|i| Tick {
                token_id: format!("token-{}", i % 500).into(),
                key: TickKey {
                    ts: Timestamp(1_756_684_800_000 + i),
                    partition: 0,
                    offset: i as u64,
                },
                value: TickValue::Book {
                    bids: format!("[[\"0.{i}\",\"1\"]]").into(),
                    asks: "[]".into(),
                },
            })
            .collect();
        write_ticks(&store, ticks).await;
        let wal = std::fs::metadata(dir.path().join("store.db-wal"))
            .unwrap()
            .len();
        assert!(
            wal < crate::checkpoint::WRITER_BACKSTOP_BYTES as u64 / 4,
            "the write ({wal} bytes of WAL) stays far below the backstop"
        );
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while size() < before + wal / 2 {
            assert!(
                Instant::now() < deadline,
                "store.db still {} bytes (was {before}) with {wal} bytes of WAL",
                size()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Closing the store closes the thread's connection too, so the
        // last close checkpoints and deletes the WAL.
        drop(store);
        assert!(!dir.path().join("store.db-wal").exists());
    }

    /// A write's sids are found by the address of each id after its first
    /// lookup by name (`SidLookup`): ticks sharing one id, and ticks of
    /// other tokens whose ids are each a separate allocation of a name of
    /// the same length, interleaved, each land under their own token.
    #[tokio::test]
    async fn ticks_land_under_their_own_token_however_their_ids_are_allocated() {
        use hindsight_contracts::{ReadStore, TickKind};
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let t0 = 1_756_684_800_000i64;
        let shared: Arc<str> = "tok-s".into();
        let ticks: Vec<Tick> = (0..3_000u64)
            .map(|i| Tick {
                token_id: match i % 3 {
                    0 => shared.clone(),
                    // Same length, a fresh allocation each.
                    1 => "tok-a".into(),
                    _ => "tok-b".into(),
                },
                key: TickKey {
                    ts: Timestamp(t0 + i as i64),
                    partition: 0,
                    offset: i,
                },
                value: TickValue::Price { p: 0.5 },
            })
            .collect();
        drop(shared);
        write_ticks(&store, ticks).await;
        for token in ["tok-s", "tok-a", "tok-b"] {
            let n = store
                .count_ticks(TickKind::Price, token, Timestamp(t0), Timestamp(t0 + 3_000))
                .await
                .unwrap();
            assert_eq!(n, 1_000, "{token}");
        }
    }

    /// The store's cache of sids keys the writer's id, not a copy of it:
    /// an id the projector interned is held once however many maps find
    /// it (a catalog of 100 000 tokens with ids of Polymarket's lengths).
    #[tokio::test]
    async fn the_sid_cache_keeps_the_writers_id_not_a_copy() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let id: Arc<str> = "tok".into();
        let tick = Tick {
            token_id: id.clone(),
            key: TickKey {
                ts: Timestamp(1_756_684_800_000),
                partition: 0,
                offset: 0,
            },
            value: TickValue::Price { p: 0.5 },
        };
        write_ticks(&store, vec![tick]).await;
        assert_eq!(Arc::strong_count(&id), 2, "this one and the cache's");
    }

    /// Opening the store creates only its own file: a `backfill`, `rebuild`
    /// or projector leaves no `accounts.db`, `exports.db` or `limits.db`
    /// behind. Each is created, with its schema, by its first use.
    #[tokio::test]
    async fn the_api_files_are_created_by_their_first_use() {
        use hindsight_contracts::{AccountStore, AuthStore, ExportJobStore};
        let dir = tempfile::tempdir().unwrap();
        let files = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".db"))
                .collect();
            names.sort();
            names
        };
        let store = SqliteStore::open(dir.path()).unwrap();
        assert_eq!(files(), ["store.db"]);
        let now = Timestamp(1_756_684_800_000);
        assert!(store.organization("o").await.unwrap().is_none());
        assert!(store.take_hit("k", now, 10).await.unwrap().admitted);
        assert!(store.job("j").await.unwrap().is_none());
        assert_eq!(
            files(),
            ["accounts.db", "exports.db", "limits.db", "store.db"]
        );
        // Reopened, the files and what they hold are there.
        drop(store);
        let store = SqliteStore::open(dir.path()).unwrap();
        assert_eq!(store.rate_hits("k", now).await.unwrap(), [now]);
    }
}
