//! The projector reads which market lists each token once, not again each
//! time it forgets bucket rows: over many tokens rows are forgotten every
//! few steps, and the next segment would look up nearly every token anew.

mod common;

use hindsight_contracts::faults::{FaultyStore, StoreFault};
use hindsight_contracts::{AppendBatch, EventLog};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::sync::Arc;

#[tokio::test]
async fn forgetting_rows_keeps_the_token_owners() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SqliteLog::open(dir.path()).unwrap());
    let sqlite = Arc::new(SqliteStore::open(dir.path()).unwrap());
    // No apply fails: the store only counts the tokens looked up.
    let store = Arc::new(FaultyStore::new(
        sqlite.clone(),
        StoreFault::FailApply(u64::MAX),
    ));
    // 50 tokens, each tick a second after the last: every step opens new
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
        store.tokens_looked_up(),
        tokens as u64,
        "each token's owner is read once over {steps} steps"
    );
}
