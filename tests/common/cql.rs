//! The CQL read store of a test (a keyspace of its own on the Cassandra
//! node `scripts/engines.sh` started), and reading its tables directly.
#![allow(dead_code)]

use super::kafka::{cql_nodes, unique};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::value::{CqlValue, Row};
use std::collections::BTreeMap;

/// A keyspace migrated with `hindsight scylla migrate` (one replica, `ONE`:
/// the node is alone).
#[derive(Clone)]
pub struct Keyspace {
    pub nodes: String,
    pub name: String,
}

impl Keyspace {
    pub fn migrate(name: &str) -> Keyspace {
        let ks = Keyspace {
            nodes: cql_nodes(),
            name: unique(name).to_lowercase(),
        };
        let out = super::hindsight()
            .args(["scylla", "migrate"])
            .args(ks.args())
            .args([
                "--scylla-replication",
                "{'class': 'SimpleStrategy', 'replication_factor': 1}",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scylla migrate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ks
    }

    /// The flags that point a hindsight command at this keyspace.
    pub fn args(&self) -> Vec<String> {
        [
            "--scylla-nodes",
            &self.nodes,
            "--scylla-keyspace",
            &self.name,
            "--scylla-consistency",
            "ONE",
        ]
        .map(String::from)
        .to_vec()
    }
}

pub struct Cql(Session);

impl Cql {
    pub async fn connect() -> Cql {
        let session = SessionBuilder::new()
            .known_node(cql_nodes())
            .build()
            .await
            .expect("connect to the CQL node");
        Cql(session)
    }

    pub async fn rows(&self, cql: &str) -> Vec<Vec<Option<CqlValue>>> {
        let result = self
            .0
            .query_unpaged(cql, &[])
            .await
            .unwrap_or_else(|e| panic!("{cql}: {e}"));
        let rows = result.into_rows_result().unwrap();
        rows.rows::<Row>()
            .unwrap()
            .map(|r| r.unwrap().columns)
            .collect()
    }

    /// Price ticks counted per token at `1d` (every tick lands in exactly
    /// one day bucket).
    pub async fn counted_per_token(&self, ks: &str) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for row in self
            .rows(&format!("SELECT token_id, count FROM {ks}.prices_1d"))
            .await
        {
            let (Some(CqlValue::Text(token)), Some(CqlValue::BigInt(n))) = (&row[0], &row[1])
            else {
                panic!("unexpected row {row:?}");
            };
            *out.entry(token.clone()).or_default() += n;
        }
        out
    }

    pub async fn counted(&self, ks: &str) -> i64 {
        self.counted_per_token(ks).await.values().sum()
    }

    /// Every row of the tables derived from the log, sorted, for comparing
    /// incremental tables with a rebuild. `catalog_changes` is keyed by the
    /// wall-clock time of projection, so only its distinct (kind, id, body)
    /// are compared.
    pub async fn snapshot(&self, ks: &str) -> Vec<String> {
        let mut out = Vec::new();
        for table in hindsight_scylla::statements::derived_tables(ks) {
            let short = table.split('.').nth(1).unwrap().to_string();
            let cql = if short == "catalog_changes" {
                format!("SELECT kind, id, body FROM {table}")
            } else {
                format!("SELECT * FROM {table}")
            };
            let mut rows: Vec<String> = self
                .rows(&cql)
                .await
                .iter()
                .map(|r| format!("{short}: {r:?}"))
                .collect();
            rows.sort();
            rows.dedup();
            out.extend(rows);
        }
        out
    }
}

/// Fails with the first difference between two snapshots.
pub fn assert_same_tables(incremental: &[String], clean: &[String]) {
    for (a, b) in incremental.iter().zip(clean) {
        assert_eq!(a, b, "incremental tables differ from a clean rebuild");
    }
    assert_eq!(
        incremental.len(),
        clean.len(),
        "incremental and rebuilt tables have different row counts"
    );
}
