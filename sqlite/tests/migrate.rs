//! Data directories written by earlier versions open in place:
//! - a `store.db` of schema version 1 (catalog changes ordered by log
//!   offset) opens under version 2: its records are kept and listed, and
//!   changes after a cursor are found by the new change sequence;
//! - a `log.db` and an `idempotency.db` from before body digests keep
//!   answering the keys they hold, and new keys conflict on another body;
//! - a `store.db` of version 3 (no candle columns) keeps its prices, and
//!   its old buckets read as having no candle until `rebuild`.

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

/// `log.db` as it was before body digests were kept.
const LOG_BEFORE_DIGESTS: &str = "
CREATE TABLE log_batches (
    first_offset INTEGER PRIMARY KEY, count INTEGER NOT NULL,
    appended_at INTEGER NOT NULL, payload BLOB NOT NULL
);
CREATE TABLE idempotency (
    key TEXT PRIMARY KEY, first_offset INTEGER NOT NULL,
    response BLOB NOT NULL, created_at INTEGER NOT NULL
);
";

fn keyed(key: &str, body: &[u8], events: Vec<Event>) -> hindsight_contracts::AppendBatch {
    hindsight_contracts::AppendBatch {
        events,
        idempotency: Some(hindsight_contracts::Idempotency::for_body(
            key,
            body,
            body.to_vec(),
        )),
    }
}

fn catalog(id: &str) -> Vec<Event> {
    vec![Event::Market(market(id, 1_000))]
}

#[tokio::test]
async fn a_log_from_before_body_digests_opens_keeps_its_keys_and_conflicts_on_new_ones() {
    use hindsight_contracts::{AppendOutcome, EventLog};
    let dir = tempfile::tempdir().unwrap();
    let now = Timestamp::now().millis();
    {
        let conn = rusqlite::Connection::open(dir.path().join("log.db")).unwrap();
        conn.execute_batch(LOG_BEFORE_DIGESTS).unwrap();
        conn.execute(
            "INSERT INTO idempotency VALUES ('old-key', 0, CAST('old answer' AS BLOB), ?1)",
            [now],
        )
        .unwrap();
    }
    let log = hindsight_sqlite::SqliteLog::open(dir.path()).unwrap();
    // A key recorded without a digest keeps replaying, whatever the body.
    assert_eq!(
        log.append(keyed("old-key", b"any body", catalog("a")))
            .await
            .unwrap(),
        AppendOutcome::Duplicate {
            response: b"old answer".to_vec()
        }
    );
    // New keys carry their digest: another body under one is a conflict.
    assert_eq!(
        log.append(keyed("new-key", b"body 1", catalog("b")))
            .await
            .unwrap(),
        AppendOutcome::Appended { count: 1 }
    );
    assert_eq!(
        log.append(keyed("new-key", b"body 2", catalog("c")))
            .await
            .unwrap(),
        AppendOutcome::Conflict
    );
    assert_eq!(log.head().await.unwrap(), 1, "only body 1 was appended");
    // Opening again upgrades nothing twice.
    drop(log);
    hindsight_sqlite::SqliteLog::open(dir.path()).unwrap();
}

/// The length-prefixed envelopes of `events`: a batch row's payload as
/// written before compression.
fn raw_payload(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in events {
        let bytes = codec::encode(e);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

async fn read_all(log: &hindsight_sqlite::SqliteLog) -> Vec<(u64, Event)> {
    use hindsight_contracts::LogConsumer;
    let mut consumer = log.consumer(0).unwrap();
    let mut out = Vec::new();
    loop {
        let got = consumer
            .poll(1_000, std::time::Duration::from_millis(10))
            .await
            .unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend(got.into_iter().map(|d| (d.position.offset, d.event)));
    }
}

#[tokio::test]
async fn a_log_from_before_compression_reads_its_batches_and_compresses_new_ones() {
    use hindsight_contracts::{AppendBatch, EventLog};
    let dir = tempfile::tempdir().unwrap();
    let old = catalog("a")
        .into_iter()
        .chain(catalog("b"))
        .collect::<Vec<_>>();
    {
        let conn = rusqlite::Connection::open(dir.path().join("log.db")).unwrap();
        conn.execute_batch(LOG_BEFORE_DIGESTS).unwrap();
        conn.execute(
            "INSERT INTO log_batches VALUES (0, 2, 0, ?1)",
            [raw_payload(&old)],
        )
        .unwrap();
    }
    let log = hindsight_sqlite::SqliteLog::open(dir.path()).unwrap();
    let new = catalog("c");
    log.append(AppendBatch {
        events: new.clone(),
        idempotency: None,
    })
    .await
    .unwrap();
    let expected: Vec<(u64, Event)> = old
        .into_iter()
        .chain(new)
        .enumerate()
        .map(|(i, e)| (i as u64, e))
        .collect();
    assert_eq!(read_all(&log).await, expected);
    let conn = rusqlite::Connection::open(dir.path().join("log.db")).unwrap();
    let codecs: Vec<i64> = conn
        .prepare("SELECT codec FROM log_batches ORDER BY first_offset")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        codecs,
        vec![0, 1],
        "the old batch stays raw, the new one is zstd"
    );
    // Opening again upgrades nothing twice, and reads the same.
    drop(log);
    let log = hindsight_sqlite::SqliteLog::open(dir.path()).unwrap();
    assert_eq!(read_all(&log).await, expected);
}

#[tokio::test]
async fn a_damaged_compressed_batch_is_a_corrupt_log_error_not_a_panic() {
    use hindsight_contracts::{AppendBatch, EventLog, LogConsumer};
    let dir = tempfile::tempdir().unwrap();
    let log = hindsight_sqlite::SqliteLog::open(dir.path()).unwrap();
    log.append(AppendBatch {
        events: catalog("a"),
        idempotency: None,
    })
    .await
    .unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("log.db")).unwrap();
    conn.execute("UPDATE log_batches SET payload = X'28B52FFD00DEADBEEF'", [])
        .unwrap();
    let mut consumer = log.consumer(0).unwrap();
    let err = consumer
        .poll(10, std::time::Duration::from_millis(10))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("log batch at 0"), "{err}");
}

#[tokio::test]
async fn an_idempotency_file_from_before_claims_keeps_answering_its_keys() {
    use hindsight_contracts::{Claim, IdempotencyStore};
    let dir = tempfile::tempdir().unwrap();
    {
        let conn = rusqlite::Connection::open(dir.path().join("idempotency.db")).unwrap();
        conn.execute_batch(LOG_BEFORE_DIGESTS).unwrap();
        conn.execute(
            "INSERT INTO idempotency VALUES ('old-key', -1, CAST('old answer' AS BLOB), ?1)",
            [Timestamp::now().millis()],
        )
        .unwrap();
    }
    let store = hindsight_sqlite::IdempotencyFile::open(dir.path()).unwrap();
    let lease = std::time::Duration::from_secs(30);
    assert_eq!(
        store
            .claim("old-key", &[7; 32], 1, b"new answer", lease)
            .await
            .unwrap(),
        Claim::Done {
            response: b"old answer".to_vec()
        }
    );
    assert!(matches!(
        store
            .claim("new-key", &[7; 32], 2, b"new answer", lease)
            .await
            .unwrap(),
        Claim::Owned(_)
    ));
    drop(store);
    hindsight_sqlite::IdempotencyFile::open(dir.path()).unwrap();
}

/// `price_buckets` as versions 1 to 3 created it: no candle columns.
const V3_PRICES: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '3');
CREATE TABLE price_buckets (
    token_id TEXT NOT NULL, res TEXT NOT NULL, bucket INTEGER NOT NULL,
    sum REAL NOT NULL, count INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (token_id, res, bucket)
) WITHOUT ROWID;
INSERT INTO price_buckets VALUES ('t', '1m', 1756684800000, 0.75, 3, 9);
";

/// A store of version 3 opens under version 5 with its price history
/// intact: averages read as before, and the old bucket reads as one
/// without a candle (until `rebuild`), which later ticks do not give it.
#[tokio::test]
async fn a_version_3_store_keeps_its_prices_and_has_no_candles_until_rebuilt() {
    use hindsight_contracts::{
        Candle, CandlePoint, Mark, PricePoint, Range, Row, RowKey, RowValue, Table,
    };
    use hindsight_schemas::Resolution;
    let dir = tempfile::tempdir().unwrap();
    {
        let conn = rusqlite::Connection::open(dir.path().join("store.db")).unwrap();
        conn.execute_batch(V3_PRICES).unwrap();
    }
    let t = Timestamp(1_756_684_800_000);
    let range = Range {
        res: Resolution::M1,
        start: t,
        end: Timestamp(t.0 + 120_000),
        limit: 10,
    };
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(
        store.prices("t", range).await.unwrap(),
        vec![PricePoint { t, p: 0.25 }]
    );
    assert_eq!(
        store.candles("t", range).await.unwrap(),
        vec![CandlePoint {
            t,
            count: 3,
            candle: None,
            trades: None,
        }]
    );
    // A new bucket written after the upgrade has its candle.
    let mark = Mark {
        ts: Timestamp(t.0 + 60_001),
        offset: 10,
        p: 0.5,
    };
    let candle = Candle::of(mark);
    store
        .apply(ProjectionWrite {
            rows: vec![Row {
                key: RowKey {
                    table: Table::Prices,
                    id: "t".into(),
                    res: Resolution::M1,
                    bucket: Timestamp(t.0 + 60_000),
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
        .unwrap();
    drop(store);
    // Opening again is a no-op for the layout.
    let store = SqliteStore::open(dir.path()).unwrap();
    let candles = store.candles("t", range).await.unwrap();
    assert_eq!(candles.len(), 2);
    assert_eq!(candles[0].candle, None);
    assert_eq!(candles[1].candle, Some(candle));
}
