//! The API's state as the in-process tests here build it: the stores they
//! give, default plans and settings, and no caches (every answer is read
//! from the test's stores).

use hindsight_api::cache::Cache;
use hindsight_api::catalog::Catalog;
use hindsight_api::cursor::CursorKeys;
use hindsight_api::plans::Plans;
use hindsight_api::ApiParts;
use hindsight_contracts::{AuthStore, ReadStore};
use hindsight_sqlite::SqliteStore;
use std::sync::Arc;

/// Reads from `store`, keys from `keys`; the dashboard's usage counts, and
/// export jobs, in real SQLite stores (`accounts`, and one in a directory
/// that outlives the router).
pub fn parts(
    store: Arc<dyn ReadStore>,
    keys: Arc<dyn AuthStore>,
    accounts: Arc<SqliteStore>,
) -> ApiParts {
    ApiParts {
        catalog: Catalog::new(store.clone()),
        store,
        keys,
        accounts: accounts.clone(),
        usage: hindsight_api::usage::UsageMeter::new(accounts),
        dashboard: Default::default(),
        plans: Arc::new(Plans::default()),
        clock: Arc::new(hindsight_schemas::time::SystemClock),
        cursors: CursorKeys::new(&["a test secret of thirty-two bytes"]).unwrap(),
        pages: Arc::new(Cache::new("pages", 0)),
        known_keys: Arc::new(Cache::new("keys", 0)),
        tokens: Arc::new(Cache::new("tokens", 0)),
        exports: Default::default(),
        jobs: hindsight_api::jobs::Jobs::new(
            Arc::new(SqliteStore::open(&tempfile::tempdir().unwrap().keep()).unwrap()),
            Default::default(),
        ),
    }
}
