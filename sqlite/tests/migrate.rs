//! A `store.db` written by schema version 1 (catalog changes ordered by log
//! offset) opens under version 2: its records are kept and listed, and
//! changes after a cursor are found by the new change sequence.

use hindsight_contracts::{Position, ProjectionStore, ProjectionWrite, ReadStore};
use hindsight_schemas::{codec, Event, MarketRecord, Timestamp, Token};
use hindsight_sqlite::SqliteStore;

/// The catalog tables as version 1 created them.
const V1_CATALOG: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
CREATE TABLE series (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, title TEXT NOT NULL, tags TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL
);
CREATE TABLE events (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, series_id TEXT, title TEXT NOT NULL, tags TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL
);
CREATE TABLE markets (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, event_id TEXT, question TEXT, status TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL
);
CREATE INDEX series_version ON series (version_offset);
CREATE INDEX events_version ON events (version_offset);
CREATE INDEX markets_version ON markets (version_offset);
";

fn market(id: &str, updated: i64) -> MarketRecord {
    MarketRecord {
        id: id.into(),
        slug: format!("{id}-slug"),
        event_id: None,
        question: Some("q".into()),
        description: None,
        status: "open".into(),
        start_date: None,
        end_date: None,
        closed_at: None,
        resolved_token_id: None,
        resolved_token_label: None,
        tokens: vec![Token {
            id: format!("{id}-y"),
            label: "Yes".into(),
        }],
        created_at: Timestamp(updated),
        updated_at: Timestamp(updated),
    }
}

#[tokio::test]
async fn a_version_1_store_opens_and_keeps_its_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let old = market("old", 1_000);
    {
        let conn = rusqlite::Connection::open(dir.path().join("store.db")).unwrap();
        conn.execute_batch(V1_CATALOG).unwrap();
        conn.execute(
            "INSERT INTO markets VALUES ('old', 'old-slug', NULL, 'q', 'open', NULL, NULL, 1000, 1000, 500, ?1)",
            [codec::encode(&Event::Market(old.clone()))],
        )
        .unwrap();
    }
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.market("old").await.unwrap(), Some(old.clone()));
    let (all, cursor) = store.catalog_changes(None).await.unwrap();
    assert_eq!(all, vec![Event::Market(old)]);
    // A change at a log offset far below the old record's is still news.
    let new = market("new", 2_000);
    store
        .apply(ProjectionWrite {
            catalog: vec![(
                Position {
                    partition: 1,
                    offset: 3,
                },
                Event::Market(new.clone()),
            )],
            ..Default::default()
        })
        .await
        .unwrap();
    let (since, _) = store.catalog_changes(Some(&cursor)).await.unwrap();
    assert_eq!(since, vec![Event::Market(new)]);
    // Opening again migrates nothing twice.
    drop(store);
    SqliteStore::open(dir.path()).unwrap();
}
