//! Every CQL statement the backend prepares, as data: a name, the text and
//! the CQL types of its bind markers. `tests/golden/statements.txt` holds the
//! rendering of this list, so any change to a statement is a visible diff;
//! at connect, the types the server reports for each bind marker are checked
//! against the declared ones.

use hindsight_contracts::TickKind;
use hindsight_schemas::Resolution;

#[derive(Debug, Clone, PartialEq)]
pub struct Stmt {
    pub name: String,
    pub cql: String,
    /// CQL types of the bind markers, in order.
    pub binds: Vec<&'static str>,
}

fn stmt(name: impl Into<String>, cql: impl Into<String>, binds: &[&'static str]) -> Stmt {
    Stmt {
        name: name.into(),
        cql: cql.into(),
        binds: binds.to_vec(),
    }
}

/// Buckets per partition at every resolution (≤ 10 000 rows per partition).
pub const BUCKETS_PER_PERIOD: i64 = 8_640;

/// Length of one time partition of a resolution's tables.
pub fn period_ms(res: Resolution) -> i64 {
    res.width_ms() * BUCKETS_PER_PERIOD
}

pub fn period_of(res: Resolution, bucket_ms: i64) -> i64 {
    bucket_ms.div_euclid(period_ms(res))
}

/// Length of one time partition of the tick-level tables: an hour of one
/// token's ticks.
pub const TICK_PERIOD_MS: i64 = 3_600_000;

pub fn tick_period(ts_ms: i64) -> i64 {
    ts_ms.div_euclid(TICK_PERIOD_MS)
}

/// `(table, value columns with their CQL types)` of each tick-level table.
pub const TICK_TABLES: [(TickKind, &[(&str, &str)]); 3] = [
    (TickKind::Price, &[("p", "double")]),
    (TickKind::Book, &[("bids", "text"), ("asks", "text")]),
    (
        TickKind::Trade,
        &[
            ("price", "double"),
            ("size", "double"),
            ("side", "text"),
            ("trade_id", "text"),
        ],
    ),
];

/// `(table prefix, id column, value columns with their CQL types)`.
pub type BucketTable = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

pub const BUCKET_TABLES: [BucketTable; 3] = [
    (
        "prices",
        "token_id",
        &[("sum", "double"), ("count", "bigint")],
    ),
    (
        "metrics",
        "market_id",
        &[
            ("volume_sum", "double"),
            ("liquidity_sum", "double"),
            ("spread_sum", "double"),
            ("count", "bigint"),
        ],
    ),
    (
        "books",
        "token_id",
        &[
            ("ts", "timestamp"),
            ("snapshot_offset", "bigint"),
            ("bids", "text"),
            ("asks", "text"),
        ],
    ),
];

/// The candle columns of the `prices_*` tables (schema version 7), after
/// the value columns: stored and loaded with each row and read by
/// `range_candles_*`, never by `range_prices_*`, whose answer is unchanged.
/// NULL in rows written before version 7 (no candle until `rebuild`).
pub const CANDLE_COLUMNS: [(&str, &str); 8] = [
    ("open_ts", "timestamp"),
    ("open_offset", "bigint"),
    ("open_p", "double"),
    ("close_ts", "timestamp"),
    ("close_offset", "bigint"),
    ("close_p", "double"),
    ("high", "double"),
    ("low", "double"),
];

/// Columns a bucket table's rows are written and loaded with: its value
/// columns, and the candle columns on prices tables.
fn stored_columns(
    kind: &str,
    cols: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut all = cols.to_vec();
    if kind == "prices" {
        all.extend(CANDLE_COLUMNS);
    }
    all
}

pub fn all(ks: &str) -> Vec<Stmt> {
    let mut out = Vec::new();
    for (kind, id_col, range_cols) in BUCKET_TABLES {
        let cols = stored_columns(kind, range_cols);
        let names: Vec<&str> = cols.iter().map(|(n, _)| *n).collect();
        let types: Vec<&'static str> = cols.iter().map(|(_, t)| *t).collect();
        let range_names: Vec<&str> = range_cols.iter().map(|(n, _)| *n).collect();
        for res in Resolution::ALL {
            let table = format!("{ks}.{kind}_{}", res.as_str());
            let mut binds = vec!["text", "bigint", "timestamp"];
            binds.extend(&types);
            binds.push("bigint");
            out.push(stmt(
                format!("insert_{kind}_{}", res.as_str()),
                format!(
                    "INSERT INTO {table} ({id_col}, period, bucket, {}, last_offset) VALUES (?, ?, ?, {}, ?)",
                    names.join(", "),
                    vec!["?"; names.len()].join(", ")
                ),
                &binds,
            ));
            out.push(stmt(
                format!("load_{kind}_{}", res.as_str()),
                format!(
                    "SELECT bucket, {}, last_offset FROM {table} WHERE {id_col} = ? AND period = ? AND bucket IN ?",
                    names.join(", ")
                ),
                &["text", "bigint", "list<timestamp>"],
            ));
            out.push(stmt(
                format!("range_{kind}_{}", res.as_str()),
                format!(
                    "SELECT bucket, {} FROM {table} WHERE {id_col} = ? AND period = ? AND bucket >= ? AND bucket < ? LIMIT ?",
                    range_names.join(", ")
                ),
                &["text", "bigint", "timestamp", "timestamp", "int"],
            ));
            out.push(stmt(
                format!("count_{kind}_{}", res.as_str()),
                format!(
                    "SELECT count(*) FROM {table} WHERE {id_col} = ? AND period = ? AND bucket >= ? AND bucket < ?"
                ),
                &["text", "bigint", "timestamp", "timestamp"],
            ));
            if kind == "prices" {
                let candle: Vec<&str> = CANDLE_COLUMNS.iter().map(|(n, _)| *n).collect();
                out.push(stmt(
                    format!("range_candles_{}", res.as_str()),
                    format!(
                        "SELECT bucket, count, {} FROM {table} WHERE {id_col} = ? AND period = ? AND bucket >= ? AND bucket < ? LIMIT ?",
                        candle.join(", ")
                    ),
                    &["text", "bigint", "timestamp", "timestamp", "int"],
                ));
            }
        }
    }
    for (kind, cols) in TICK_TABLES {
        let table = kind.as_str();
        let names: Vec<&str> = cols.iter().map(|(n, _)| *n).collect();
        let mut binds = vec!["text", "bigint", "timestamp", "int", "bigint"];
        binds.extend(cols.iter().map(|(_, t)| *t));
        out.push(stmt(
            format!("insert_{table}"),
            format!(
                "INSERT INTO {ks}.{table} (token_id, period, ts, log_partition, log_offset, {}) VALUES (?, ?, ?, ?, ?, {})",
                names.join(", "),
                vec!["?"; names.len()].join(", ")
            ),
            &binds,
        ));
        // Cassandra refuses a tuple and a single-column bound on one
        // clustering column together; `(ts) < (?)` is a tuple too.
        out.push(stmt(
            format!("range_{table}"),
            format!(
                "SELECT ts, log_partition, log_offset, {} FROM {ks}.{table} WHERE token_id = ? AND period = ? AND (ts, log_partition, log_offset) >= (?, ?, ?) AND (ts) < (?) LIMIT ?",
                names.join(", ")
            ),
            &["text", "bigint", "timestamp", "int", "bigint", "timestamp", "int"],
        ));
        out.push(stmt(
            format!("count_{table}"),
            format!(
                "SELECT count(*) FROM {ks}.{table} WHERE token_id = ? AND period = ? AND ts >= ? AND ts < ?"
            ),
            &["text", "bigint", "timestamp", "timestamp"],
        ));
    }
    out.push(stmt(
        "latest_book_ticks",
        format!(
            "SELECT ts, log_partition, log_offset, bids, asks FROM {ks}.book_ticks WHERE token_id = ? AND period = ? AND ts >= ? AND ts <= ? ORDER BY ts DESC, log_partition DESC, log_offset DESC LIMIT 1"
        ),
        &["text", "bigint", "timestamp", "timestamp"],
    ));
    out.push(stmt(
        "select_trade_id",
        format!(
            "SELECT log_partition, log_offset FROM {ks}.trade_ids WHERE token_id = ? AND trade_id = ?"
        ),
        &["text", "text"],
    ));
    out.push(stmt(
        "insert_trade_id",
        format!(
            "INSERT INTO {ks}.trade_ids (token_id, trade_id, log_partition, log_offset) VALUES (?, ?, ?, ?)"
        ),
        &["text", "text", "int", "bigint"],
    ));
    out.push(stmt(
        "insert_series_period",
        format!("INSERT INTO {ks}.series_periods (tbl, id, period) VALUES (?, ?, ?)"),
        &["text", "text", "bigint"],
    ));
    out.push(stmt(
        "select_series_periods",
        format!(
            "SELECT period FROM {ks}.series_periods WHERE tbl = ? AND id = ? AND period >= ? AND period <= ? LIMIT ?"
        ),
        &["text", "text", "bigint", "bigint", "int"],
    ));
    out.push(stmt(
        "select_series_periods_desc",
        format!(
            "SELECT period FROM {ks}.series_periods WHERE tbl = ? AND id = ? AND period >= ? AND period <= ? ORDER BY period DESC LIMIT ?"
        ),
        &["text", "text", "bigint", "bigint", "int"],
    ));
    out.push(stmt(
        "upsert_consumed",
        format!("INSERT INTO {ks}.consumed (partition, next_offset) VALUES (?, ?)"),
        &["int", "bigint"],
    ));
    out.push(stmt(
        "select_consumed",
        format!("SELECT partition, next_offset FROM {ks}.consumed"),
        &[],
    ));
    out.push(stmt(
        "upsert_catalog_consumed",
        format!("INSERT INTO {ks}.catalog_consumed (partition, next_offset) VALUES (?, ?)"),
        &["int", "bigint"],
    ));
    out.push(stmt(
        "select_catalog_consumed",
        format!("SELECT next_offset FROM {ks}.catalog_consumed WHERE partition = ?"),
        &["int"],
    ));
    for table in ["series", "events", "markets"] {
        out.push(stmt(
            format!("version_{table}"),
            format!("SELECT updated_at, version_offset, body FROM {ks}.{table} WHERE id = ?"),
            &["text"],
        ));
        out.push(stmt(
            format!("upsert_{table}"),
            format!("INSERT INTO {ks}.{table} (id, updated_at, version_offset, body) VALUES (?, ?, ?, ?)"),
            &["text", "timestamp", "bigint", "blob"],
        ));
        out.push(stmt(
            format!("all_{table}"),
            format!("SELECT version_offset, body FROM {ks}.{table}"),
            &[],
        ));
    }
    out.push(stmt(
        "select_market",
        format!("SELECT body FROM {ks}.markets WHERE id = ?"),
        &["text"],
    ));
    out.push(stmt(
        "upsert_market_slug",
        format!("INSERT INTO {ks}.market_slugs (slug, id) VALUES (?, ?)"),
        &["text", "text"],
    ));
    out.push(stmt(
        "delete_market_slug",
        format!("DELETE FROM {ks}.market_slugs WHERE slug = ? AND id = ?"),
        &["text", "text"],
    ));
    out.push(stmt(
        "select_market_slug",
        format!("SELECT id FROM {ks}.market_slugs WHERE slug = ?"),
        &["text"],
    ));
    out.push(stmt(
        "upsert_token",
        format!("INSERT INTO {ks}.market_tokens (token_id, market_id, label) VALUES (?, ?, ?)"),
        &["text", "text", "text"],
    ));
    out.push(stmt(
        "delete_token",
        format!("DELETE FROM {ks}.market_tokens WHERE token_id = ? AND market_id = ?"),
        &["text", "text"],
    ));
    out.push(stmt(
        "select_token",
        format!(
            "SELECT market_id, label, writetime(label) FROM {ks}.market_tokens WHERE token_id = ?"
        ),
        &["text"],
    ));
    out.push(stmt(
        "insert_catalog_change",
        format!("INSERT INTO {ks}.catalog_changes (day, changed_at, kind, id, body) VALUES (?, ?, ?, ?, ?)"),
        &["bigint", "timestamp", "text", "text", "blob"],
    ));
    out.push(stmt(
        "select_catalog_changes",
        format!(
            "SELECT changed_at, body FROM {ks}.catalog_changes WHERE day = ? AND changed_at > ?"
        ),
        &["bigint", "timestamp"],
    ));
    out.push(stmt(
        "upsert_key",
        format!("INSERT INTO {ks}.api_keys (hash, key_id, organization, plan, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?)"),
        &["blob", "text", "text", "text", "timestamp", "timestamp"],
    ));
    out.push(stmt(
        "select_key",
        format!("SELECT hash, key_id, organization, plan, created_at, revoked_at FROM {ks}.api_keys WHERE hash = ?"),
        &["blob"],
    ));
    out.push(stmt(
        "all_keys",
        format!(
            "SELECT hash, key_id, organization, plan, created_at, revoked_at FROM {ks}.api_keys"
        ),
        &[],
    ));
    out.push(stmt(
        "insert_hit",
        format!("INSERT INTO {ks}.rate_hits (key_id, at, id) VALUES (?, ?, ?)"),
        &["text", "timestamp", "bigint"],
    ));
    out.push(stmt(
        "select_hits",
        format!("SELECT at FROM {ks}.rate_hits WHERE key_id = ? AND at > ? AND at < ?"),
        &["text", "timestamp", "timestamp"],
    ));
    out.push(stmt(
        "delete_hit",
        format!("DELETE FROM {ks}.rate_hits WHERE key_id = ? AND at = ? AND id = ?"),
        &["text", "timestamp", "bigint"],
    ));
    // Idempotency keys: lightweight transactions only (see `idempotency.rs`).
    let keys = format!("{ks}.idempotency_keys");
    out.push(stmt(
        "claim_key",
        format!("INSERT INTO {keys} (key, body_sha256, owner, lease_until, state, response, created_at) VALUES (?, ?, ?, ?, 'pending', ?, ?) IF NOT EXISTS USING TTL 86400"),
        &["text", "blob", "blob", "timestamp", "blob", "timestamp"],
    ));
    out.push(stmt(
        "take_over_key",
        format!("UPDATE {keys} USING TTL ? SET owner = ?, lease_until = ? WHERE key = ? IF owner = ? AND state = ?"),
        &["int", "blob", "timestamp", "text", "blob", "text"],
    ));
    out.push(stmt(
        "committing_key",
        format!("UPDATE {keys} USING TTL ? SET state = 'committing', marker_partition = ?, marker_offset = ?, marker_writer = ? WHERE key = ? IF owner = ?"),
        &["int", "int", "bigint", "text", "text", "blob"],
    ));
    out.push(stmt(
        "done_key",
        format!("UPDATE {keys} USING TTL ? SET state = 'done' WHERE key = ? IF owner = ?"),
        &["int", "text", "blob"],
    ));
    out.push(stmt(
        "release_key",
        format!("UPDATE {keys} USING TTL ? SET lease_until = ? WHERE key = ? IF owner = ?"),
        &["int", "timestamp", "text", "blob"],
    ));
    out.extend(crate::accounts::statements(ks));
    out.extend(crate::exports::statements(ks));
    out
}

/// Whether a statement updates a counter: not idempotent, never retried by
/// the driver (a retried increment could count twice).
pub fn is_counter(stmt: &Stmt) -> bool {
    stmt.cql.contains(" = count + ")
}

/// Whether a statement is a lightweight transaction (Paxos): run at serial
/// consistency and never retried blindly (a retry of an applied LWT is not
/// applied again, and answers as if it had lost).
pub fn is_lwt(stmt: &Stmt) -> bool {
    stmt.cql.contains(" IF ")
}

/// Tables `reset` empties: everything derived from the log.
pub fn derived_tables(ks: &str) -> Vec<String> {
    let mut t: Vec<String> = BUCKET_TABLES
        .iter()
        .flat_map(|(kind, _, _)| Resolution::ALL.map(|r| format!("{ks}.{kind}_{}", r.as_str())))
        .collect();
    for (kind, _) in TICK_TABLES {
        t.push(format!("{ks}.{}", kind.as_str()));
    }
    for name in [
        "trade_ids",
        "series_periods",
        "consumed",
        "catalog_consumed",
        "series",
        "events",
        "markets",
        "market_slugs",
        "market_tokens",
        "catalog_changes",
    ] {
        t.push(format!("{ks}.{name}"));
    }
    t
}

/// The golden rendering: one statement per line, `name | binds | cql`.
pub fn render(ks: &str) -> String {
    all(ks)
        .iter()
        .map(|s| format!("{} | ({}) | {}\n", s.name, s.binds.join(", "), s.cql))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_types_match_bind_markers_and_names_are_unique() {
        let all = all("hs");
        for s in &all {
            assert_eq!(s.cql.matches('?').count(), s.binds.len(), "{}", s.name);
        }
        let mut names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }

    #[test]
    fn partitions_stay_under_ten_thousand_rows() {
        for res in Resolution::ALL {
            assert!(period_ms(res) / res.width_ms() <= 10_000);
            let b = 1_756_684_800_000;
            assert_eq!(
                period_of(res, b),
                period_of(res, res.bucket_start(hindsight_schemas::Timestamp(b)).0)
            );
        }
        assert_eq!(period_ms(Resolution::M1), 6 * 86_400_000);
    }
}
