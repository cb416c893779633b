//! The schema (`schemas/cql/hindsight.cql`) and `hindsight scylla migrate`.

/// Bumped with every change to `schemas/cql/hindsight.cql`.
/// Version 2: `market_slugs` and `market_tokens` replace `markets_by_slug`
/// and `tokens` (a market upsert now replaces its slug and token list).
/// Migrating a version 1 keyspace creates the new tables empty: run
/// `hindsight rebuild` after it to fill them from the log.
/// Version 3: `rate_hits`, a log of admitted requests, replaces the counter
/// table `rate_windows` (fixed minute windows let twice a plan's rate through
/// around a window's edge); a migrated keyspace keeps the old table unused,
/// drop it by hand. And `catalog_consumed` (created empty: the catalog
/// records of a version 2 keyspace are decided already, and replays start
/// after them).
/// Version 4: `idempotency_keys`, ingest's idempotency keys in Kafka mode
/// (created empty; keys of `idempotency.db` files are not carried over:
/// migrate while no batch is being retried, or accept that a retry within
/// 24 h of the switch may be appended again).
/// Version 5: `series_periods`, the time partitions holding rows of each
/// series, so a range read skips empty ones; migrating a version 4
/// keyspace fills it from the bucket tables ([`INDEXED_SINCE`]).
/// Version 6: the tick-level tables `price_ticks`, `book_ticks`, `trades`
/// and `trade_ids`, created empty: events projected before have no ticks
/// until `hindsight rebuild` replays the log (the bucket tables are not
/// touched, so nothing else needs it).
/// Version 7: the candle columns of the `prices_*` tables
/// ([`crate::statements::CANDLE_COLUMNS`]); migrating an older keyspace
/// adds them (`ALTER TABLE`, each only if absent), NULL in existing rows:
/// those buckets have no candle until `hindsight rebuild`.
/// Version 8: the dashboard's accounts (`organizations`, `users`,
/// `users_by_org`, `sign_in_tokens`, `sessions`, `org_keys`, `key_usage`,
/// `key_last_used`), created empty.
/// Version 9: export jobs (`export_jobs`, `export_jobs_by_owner`,
/// `export_job_queue`, `export_chunks`, `export_chunk_index`), created
/// empty.
pub const SCHEMA_VERSION: i32 = 9;

/// The first version whose keyspaces keep `series_periods` up to date.
pub const INDEXED_SINCE: i32 = 5;

/// The first version whose `prices_*` tables have the candle columns.
pub const CANDLES_SINCE: i32 = 7;

const CQL: &str = include_str!("../../schemas/cql/hindsight.cql");

/// A keyspace name CQL accepts unquoted.
pub fn check_keyspace(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "keyspace {name:?} must match [a-z_][a-z0-9_]{{0,47}}"
        ))
    }
}

/// The schema's statements for a keyspace and replication map (CQL map
/// literal, e.g. `{'class': 'NetworkTopologyStrategy', 'replication_factor': 3}`).
pub fn statements(keyspace: &str, replication: &str) -> Vec<String> {
    let without_comments: String = CQL
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    without_comments
        .split(';')
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.replace("{keyspace}", keyspace)
                .replace("{replication}", replication)
        })
        .collect()
}

/// What `migrate` runs given the version recorded in the keyspace (`None`
/// when the keyspace or the migrations table does not exist yet): nothing
/// when the schema is current, else every statement and then the record.
pub fn migration_plan(recorded: Option<i32>, keyspace: &str, replication: &str) -> Vec<String> {
    if recorded.is_some_and(|v| v >= SCHEMA_VERSION) {
        return Vec::new();
    }
    let mut plan = statements(keyspace, replication);
    plan.push(format!(
        "INSERT INTO {keyspace}.schema_migrations (version, applied_at) VALUES ({SCHEMA_VERSION}, toTimestamp(now()))"
    ));
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPL: &str = "{'class': 'SimpleStrategy', 'replication_factor': 1}";

    #[test]
    fn every_statement_is_idempotent_and_tables_cover_every_resolution() {
        let all = statements("hs", REPL);
        assert!(all.iter().all(|s| s.contains("IF NOT EXISTS")), "{all:#?}");
        for res in hindsight_schemas::Resolution::ALL {
            for kind in ["prices", "metrics", "books"] {
                let table = format!("hs.{kind}_{} ", res.as_str());
                assert!(
                    all.iter()
                        .any(|s| s.starts_with("CREATE TABLE") && s.contains(&table)),
                    "{table}"
                );
            }
        }
        assert!(all[0].starts_with("CREATE KEYSPACE IF NOT EXISTS hs WITH replication = {'class'"));
        assert!(!all
            .iter()
            .any(|s| s.contains('{') && s.contains("keyspace}")));
    }

    #[test]
    fn migrate_twice_is_a_no_op_the_second_time() {
        let first = migration_plan(None, "hs", REPL);
        assert_eq!(first.len(), statements("hs", REPL).len() + 1);
        assert!(first
            .last()
            .unwrap()
            .starts_with("INSERT INTO hs.schema_migrations"));
        // After the first run the keyspace records SCHEMA_VERSION.
        assert!(migration_plan(Some(SCHEMA_VERSION), "hs", REPL).is_empty());
        // An older recorded version re-applies the (idempotent) statements.
        assert_eq!(migration_plan(Some(SCHEMA_VERSION - 1), "hs", REPL), first);
    }

    #[test]
    fn rate_hits_live_as_long_as_the_contract_keeps_them() {
        let table = statements("hs", REPL)
            .into_iter()
            .find(|s| s.starts_with("CREATE TABLE IF NOT EXISTS hs.rate_hits"))
            .expect("the rate_hits table");
        let ttl = hindsight_contracts::auth::RATE_HIT_RETENTION_MS / 1000;
        assert!(
            table.contains(&format!("default_time_to_live = {ttl} ")),
            "{table}"
        );
    }

    #[test]
    fn keyspace_names_are_checked() {
        assert!(check_keyspace("hindsight_prod").is_ok());
        for bad in ["", "Hindsight", "a-b", "1abc", "x; DROP"] {
            assert!(check_keyspace(bad).is_err(), "{bad}");
        }
    }
}
