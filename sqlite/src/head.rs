//! A token's head (store schema 10): its newest price bucket block at each
//! resolution and its newest price tick block, together in one row of
//! `price_heads`.
//!
//! Why: a live step touches most tokens, and for each it rewrote the open
//! block at all seven resolutions and the last tick block — eight rows,
//! each a B-tree seek to read it and another to write it back, in tables
//! holding the whole history. Profiled on the live benchmark (20 000
//! tokens, 500 000 events/s offered), the store's writer was the busiest
//! thread, and SQLite's statements, not the blocks' encoding, were most of
//! it. With the newest blocks in one row per token, a step reads and
//! writes one row per token it touches, in a table as small as the number
//! of tokens; the full tables take a block only when the head moves past
//! it (a new window opens, a tick block fills), once per block.
//!
//! The layout's rules, which every read and write keeps:
//! - for each token and resolution that has price buckets, its head holds
//!   the block of the greatest window, and `price_bucket_blocks_past` holds
//!   its other blocks, never that one;
//! - for each token that has price ticks, its head holds the block with
//!   the greatest start, and `price_tick_blocks_past` holds its other
//!   blocks, never that one.
//!
//! So a bucket after the head's window, or a tick after its block's
//! start, is known absent from the full tables without a read; a late
//! event behind the head is merged into the full tables as before. The
//! views `price_bucket_blocks` and `price_tick_blocks` show both parts as
//! one table (the layout of schema 9), for SQL by hand, tests and
//! benchmarks; the store's own statements read the two parts directly.
//!
//! Each part keeps its block's bytes exactly as the full table would (see
//! [`crate::bucketblock`], [`crate::tickblock`]): which part holds a price
//! block depends only on which window is the newest, so a rebuilt store is
//! byte for byte the incrementally projected one, as before.

use crate::store::res_code;
use crate::Result;
use hindsight_contracts::TickKey;
use hindsight_schemas::{Resolution, Timestamp};
use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{params_from_iter, Connection, OptionalExtension};
use std::sync::LazyLock;

const NRES: usize = Resolution::ALL.len();

/// A head's price block at one resolution: as a row of
/// `price_bucket_blocks_past` holds it, less the key's `sid` and `res`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PriceBlock {
    /// The window's first bucket.
    pub block: i64,
    pub n: u64,
    pub ticks: u64,
    pub v: Vec<u8>,
}

/// A head's tick block: as a row of `price_tick_blocks_past` holds it,
/// less the `sid`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TickBlock {
    pub start: TickKey,
    pub n: u64,
    pub v: Vec<u8>,
}

/// One token's head: what one row of `price_heads` holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Head {
    /// By [`Resolution::index`].
    pub prices: [Option<PriceBlock>; NRES],
    pub ticks: Option<TickBlock>,
}

/// Columns per resolution: the block's start, `n`, `ticks` and `v`, named
/// with the resolution's code (`b1`, `n1`, `t1`, `v1` for `1m`).
fn price_columns(r: Resolution) -> [String; 4] {
    let c = res_code(r);
    [
        format!("b{c}"),
        format!("n{c}"),
        format!("t{c}"),
        format!("v{c}"),
    ]
}

const TICK_COLUMNS: [&str; 5] = [
    "tick_ts",
    "tick_partition",
    "tick_offset",
    "tick_n",
    "tick_v",
];

/// The statements of this module, built once from [`Resolution::ALL`].
struct Sql {
    table: String,
    views: String,
    read: String,
    write: String,
    /// By resolution index: one price block of a head.
    read_price: [String; NRES],
    read_ticks: String,
}

static SQL: LazyLock<Sql> = LazyLock::new(|| {
    let mut columns: Vec<String> = Vec::new();
    for r in Resolution::ALL {
        columns.extend(price_columns(r));
    }
    columns.extend(TICK_COLUMNS.map(String::from));
    let all = columns.join(", ");
    let mut bucket_view = String::from(
        "CREATE VIEW IF NOT EXISTS price_bucket_blocks (sid, res, block, n, ticks, v) AS
         SELECT sid, res, block, n, ticks, v FROM price_bucket_blocks_past",
    );
    for r in Resolution::ALL {
        let [b, n, t, v] = price_columns(r);
        bucket_view.push_str(&format!(
            "\n UNION ALL SELECT sid, {}, {b}, {n}, {t}, {v} FROM price_heads WHERE {v} IS NOT NULL",
            res_code(r)
        ));
    }
    let [ts, part, off, n, v] = TICK_COLUMNS;
    let tick_view = format!(
        "CREATE VIEW IF NOT EXISTS price_tick_blocks (sid, ts, log_partition, log_offset, n, v) AS
         SELECT sid, ts, log_partition, log_offset, n, v FROM price_tick_blocks_past
         UNION ALL SELECT sid, {ts}, {part}, {off}, {n}, {v} FROM price_heads WHERE {v} IS NOT NULL"
    );
    let typed = columns
        .iter()
        .map(|c| {
            let ty = if c.starts_with('v') || c == "tick_v" {
                "BLOB"
            } else {
                "INTEGER"
            };
            format!("{c} {ty}")
        })
        .collect::<Vec<_>>()
        .join(", ");
    let placeholders = (2..=columns.len() + 1)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let updates = columns
        .iter()
        .map(|c| format!("{c} = excluded.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    Sql {
        table: format!("CREATE TABLE IF NOT EXISTS price_heads (sid INTEGER PRIMARY KEY, {typed});"),
        views: format!("{bucket_view};\n{tick_view};"),
        read: format!("SELECT {all} FROM price_heads WHERE sid = ?1"),
        // An update in place when the row exists: the row keeps its
        // place, where a replace would delete and insert it.
        write: format!(
            "INSERT INTO price_heads (sid, {all}) VALUES (?1, {placeholders})
             ON CONFLICT (sid) DO UPDATE SET {updates}"
        ),
        read_price: Resolution::ALL.map(|r| {
            let [b, n, t, v] = price_columns(r);
            format!("SELECT {b}, {n}, {t}, {v} FROM price_heads WHERE sid = ?1 AND {v} IS NOT NULL")
        }),
        read_ticks: format!(
            "SELECT {ts}, {part}, {off}, {n}, {v} FROM price_heads WHERE sid = ?1 AND {v} IS NOT NULL"
        ),
    }
});

/// `price_heads` (the views come after the full tables: [`views_sql`]).
pub(crate) fn table_sql() -> &'static str {
    &SQL.table
}

/// The views `price_bucket_blocks` and `price_tick_blocks`: each full
/// table with its heads' blocks, as one.
pub(crate) fn views_sql() -> &'static str {
    &SQL.views
}

fn price_at(r: &rusqlite::Row, first: usize) -> rusqlite::Result<Option<PriceBlock>> {
    let Some(v) = r.get::<_, Option<Vec<u8>>>(first + 3)? else {
        return Ok(None);
    };
    Ok(Some(PriceBlock {
        block: r.get(first)?,
        n: r.get::<_, i64>(first + 1)? as u64,
        ticks: r.get::<_, i64>(first + 2)? as u64,
        v,
    }))
}

fn ticks_at(r: &rusqlite::Row, first: usize) -> rusqlite::Result<Option<TickBlock>> {
    let Some(v) = r.get::<_, Option<Vec<u8>>>(first + 4)? else {
        return Ok(None);
    };
    Ok(Some(TickBlock {
        start: TickKey {
            ts: Timestamp(r.get(first)?),
            partition: r.get::<_, i64>(first + 1)? as u32,
            offset: r.get::<_, i64>(first + 2)? as u64,
        },
        n: r.get::<_, i64>(first + 3)? as u64,
        v,
    }))
}

impl Head {
    /// The head of `sid`; empty when it has none (no price bucket or tick
    /// stored).
    pub(crate) fn read(conn: &Connection, sid: i64) -> Result<Head> {
        let head = conn
            .prepare_cached(&SQL.read)?
            .query_row([sid], |r| {
                let mut head = Head::default();
                for (i, slot) in head.prices.iter_mut().enumerate() {
                    *slot = price_at(r, 4 * i)?;
                }
                head.ticks = ticks_at(r, 4 * NRES)?;
                Ok(head)
            })
            .optional()?;
        Ok(head.unwrap_or_default())
    }

    /// Writes this as the head of `sid`, replacing what it had. The blobs
    /// are bound where they are, not copied.
    pub(crate) fn write(&self, conn: &Connection, sid: i64) -> Result<()> {
        let int = |i: i64| ToSqlOutput::Owned(Value::Integer(i));
        let null = || ToSqlOutput::Owned(Value::Null);
        let mut values: Vec<ToSqlOutput> = Vec::with_capacity(1 + 4 * NRES + 5);
        values.push(int(sid));
        for p in &self.prices {
            match p {
                Some(p) => values.extend([
                    int(p.block),
                    int(p.n as i64),
                    int(p.ticks as i64),
                    ToSqlOutput::Borrowed(ValueRef::Blob(&p.v)),
                ]),
                None => values.extend(std::iter::repeat_with(null).take(4)),
            }
        }
        match &self.ticks {
            Some(t) => values.extend([
                int(t.start.ts.millis()),
                int(t.start.partition as i64),
                int(t.start.offset as i64),
                int(t.n as i64),
                ToSqlOutput::Borrowed(ValueRef::Blob(&t.v)),
            ]),
            None => values.extend(std::iter::repeat_with(null).take(5)),
        }
        conn.prepare_cached(&SQL.write)?
            .execute(params_from_iter(values))?;
        Ok(())
    }
}

/// The head's price block of `sid` at `res`, if it has one.
pub(crate) fn price_block(
    conn: &Connection,
    sid: i64,
    res: Resolution,
) -> Result<Option<PriceBlock>> {
    Ok(conn
        .prepare_cached(&SQL.read_price[res.index()])?
        .query_row([sid], |r| price_at(r, 0))
        .optional()?
        .flatten())
}

/// The head's tick block of `sid`, if it has one.
pub(crate) fn tick_block(conn: &Connection, sid: i64) -> Result<Option<TickBlock>> {
    Ok(conn
        .prepare_cached(&SQL.read_ticks)?
        .query_row([sid], |r| ticks_at(r, 0))
        .optional()?
        .flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteStore;
    use hindsight_contracts::{
        Candle, Mark, ProjectionStore, ProjectionWrite, Range, ReadStore, Row, RowKey, RowValue,
        Table, Tick, TickKind, TickRange, TickValue,
    };
    use std::collections::BTreeMap;

    const T0: i64 = 1_756_684_800_000; // 2025-09-01T00:00:00Z
    const MINUTE: i64 = 60_000;

    /// A step's 1m price rows: (minute, version).
    type Step = &'static [(i64, u64)];

    /// Breaks of the layout's rules in the file at `db`: a series' block
    /// in the full table at or past its head's (or with no head block at
    /// all), a tick block at or past its head's start (or with no head).
    fn broken_rules(db: &std::path::Path) -> Vec<String> {
        let conn = Connection::open(db).unwrap();
        let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
        let mut broken = Vec::new();
        for r in Resolution::ALL {
            let [b, ..] = price_columns(r);
            let c = res_code(r);
            let n = count(&format!(
                "SELECT count(*) FROM price_bucket_blocks_past p LEFT JOIN price_heads h USING (sid)
                 WHERE p.res = {c} AND (h.{b} IS NULL OR p.block >= h.{b})"
            ));
            if n > 0 {
                broken.push(format!("{n} blocks at {r:?} not behind their head"));
            }
        }
        let n = count(
            "SELECT count(*) FROM price_tick_blocks_past p LEFT JOIN price_heads h USING (sid)
             WHERE h.tick_v IS NULL
                OR (p.ts, p.log_partition, p.log_offset) >= (h.tick_ts, h.tick_partition, h.tick_offset)",
        );
        if n > 0 {
            broken.push(format!("{n} tick blocks not behind their head"));
        }
        broken
    }

    fn price_row(minute: i64, step: u64) -> Row {
        let bucket = Timestamp(T0 + minute * MINUTE);
        let tick = Mark {
            ts: bucket,
            offset: minute as u64 + 100 * step,
            p: 0.5 + minute as f64 / 1_000.0,
        };
        Row {
            key: RowKey {
                table: Table::Prices,
                id: "a".into(),
                res: Resolution::M1,
                bucket,
            },
            value: RowValue::Price {
                sum: tick.p * (1 + step) as f64,
                count: 1 + step,
                candle: Some(Candle::of(tick)),
            },
            last_offset: tick.offset,
        }
    }

    fn price_tick(ms: i64) -> Tick {
        Tick {
            token_id: "a".into(),
            key: TickKey {
                ts: Timestamp(T0 + ms),
                partition: 0,
                offset: ms.unsigned_abs(),
            },
            value: TickValue::Price {
                p: 0.25 + (ms % 50) as f64 / 100.0,
            },
        }
    }

    /// Steps in time order, then rows and ticks behind the head, replays
    /// and ticks before every block: after each the newest blocks are in
    /// the head and only there, and every bucket and tick reads back as
    /// last written.
    #[tokio::test]
    async fn the_newest_blocks_are_in_the_head_and_only_there() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("store.db");
        let store = SqliteStore::open(dir.path()).unwrap();
        // Per step: 1m buckets (minute, version), price ticks (ms).
        let steps: [(Step, Vec<i64>); 4] = [
            // Two windows of 16 minutes, 100 ticks: the head takes the
            // second window and the second half of the ticks.
            (&[(0, 0), (20, 0)], (0..100).collect()),
            // Behind the head and past it; ticks behind the head's start
            // and after it (80 in its block: cut, one piece behind).
            (&[(5, 0), (40, 0)], (100..130).chain([10, 11]).collect()),
            // A replay of a bucket now behind the head, with a new value.
            (&[(20, 1)], vec![120, 125]),
            // Ticks before every block.
            (&[(41, 0)], vec![-7, -5]),
        ];
        let (mut buckets, mut ticks) = (BTreeMap::new(), BTreeMap::new());
        for (i, (rows, new_ticks)) in steps.into_iter().enumerate() {
            let rows: Vec<Row> = rows.iter().map(|&(m, s)| price_row(m, s)).collect();
            let new_ticks: Vec<Tick> = new_ticks.into_iter().map(price_tick).collect();
            for r in &rows {
                buckets.insert(r.key.bucket, r.clone());
            }
            for t in &new_ticks {
                ticks.insert(t.key, t.clone());
            }
            store
                .apply(ProjectionWrite {
                    rows,
                    ticks: new_ticks,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(broken_rules(&db), Vec::<String>::new(), "step {i}");

            let range = Range {
                res: Resolution::M1,
                start: Timestamp(T0 - 100 * MINUTE),
                end: Timestamp(T0 + 100 * MINUTE),
                limit: 1_000,
            };
            let candles = store.candles("a", range).await.unwrap();
            let want: Vec<_> = buckets
                .values()
                .map(|r| {
                    let RowValue::Price { count, candle, .. } = &r.value else {
                        unreachable!()
                    };
                    (r.key.bucket, *count, *candle)
                })
                .collect();
            let got: Vec<_> = candles.iter().map(|c| (c.t, c.count, c.candle)).collect();
            assert_eq!(got, want, "step {i}");
            assert_eq!(
                store.count(Table::Prices, "a", range).await.unwrap(),
                buckets.len() as u64
            );
            let loaded = store
                .load(buckets.values().map(|r| r.key.clone()).collect())
                .await
                .unwrap();
            assert_eq!(
                loaded,
                buckets.values().cloned().collect::<Vec<_>>(),
                "step {i}"
            );

            for from in [-10, 0, 49, 50, 60, 120, 200] {
                let from = TickKey {
                    ts: Timestamp(T0 + from),
                    partition: 0,
                    offset: 0,
                };
                let end = Timestamp(T0 + 1_000);
                let got = store
                    .ticks(
                        TickKind::Price,
                        "a",
                        TickRange {
                            from,
                            end,
                            limit: 1_000,
                        },
                    )
                    .await
                    .unwrap();
                let want: Vec<Tick> = ticks.range(from..).map(|(_, t)| t.clone()).collect();
                assert_eq!(got, want, "step {i}, ticks from {from:?}");
                let n = store
                    .count_ticks(TickKind::Price, "a", from.ts, end)
                    .await
                    .unwrap();
                assert_eq!(n, want.len() as u64, "step {i}, count from {from:?}");
            }
        }
        let conn = Connection::open(&db).unwrap();
        let (behind, head_n): (i64, i64) = conn
            .query_row(
                "SELECT (SELECT count(*) FROM price_tick_blocks_past), (SELECT tick_n FROM price_heads)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert!(behind >= 3, "blocks behind the head: {behind}");
        assert!(head_n > 0 && head_n <= 64, "{head_n}");
    }
}
