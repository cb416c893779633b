//! The embedded backend passes the shared conformance suite.

use hindsight_contracts::conformance::{run_all, Backend};
use hindsight_sqlite::SqliteStore;
use std::sync::Arc;

#[tokio::test]
async fn embedded_sqlite_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    // Two handles on one data directory: two processes' worth of clients.
    let a: Arc<dyn Backend> = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let b: Arc<dyn Backend> = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let failures = run_all(a, b, "embedded").await;
    assert!(failures.is_empty(), "{failures:#?}");
}
