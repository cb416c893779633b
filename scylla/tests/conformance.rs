//! The CQL store passes the shared read-store, idempotency-store and
//! export-job-store conformance suites on a real node, one test per check:
//!
//! ```text
//! eval "$(scripts/engines.sh start)"      # Apache Cassandra 5.0 on loopback
//! cargo test -p hindsight-scylla --test conformance
//! ```
//!
//! Without `HINDSIGHT_SCYLLA_NODES` every check fails and says how to start
//! a node: a suite that did not run must not count as passed.
//!
//! Each run migrates a keyspace of its own (`hsconf_<pid>_<n>`), once per
//! process for the checks that only touch their own ids, and one per
//! exclusive check (`reset`). Keyspaces of earlier runs whose process is
//! gone are dropped first, so a long-lived node does not pile them up.

use hindsight_contracts::conformance::{
    Backend, ExportJobsPair, IdempotencyPair, Scope, StorePair,
};
use hindsight_contracts::{ExportJobStore, IdempotencyStore};
use hindsight_scylla::store::parse_consistency;
use hindsight_scylla::{ScyllaConfig, ScyllaStore};
use scylla::client::session_builder::SessionBuilder;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

const PREFIX: &str = "hsconf_";

fn config(keyspace: String) -> ScyllaConfig {
    let nodes = std::env::var("HINDSIGHT_SCYLLA_NODES").unwrap_or_else(|_| {
        panic!(
            "HINDSIGHT_SCYLLA_NODES is not set: the CQL conformance suite needs a node. \
             Start one with `eval \"$(scripts/engines.sh start)\"` (Apache Cassandra 5.0 on \
             loopback) and run the tests again in that shell"
        )
    });
    ScyllaConfig {
        nodes: nodes.split(',').map(String::from).collect(),
        keyspace,
        replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
        consistency: parse_consistency("LOCAL_QUORUM").unwrap(),
        request_timeout: Duration::from_secs(10),
        write_concurrency: 16,
    }
}

/// Creates a fresh keyspace with the schema; a second migrate is a no-op.
async fn fresh_keyspace() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let keyspace = format!(
        "{PREFIX}{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    let config = config(keyspace.clone());
    let ran = ScyllaStore::migrate(&config).await.expect("migrate");
    assert!(
        !ran.is_empty(),
        "the first migrate of {keyspace} ran nothing"
    );
    let again = ScyllaStore::migrate(&config).await.expect("migrate again");
    assert!(again.is_empty(), "a second migrate ran {again:?}");
    keyspace
}

/// Drops the keyspaces of earlier runs whose process has exited.
async fn drop_stale_keyspaces() {
    let config = config("system".into());
    let session = SessionBuilder::new()
        .known_nodes(&config.nodes)
        .build()
        .await
        .expect("connect");
    let rows = session
        .query_unpaged("SELECT keyspace_name FROM system_schema.keyspaces", ())
        .await
        .expect("list keyspaces")
        .into_rows_result()
        .expect("rows");
    let names: Vec<String> = rows
        .rows::<(String,)>()
        .expect("keyspace names")
        .filter_map(|r| r.ok().map(|(name,)| name))
        .collect();
    for keyspace in names {
        let Some(pid) = keyspace
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('_').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            session
                .query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ())
                .await
                .expect("drop a stale keyspace");
        }
    }
}

/// The keyspace the shared checks write to, migrated once per process.
/// Only its name is kept: a session belongs to the runtime that made it,
/// and every `#[tokio::test]` has a runtime of its own.
static SHARED: OnceCell<String> = OnceCell::const_new();

async fn shared_keyspace() -> String {
    SHARED
        .get_or_init(|| async {
            drop_stale_keyspaces().await;
            fresh_keyspace().await
        })
        .await
        .clone()
}

async fn store(scope: Scope) -> StorePair {
    let keyspace = match scope {
        Scope::Shared => shared_keyspace().await,
        Scope::Exclusive => fresh_keyspace().await,
    };
    let connect = || async {
        let store = ScyllaStore::connect(config(keyspace.clone()))
            .await
            .expect("connect");
        Arc::new(store) as Arc<dyn Backend>
    };
    StorePair {
        a: connect().await,
        b: connect().await,
        keep: Box::new(()),
    }
}

/// Two stores (two sessions) on the shared keyspace: two ingest replicas.
async fn idempotency(_prefix: &str) -> IdempotencyPair {
    let keyspace = shared_keyspace().await;
    let connect = || async {
        let store = ScyllaStore::connect(config(keyspace.clone()))
            .await
            .expect("connect");
        Arc::new(store) as Arc<dyn IdempotencyStore>
    };
    IdempotencyPair {
        a: connect().await,
        b: connect().await,
        keep: Box::new(()),
    }
}

/// Two stores (two sessions) on a keyspace of the check's own: a claim
/// takes any job of the store.
async fn export_jobs(_prefix: &str) -> ExportJobsPair {
    let keyspace = fresh_keyspace().await;
    let connect = || async {
        let store = ScyllaStore::connect(config(keyspace.clone()))
            .await
            .expect("connect");
        Arc::new(store) as Arc<dyn ExportJobStore>
    };
    ExportJobsPair {
        a: connect().await,
        b: connect().await,
        keep: Box::new(()),
    }
}

mod cql {
    hindsight_contracts::store_conformance!(super::store);
    hindsight_contracts::idempotency_conformance!(super::idempotency);
    hindsight_contracts::export_jobs_conformance!(super::export_jobs);
}

/// A keyspace written before `series_periods` existed (schema version 4)
/// keeps serving its history after `scylla migrate`: the migration lists
/// the partitions its bucket tables already hold, so long range reads,
/// which only visit listed partitions, still find every row.
#[tokio::test]
async fn migrating_a_version_4_keyspace_lists_the_partitions_it_already_holds() {
    use hindsight_contracts::{ProjectionStore, ProjectionWrite, Range, ReadStore, Row, RowKey};
    use hindsight_contracts::{RowValue, Table};
    use hindsight_schemas::{Resolution, Timestamp};
    const YEAR: i64 = 365 * 86_400_000;
    let t0 = hindsight_contracts::conformance::T0;
    let keyspace = fresh_keyspace().await;
    let buckets = [t0, t0 + 10 * YEAR];
    let store = ScyllaStore::connect(config(keyspace.clone()))
        .await
        .expect("connect");
    let rows = buckets
        .iter()
        .map(|&t| Row {
            key: RowKey {
                table: Table::Prices,
                id: "old-token".into(),
                res: Resolution::M1,
                bucket: Timestamp(t),
            },
            value: RowValue::Price {
                sum: 0.5,
                count: 1,
                candle: None,
            },
            last_offset: 1,
        })
        .collect();
    store
        .apply(ProjectionWrite {
            rows,
            ..Default::default()
        })
        .await
        .expect("apply");
    // Back to what a version 4 keyspace holds: the rows, no listing.
    let session = SessionBuilder::new()
        .known_nodes(&config(keyspace.clone()).nodes)
        .build()
        .await
        .expect("connect");
    for statement in [
        format!("TRUNCATE {keyspace}.series_periods"),
        format!("TRUNCATE {keyspace}.schema_migrations"),
        format!("INSERT INTO {keyspace}.schema_migrations (version, applied_at) VALUES (4, toTimestamp(now()))"),
    ] {
        session.query_unpaged(statement, ()).await.expect("downgrade");
    }
    let read = |store: ScyllaStore| async move {
        let points = store
            .prices(
                "old-token",
                Range {
                    res: Resolution::M1,
                    start: Timestamp(t0 - YEAR),
                    end: Timestamp(t0 + 20 * YEAR),
                    limit: 100,
                },
            )
            .await
            .expect("read");
        points.into_iter().map(|p| p.t.0).collect::<Vec<_>>()
    };
    let unlisted = read(
        ScyllaStore::connect(config(keyspace.clone()))
            .await
            .unwrap(),
    )
    .await;
    assert!(
        unlisted.is_empty(),
        "without the listing a long read finds nothing ({unlisted:?}): the test would prove nothing"
    );
    let ran = ScyllaStore::migrate(&config(keyspace.clone()))
        .await
        .expect("migrate from version 4");
    assert!(!ran.is_empty(), "a version 4 keyspace is migrated");
    let found = read(
        ScyllaStore::connect(config(keyspace.clone()))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(found, buckets, "history after migrating");
}

/// A keyspace written before candles (schema version 5, `prices_*`
/// without the candle columns) keeps serving its price history after
/// `scylla migrate`, which adds the columns: its old buckets read as having
/// no candle (until `rebuild`), and new rows keep theirs.
#[tokio::test]
async fn migrating_a_keyspace_without_candle_columns_keeps_its_prices_and_adds_them() {
    use hindsight_contracts::{
        Candle, CandlePoint, Mark, PricePoint, ProjectionStore, ProjectionWrite, Range, ReadStore,
        Row, RowKey, RowValue, Table,
    };
    use hindsight_schemas::{Resolution, Timestamp};
    let t0 = hindsight_contracts::conformance::T0;
    let keyspace = fresh_keyspace().await;
    let session = SessionBuilder::new()
        .known_nodes(&config(keyspace.clone()).nodes)
        .build()
        .await
        .expect("connect");
    // Back to a version 5 keyspace: no candle columns, one old price row.
    for res in Resolution::ALL {
        let table = format!("{keyspace}.prices_{}", res.as_str());
        let columns: Vec<&str> = hindsight_scylla::statements::CANDLE_COLUMNS
            .iter()
            .map(|(c, _)| *c)
            .collect();
        session
            .query_unpaged(
                format!("ALTER TABLE {table} DROP ({})", columns.join(", ")),
                (),
            )
            .await
            .expect("drop the candle columns");
    }
    for statement in [
        format!("INSERT INTO {keyspace}.prices_1m (token_id, period, bucket, sum, count, last_offset) VALUES ('old', {}, {t0}, 0.75, 3, 9)",
            hindsight_scylla::statements::period_of(Resolution::M1, t0)),
        format!("TRUNCATE {keyspace}.schema_migrations"),
        format!("INSERT INTO {keyspace}.schema_migrations (version, applied_at) VALUES (5, toTimestamp(now()))"),
    ] {
        session.query_unpaged(statement, ()).await.expect("downgrade");
    }
    let refused = ScyllaStore::connect(config(keyspace.clone())).await;
    assert!(
        refused.is_err(),
        "a keyspace without the candle columns is refused until migrated"
    );
    let ran = ScyllaStore::migrate(&config(keyspace.clone()))
        .await
        .expect("migrate from version 5");
    assert!(!ran.is_empty(), "a version 5 keyspace is migrated");
    let again = ScyllaStore::migrate(&config(keyspace.clone()))
        .await
        .expect("migrate again");
    assert!(again.is_empty(), "the second migration is a no-op");
    let store = ScyllaStore::connect(config(keyspace.clone()))
        .await
        .expect("connect after migrating");
    let range = Range {
        res: Resolution::M1,
        start: Timestamp(t0),
        end: Timestamp(t0 + 120_000),
        limit: 10,
    };
    assert_eq!(
        store.prices("old", range).await.expect("prices"),
        vec![PricePoint {
            t: Timestamp(t0),
            p: 0.25
        }]
    );
    assert_eq!(
        store.candles("old", range).await.expect("candles"),
        vec![CandlePoint {
            t: Timestamp(t0),
            count: 3,
            candle: None,
            trades: None,
        }]
    );
    let candle = Candle::of(Mark {
        ts: Timestamp(t0 + 60_001),
        offset: 10,
        p: 0.5,
    });
    store
        .apply(ProjectionWrite {
            rows: vec![Row {
                key: RowKey {
                    table: Table::Prices,
                    id: "old".into(),
                    res: Resolution::M1,
                    bucket: Timestamp(t0 + 60_000),
                },
                value: RowValue::Price {
                    sum: 0.5,
                    count: 1,
                    candle: Some(candle),
                },
                last_offset: 10,
            }],
            ..Default::default()
        })
        .await
        .expect("apply");
    let candles = store.candles("old", range).await.expect("candles");
    assert_eq!(
        candles.iter().map(|c| c.candle).collect::<Vec<_>>(),
        vec![None, Some(candle)]
    );
}
