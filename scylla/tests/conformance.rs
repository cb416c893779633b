//! The shared read-store conformance suite against a real ScyllaDB node,
//! when one is reachable: `HINDSIGHT_SCYLLA_NODES=host:9042 cargo test -p
//! hindsight-scylla --test conformance -- --nocapture`. Without it the test
//! says so and does nothing.

use hindsight_contracts::conformance::{run_all, Backend};
use hindsight_scylla::store::parse_consistency;
use hindsight_scylla::{ScyllaConfig, ScyllaStore};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn scylla_store_conforms() {
    let Ok(nodes) = std::env::var("HINDSIGHT_SCYLLA_NODES") else {
        eprintln!(
            "SKIPPED: ScyllaDB conformance suite not run: HINDSIGHT_SCYLLA_NODES is not set \
             (no ScyllaDB node is reachable from this machine)"
        );
        return;
    };
    let config = ScyllaConfig {
        nodes: nodes.split(',').map(String::from).collect(),
        keyspace: "hindsight_conformance".into(),
        replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
        consistency: parse_consistency("LOCAL_QUORUM").unwrap(),
        request_timeout: Duration::from_secs(10),
        write_concurrency: 16,
    };
    ScyllaStore::migrate(&config).await.expect("migrate");
    assert!(
        ScyllaStore::migrate(&config).await.unwrap().is_empty(),
        "a second migrate is a no-op"
    );
    let a: Arc<dyn Backend> =
        Arc::new(ScyllaStore::connect(config.clone()).await.expect("connect"));
    let b: Arc<dyn Backend> = Arc::new(ScyllaStore::connect(config).await.expect("connect"));
    let run = format!("run{}", std::process::id());
    let failures = run_all(a, b, &run).await;
    assert!(failures.is_empty(), "{failures:#?}");
}
