//! The projector reads which market lists each token once, not again each
//! time it forgets bucket rows: over many tokens rows are forgotten every
//! few steps, and the next segment would look up nearly every token anew.

mod common;

use async_trait::async_trait;
use hindsight_contracts::{
    AppendBatch, Applied, EventLog, Frontiers, Position, ProjectionStore, ProjectionWrite, Result,
    Row, RowKey, Series, TokenRef,
};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts the tokens whose owner is looked up.
struct CountingStore {
    inner: Arc<SqliteStore>,
    looked_up: AtomicUsize,
}

#[async_trait]
impl ProjectionStore for CountingStore {
    async fn committed(&self) -> Result<Vec<Position>> {
        self.inner.committed().await
    }

    async fn load(&self, keys: Vec<RowKey>) -> Result<Vec<Row>> {
        self.inner.load(keys).await
    }

    async fn frontiers(&self, series: Vec<Series>) -> Result<Vec<Frontiers>> {
        self.inner.frontiers(series).await
    }

    async fn lookup_tokens(&self, token_ids: Vec<String>) -> Result<Vec<TokenRef>> {
        self.looked_up.fetch_add(token_ids.len(), Ordering::SeqCst);
        self.inner.lookup_tokens(token_ids).await
    }

    async fn apply(&self, write: ProjectionWrite) -> Result<Applied> {
        self.inner.apply(write).await
    }

    async fn reset(&self) -> Result<()> {
        self.inner.reset().await
    }
}

#[tokio::test]
async fn forgetting_rows_keeps_the_token_owners() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SqliteLog::open(dir.path()).unwrap());
    let sqlite = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let store = Arc::new(CountingStore {
        inner: sqlite.clone(),
        looked_up: AtomicUsize::new(0),
    });
    // 50 tokens, each tick a minute after the last: every step opens new
    // buckets, and 40 cached rows are passed at every step.
    let (n, tokens) = (2_000, 50);
    log.append(AppendBatch {
        events: common::ticks(0, n, tokens).into(),
        idempotency: None,
    })
    .await
    .unwrap();
    let source = Arc::new(EmbeddedSource {
        log: log.clone(),
        store: sqlite,
    });
    let config = ProjectorConfig {
        batch_max: 100,
        backlog_batch_max: 100,
        max_cached_rows: 40,
        ..Default::default()
    };
    let mut projector = Projector::new(source, store.clone(), config);
    let mut consumer = log.consumer(0).unwrap();
    let mut steps = 0;
    let mut done = 0;
    while done < n as usize {
        done += projector.step(&mut consumer).await.unwrap().events;
        steps += 1;
    }
    assert_eq!(steps, 20);
    assert_eq!(
        store.looked_up.load(Ordering::SeqCst),
        tokens as usize,
        "each token's owner is read once over {steps} steps"
    );
}
