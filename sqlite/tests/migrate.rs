//! Data directories written by earlier versions open in place:
//! - a `store.db` of schema version 1 (catalog changes ordered by log
//!   offset) opens under version 2: its records are kept and listed, and
//!   changes after a cursor are found by the new change sequence;
//! - a `log.db` and an `idempotency.db` from before body digests keep
//!   answering the keys they hold, and new keys conflict on another body;
//! - a `store.db` of version 3 (no candle columns) keeps its prices, and
//!   its old buckets read as having no candle until `rebuild`;
//! - a `store.db` of version 5 (series tables keyed by text ids, price
//!   buckets' candles in columns) answers every read as before under
//!   version 6's integer ids and packed price values;
//! - a `store.db` of version 6 (a row per price tick) answers every tick
//!   read as before from version 7's blocks;
//! - a `store.db` of version 7 (a row per price bucket) answers every
//!   bucket read as before from version 8's blocks;
//! - a `store.db` of version 8 (price blocks keyed by series first)
//!   answers every bucket read as before with version 9's blocks keyed by
//!   time first, the same bytes;
//! - a `store.db` of version 9 (every block in the full tables) answers
//!   every bucket and tick read as before with version 10's heads, which
//!   hold each token's newest blocks, the same bytes;
//! - a `store.db` created with SQLite's 4 KiB pages keeps them, and takes
//!   writes as a new file of 16 KiB pages does, the same bytes.

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
            [codec::encode(&Event::Market(Box::new(old.clone())))],
        )
        .unwrap();
    }
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.market("old").await.unwrap(), Some(old.clone()));
    let (all, cursor) = store.catalog_changes(None).await.unwrap();
    assert_eq!(all, vec![Event::Market(Box::new(old))]);
    // A change at a log offset far below the old record's is still news.
    let new = market("new", 2_000);
    store
        .apply(ProjectionWrite {
            catalog: vec![(
                Position {
                    partition: 1,
                    offset: 3,
                },
                Event::Market(Box::new(new.clone())),
            )],
            ..Default::default()
        })
        .await
        .unwrap();
    let (since, _) = store.catalog_changes(Some(&cursor)).await.unwrap();
    assert_eq!(since, vec![Event::Market(Box::new(new))]);
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
        events: events.into(),
        idempotency: Some(hindsight_contracts::Idempotency::for_body(
            key,
            body,
            body.to_vec(),
        )),
    }
}

fn catalog(id: &str) -> Vec<Event> {
    vec![Event::Market(Box::new(market(id, 1_000)))]
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
async fn a_log_from_before_compression_reads_its_batches_and_packs_new_ones() {
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
        events: new.clone().into(),
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
        vec![0, 2],
        "the old batch stays raw, the new one is packed in zstd"
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
        events: catalog("a").into(),
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

/// A store of version 3 opens under the current version with its price history
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

/// A whole `store.db` of version 5 (the DDL of that version, comments
/// left out): series tables keyed by the text id, `res` as text, price
/// buckets with their sum and candle in columns.
const V5_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS price_buckets (
    token_id TEXT NOT NULL, res TEXT NOT NULL, bucket INTEGER NOT NULL,
    sum REAL NOT NULL, count INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    open_ts INTEGER, open_offset INTEGER, open_p REAL,
    close_ts INTEGER, close_offset INTEGER, close_p REAL, high REAL, low REAL,
    PRIMARY KEY (token_id, res, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metric_buckets (
    market_id TEXT NOT NULL, res TEXT NOT NULL, bucket INTEGER NOT NULL,
    volume_sum REAL NOT NULL, liquidity_sum REAL NOT NULL, spread_sum REAL NOT NULL,
    count INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (market_id, res, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS book_buckets (
    token_id TEXT NOT NULL, res TEXT NOT NULL, bucket INTEGER NOT NULL,
    ts INTEGER NOT NULL, snapshot_offset INTEGER NOT NULL,
    bids TEXT NOT NULL, asks TEXT NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (token_id, res, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS price_ticks (
    token_id TEXT NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, p REAL NOT NULL,
    PRIMARY KEY (token_id, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS book_ticks (
    token_id TEXT NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, bids TEXT NOT NULL, asks TEXT NOT NULL,
    PRIMARY KEY (token_id, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trades (
    token_id TEXT NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, price REAL NOT NULL, size REAL NOT NULL,
    side TEXT NOT NULL, trade_id TEXT,
    PRIMARY KEY (token_id, ts, log_partition, log_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trade_ids (
    token_id TEXT NOT NULL, trade_id TEXT NOT NULL,
    log_partition INTEGER NOT NULL, log_offset INTEGER NOT NULL,
    PRIMARY KEY (token_id, trade_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS consumed (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS catalog_consumed (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS series (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, title TEXT NOT NULL, tags TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL,
    change_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS series_slug ON series (slug);
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, series_id TEXT, title TEXT NOT NULL, tags TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL,
    change_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS events_slug ON events (slug);
CREATE INDEX IF NOT EXISTS events_series ON events (series_id);
CREATE TABLE IF NOT EXISTS markets (
    id TEXT PRIMARY KEY, slug TEXT NOT NULL, event_id TEXT, question TEXT, status TEXT NOT NULL,
    start_date INTEGER, end_date INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version_offset INTEGER NOT NULL, body BLOB NOT NULL,
    change_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS markets_slug ON markets (slug);
CREATE INDEX IF NOT EXISTS markets_event ON markets (event_id);
CREATE TABLE IF NOT EXISTS tokens (
    token_id TEXT PRIMARY KEY, market_id TEXT NOT NULL, label TEXT NOT NULL, ord INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tokens_market ON tokens (market_id);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY, hash BLOB NOT NULL UNIQUE, organization TEXT NOT NULL,
    plan TEXT NOT NULL, created_at INTEGER NOT NULL, revoked_at INTEGER
);
INSERT INTO meta VALUES ('schema_version', '5');
";

/// Rows of every series table of version 5: a bucket of several ticks, a
/// bucket of one tick, a bucket from before candles (NULL columns), a
/// metrics and a book bucket, ticks, a book snapshot and two trades, one
/// with an id.
const V5_ROWS: &str = "
INSERT INTO price_buckets VALUES ('tok-a', '1m', 1756684800000, 1.5, 3, 12,
    1756684800005, 10, 0.25, 1756684859000, 12, 0.75, 0.9, 0.1);
INSERT INTO price_buckets VALUES ('tok-a', '1d', 1756684800000, 0.5, 1, 40,
    1756684900000, 40, 0.5, 1756684900000, 40, 0.5, 0.5, 0.5);
INSERT INTO price_buckets (token_id, res, bucket, sum, count, last_offset)
    VALUES ('tok-b', '5m', 1756684800000, 0.75, 3, 9);
INSERT INTO metric_buckets VALUES ('mkt', '1h', 1756684800000, 10.0, 20.0, 0.5, 2, 7);
INSERT INTO book_buckets VALUES ('tok-a', '1m', 1756684800000, 1756684801000, 11,
    '[[0.4,10.0]]', '[[0.6,5.0]]', 11);
INSERT INTO price_ticks VALUES ('tok-a', 1756684800005, 0, 10, 0.25);
INSERT INTO price_ticks VALUES ('tok-a', 1756684859000, 0, 12, 0.75);
INSERT INTO book_ticks VALUES ('tok-a', 1756684801000, 0, 11, '[[0.4,10.0]]', '[[0.6,5.0]]');
INSERT INTO trades VALUES ('tok-a', 1756684802000, 0, 13, 0.5, 4.0, 'buy', 'x1');
INSERT INTO trade_ids VALUES ('tok-a', 'x1', 0, 13);
INSERT INTO trades VALUES ('tok-a', 1756684803000, 0, 14, 0.6, 1.0, 'sell', NULL);
";

/// A store of version 5 opens under the current version in place: every read answers
/// what the old tables held (the bucket from before candles still without
/// one), the old tables are gone, a trade id decided before stays decided,
/// and opening again changes nothing.
#[tokio::test]
async fn a_version_5_store_keeps_every_series_row_under_integer_ids() {
    use hindsight_contracts::{
        Candle, CandlePoint, Mark, MetricsPoint, PricePoint, Range, Table, Tick, TickKey, TickKind,
        TickRange, TickValue, TradeTotals,
    };
    use hindsight_schemas::{Resolution, TradeSide};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(V5_SCHEMA).unwrap();
        conn.execute_batch(V5_ROWS).unwrap();
    }
    let t = Timestamp(1_756_684_800_000);
    let range = |res| Range {
        res,
        start: t,
        end: Timestamp(t.0 + 86_400_000),
        limit: 10,
    };
    let mark = |ts: i64, offset, p| Mark {
        ts: Timestamp(ts),
        offset,
        p,
    };
    let trade = |ts: i64, offset, price, size, side, id: Option<&str>| Tick {
        token_id: "tok-a".into(),
        key: TickKey {
            ts: Timestamp(ts),
            partition: 0,
            offset,
        },
        value: TickValue::Trade {
            price,
            size,
            side,
            trade_id: id.map(Into::into),
        },
    };
    for reopen in [false, true] {
        let store = SqliteStore::open(dir.path()).unwrap();
        let m1 = range(Resolution::M1);
        assert_eq!(
            store.prices("tok-a", m1).await.unwrap(),
            vec![PricePoint { t, p: 0.5 }],
            "reopened: {reopen}"
        );
        assert_eq!(
            store.candles("tok-a", m1).await.unwrap(),
            vec![CandlePoint {
                t,
                count: 3,
                candle: Some(Candle {
                    open: mark(1_756_684_800_005, 10, 0.25),
                    close: mark(1_756_684_859_000, 12, 0.75),
                    high: 0.9,
                    low: 0.1,
                }),
                trades: None,
            }]
        );
        assert_eq!(
            store.candles("tok-a", range(Resolution::D1)).await.unwrap(),
            vec![CandlePoint {
                t,
                count: 1,
                candle: Some(Candle::of(mark(1_756_684_900_000, 40, 0.5))),
                trades: None,
            }]
        );
        let m5 = range(Resolution::M5);
        assert_eq!(
            store.prices("tok-b", m5).await.unwrap(),
            vec![PricePoint { t, p: 0.25 }]
        );
        assert_eq!(
            store.candles("tok-b", m5).await.unwrap(),
            vec![CandlePoint {
                t,
                count: 3,
                candle: None,
                trades: None,
            }]
        );
        assert_eq!(
            store.metrics("mkt", range(Resolution::H1)).await.unwrap(),
            vec![MetricsPoint {
                t,
                volume: 5.0,
                liquidity: 10.0,
                spread: 0.25,
            }]
        );
        let books = store.books("tok-a", m1).await.unwrap();
        assert_eq!(
            (books.len(), &*books[0].bids, &*books[0].asks),
            (1, "[[0.4,10.0]]", "[[0.6,5.0]]")
        );
        for (table, id, res, n) in [
            (Table::Prices, "tok-a", Resolution::M1, 1),
            (Table::Prices, "tok-a", Resolution::D1, 1),
            (Table::Prices, "tok-a", Resolution::M5, 0),
            (Table::Prices, "tok-b", Resolution::M5, 1),
            (Table::Metrics, "mkt", Resolution::H1, 1),
            (Table::Books, "tok-a", Resolution::M1, 1),
        ] {
            assert_eq!(
                store.count(table, id, range(res)).await.unwrap(),
                n,
                "{table:?} {id} {}",
                res.as_str()
            );
        }
        let day = Timestamp(t.0 + 86_400_000);
        for (kind, n) in [
            (TickKind::Price, 2),
            (TickKind::Book, 1),
            (TickKind::Trade, 2),
        ] {
            assert_eq!(store.count_ticks(kind, "tok-a", t, day).await.unwrap(), n);
        }
        let all = TickRange {
            from: TickKey::at(t),
            end: day,
            limit: 10,
        };
        let prices: Vec<f64> = store
            .ticks(TickKind::Price, "tok-a", all)
            .await
            .unwrap()
            .iter()
            .map(|t| match t.value {
                TickValue::Price { p } => p,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(prices, [0.25, 0.75]);
        let at = store
            .book_at("tok-a", t, Timestamp(t.0 + 2_000))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(at.key.offset, 11);
        assert_eq!(
            store.ticks(TickKind::Trade, "tok-a", all).await.unwrap(),
            vec![
                trade(1_756_684_802_000, 13, 0.5, 4.0, TradeSide::Buy, Some("x1")),
                trade(1_756_684_803_000, 14, 0.6, 1.0, TradeSide::Sell, None),
            ]
        );
        assert_eq!(
            store.trade_totals("tok-a", m1).await.unwrap(),
            vec![(
                t,
                TradeTotals {
                    volume: 5.0,
                    count: 2
                }
            )]
        );
        if !reopen {
            // The trade id decided before the upgrade keeps its position.
            store
                .apply(ProjectionWrite {
                    ticks: vec![trade(
                        1_756_684_804_000,
                        15,
                        0.7,
                        9.0,
                        TradeSide::Buy,
                        Some("x1"),
                    )],
                    ..Default::default()
                })
                .await
                .unwrap();
        }
    }
    let conn = rusqlite::Connection::open(&db).unwrap();
    let version: String = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, hindsight_sqlite::SCHEMA_VERSION.to_string());
    let left: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name LIKE 'v5_%' OR sql LIKE '%token_id TEXT NOT NULL, res%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "no table of the old layout is left");
    let series = names(&conn, "SELECT name FROM series_ids ORDER BY name");
    assert_eq!(series, ["mkt", "tok-a", "tok-b"]);
}

/// The one text column `sql` selects, row by row.
fn names(conn: &rusqlite::Connection, sql: &str) -> Vec<String> {
    conn.prepare(sql)
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A data directory whose `store.db` holds what `sql` writes: a store as
/// an older version left it.
fn old_store(sql: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
    (dir, db)
}

/// Asserts the store at `db` is at the current schema version and its
/// table `old_table` is gone; the connection, to look further.
fn assert_migrated(db: &std::path::Path, old_table: &str) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(db).unwrap();
    let (version, old): (String, i64) = conn
        .query_row(
            "SELECT (SELECT value FROM meta WHERE key = 'schema_version'),
                    (SELECT count(*) FROM sqlite_master WHERE name = ?1)",
            [old_table],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (version, old),
        (hindsight_sqlite::SCHEMA_VERSION.to_string(), 0),
        "{old_table} left behind"
    );
    conn
}

/// `price_ticks` as version 6 created it, with the series ids it keys by.
const V6_PRICE_TICKS: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '6');
CREATE TABLE series_ids (sid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE price_ticks (
    sid INTEGER NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, p REAL NOT NULL,
    PRIMARY KEY (sid, ts, log_partition, log_offset)
) WITHOUT ROWID;
INSERT INTO series_ids VALUES (1, 'tok-a'), (2, 'tok-b');
INSERT INTO price_ticks VALUES (1, 1756684800005, 0, 10, 0.25);
INSERT INTO price_ticks VALUES (1, 1756684800005, 1, 3, 0.4);
INSERT INTO price_ticks VALUES (1, 1756684859000, 0, 12, 0.75);
INSERT INTO price_ticks VALUES (1, 1756688400001, 0, 20, 0.5);
INSERT INTO price_ticks VALUES (2, 1756684800007, 0, 11, 0.125);
";

/// A store of version 6 opens under version 7 with its price ticks packed
/// into blocks: reads, pages from a key and counts over part of a block
/// answer what the rows held; the old table is gone; a later tick and a
/// replayed one merge into the migrated block, a tick before it starts a
/// block of its own; opening again changes nothing.
#[tokio::test]
async fn a_version_6_store_keeps_its_price_ticks_in_blocks() {
    use hindsight_contracts::{Tick, TickKey, TickKind, TickRange, TickValue};
    let (dir, db) = old_store(V6_PRICE_TICKS);
    let t = 1_756_684_800_000;
    let tick = |token: &str, ts: i64, partition, offset, p| Tick {
        token_id: token.into(),
        key: TickKey {
            ts: Timestamp(ts),
            partition,
            offset,
        },
        value: TickValue::Price { p },
    };
    let mut want = vec![
        tick("tok-a", t + 5, 0, 10, 0.25),
        tick("tok-a", t + 5, 1, 3, 0.4),
        tick("tok-a", t + 59_000, 0, 12, 0.75),
        tick("tok-a", t + 3_600_001, 0, 20, 0.5),
    ];
    let day = Timestamp(t + 86_400_000);
    for round in 0..3 {
        let store = SqliteStore::open(dir.path()).unwrap();
        let range = |from, limit| TickRange {
            from,
            end: day,
            limit,
        };
        let all = store
            .ticks(
                TickKind::Price,
                "tok-a",
                range(TickKey::at(Timestamp(0)), 10),
            )
            .await
            .unwrap();
        assert_eq!(all, want, "round {round}");
        let from = want[1].key;
        let page = store
            .ticks(TickKind::Price, "tok-a", range(from, 2))
            .await
            .unwrap();
        assert_eq!(page, want[1..3], "round {round}");
        assert_eq!(
            store
                .ticks(
                    TickKind::Price,
                    "tok-b",
                    range(TickKey::at(Timestamp(0)), 10)
                )
                .await
                .unwrap(),
            vec![tick("tok-b", t + 7, 0, 11, 0.125)]
        );
        for (start, end) in [
            (t, day.0),
            (t + 6, t + 3_600_002),
            (t + 5, t + 6),
            (t + 1, t + 2),
        ] {
            let n = want
                .iter()
                .filter(|w| (start..end).contains(&w.key.ts.0))
                .count();
            assert_eq!(
                store
                    .count_ticks(TickKind::Price, "tok-a", Timestamp(start), Timestamp(end))
                    .await
                    .unwrap(),
                n as u64,
                "round {round}: [{start}, {end})"
            );
        }
        if round == 0 {
            // A later tick inside the first block, a replay of one
            // migrated there, and one before every block.
            let late = tick("tok-a", t + 1_000, 0, 30, 0.9);
            let early = tick("tok-a", t + 1, 0, 31, 0.1);
            store
                .apply(ProjectionWrite {
                    ticks: vec![late.clone(), want[2].clone(), early.clone()],
                    ..Default::default()
                })
                .await
                .unwrap();
            want.insert(2, late);
            want.insert(0, early);
        }
    }
    let conn = assert_migrated(&db, "price_ticks");
    let blocks: Vec<(i64, i64, i64, i64)> = conn
        .prepare("SELECT sid, ts, log_offset, n FROM price_tick_blocks ORDER BY 1, 2, 3")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        blocks,
        [(1, t + 1, 31, 1), (1, t + 5, 10, 5), (2, t + 7, 11, 1)]
    );
}

/// `price_buckets` as versions 6 and 7 kept it, a row per bucket. Values
/// in `rowcodec`'s layout: `03 01 0A 00 00` one tick of 0.5 (decimal, scale
/// 1, mantissa 5) at the bucket's start and the row's `last_offset`;
/// `00` then 0.75's bits, a sum without a candle (a row from before
/// version 5).
const V7_PRICE_BUCKETS: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '7');
CREATE TABLE series_ids (sid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE price_buckets (
    sid INTEGER NOT NULL, res INTEGER NOT NULL, bucket INTEGER NOT NULL,
    count INTEGER NOT NULL, last_offset INTEGER NOT NULL, v BLOB NOT NULL,
    PRIMARY KEY (sid, res, bucket)
) WITHOUT ROWID;
INSERT INTO series_ids VALUES (1, 'tok-a'), (2, 'tok-b');
INSERT INTO price_buckets VALUES (1, 1, 1756684800000, 1, 12, X'03010A0000');
INSERT INTO price_buckets VALUES (1, 1, 1756687200000, 1, 20, X'03010A0000');
INSERT INTO price_buckets VALUES (1, 1440, 1756684800000, 3, 40, X'00000000000000E83F');
INSERT INTO price_buckets VALUES (2, 1, 1756684800000, 1, 11, X'03010A0000');
";

/// A store of version 7 opens under the current version with its price
/// buckets packed into blocks: averages, candles (none for the bucket from
/// before candles) and counts over part of a window answer what the rows
/// held; the old table is gone; a later bucket merges into a migrated
/// block; opening again changes nothing.
#[tokio::test]
async fn a_version_7_store_keeps_its_price_buckets_in_blocks() {
    use hindsight_contracts::{
        Candle, CandlePoint, Mark, PricePoint, Range, Row, RowKey, RowValue, Table,
    };
    use hindsight_schemas::Resolution;
    let (dir, db) = old_store(V7_PRICE_BUCKETS);
    let t = 1_756_684_800_000;
    let minute = 60_000;
    let range = |res, start: i64| Range {
        res,
        start: Timestamp(start),
        end: Timestamp(t + 86_400_000),
        limit: 10,
    };
    let point = |at: i64| PricePoint {
        t: Timestamp(at),
        p: 0.5,
    };
    let mut want = vec![point(t), point(t + 40 * minute)];
    for round in 0..3 {
        let store = SqliteStore::open(dir.path()).unwrap();
        let m1 = range(Resolution::M1, t);
        assert_eq!(
            store.prices("tok-a", m1).await.unwrap(),
            want,
            "round {round}"
        );
        assert_eq!(
            store.prices("tok-b", m1).await.unwrap(),
            vec![point(t)],
            "round {round}"
        );
        let tick = Mark {
            ts: Timestamp(t),
            offset: 12,
            p: 0.5,
        };
        assert_eq!(
            store
                .candles("tok-a", range(Resolution::M1, t))
                .await
                .unwrap()[0],
            CandlePoint {
                t: Timestamp(t),
                count: 1,
                candle: Some(Candle::of(tick)),
                trades: None,
            }
        );
        assert_eq!(
            store
                .candles("tok-a", range(Resolution::D1, t))
                .await
                .unwrap(),
            vec![CandlePoint {
                t: Timestamp(t),
                count: 3,
                candle: None,
                trades: None,
            }]
        );
        for (start, n) in [(t, want.len()), (t + 1, want.len() - 1)] {
            assert_eq!(
                store
                    .count(Table::Prices, "tok-a", range(Resolution::M1, start))
                    .await
                    .unwrap(),
                n as u64,
                "round {round}: from {start}"
            );
        }
        if round == 0 {
            // A bucket later in the first migrated block.
            let bucket = Timestamp(t + 3 * minute);
            let tick = Mark {
                ts: bucket,
                offset: 50,
                p: 0.5,
            };
            store
                .apply(ProjectionWrite {
                    rows: vec![Row {
                        key: RowKey {
                            table: Table::Prices,
                            id: "tok-a".into(),
                            res: Resolution::M1,
                            bucket,
                        },
                        value: RowValue::Price {
                            sum: 0.5,
                            count: 1,
                            candle: Some(Candle::of(tick)),
                        },
                        last_offset: 50,
                    }],
                    ..Default::default()
                })
                .await
                .unwrap();
            want.insert(1, point(bucket.0));
        }
    }
    let conn = assert_migrated(&db, "price_buckets");
    let blocks: Vec<(i64, i64, i64, i64, i64)> = conn
        .prepare("SELECT sid, res, block, n, ticks FROM price_bucket_blocks ORDER BY 1, 2, 3")
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // 16-minute windows from the epoch (`t` starts one, `t` + 40 minutes
    // is in the one from `t` + 32); 16-day windows.
    let day_window = t - t % (16 * 86_400_000);
    assert_eq!(
        blocks,
        [
            (1, 1, t, 2, 2),
            (1, 1, t + 32 * minute, 1, 1),
            (1, 1440, day_window, 1, 3),
            (2, 1, t, 1, 1)
        ]
    );
}

/// The price rows of the version 8 test: two tokens, blocks at two
/// resolutions, a bucket without a candle; `step` changes every value.
fn v8_rows(t: i64, step: u64) -> Vec<hindsight_contracts::Row> {
    use hindsight_contracts::{Candle, Mark, Row, RowKey, RowValue, Table};
    use hindsight_schemas::Resolution;
    let mut rows = Vec::new();
    for (i, (id, res, at)) in [
        ("tok-a", Resolution::M1, 0),
        ("tok-a", Resolution::M1, 1),
        ("tok-a", Resolution::M1, 40),
        ("tok-a", Resolution::D1, 0),
        ("tok-b", Resolution::M1, 3),
        ("tok-b", Resolution::H1, 20),
    ]
    .into_iter()
    .enumerate()
    {
        let bucket = Timestamp(t + at * res.width_ms());
        let tick = Mark {
            ts: bucket,
            offset: 10 * i as u64 + step,
            p: 0.25 + i as f64 / 100.0,
        };
        rows.push(Row {
            key: RowKey {
                table: Table::Prices,
                id: id.into(),
                res,
                bucket,
            },
            value: RowValue::Price {
                sum: tick.p * (1 + step) as f64,
                count: 1 + step,
                candle: (i != 3).then_some(Candle::of(tick)),
            },
            last_offset: tick.offset,
        });
    }
    rows
}

/// What the reads of the version 8 test answer: each token's prices and
/// candles at each resolution written, and counts from two starts.
async fn v8_reads(store: &SqliteStore, t: i64) -> Vec<String> {
    use hindsight_contracts::{Range, Table};
    use hindsight_schemas::Resolution;
    let range = |res, start: i64| Range {
        res,
        start: Timestamp(start),
        end: Timestamp(t + 30 * 86_400_000),
        limit: 100,
    };
    let mut out = Vec::new();
    for id in ["tok-a", "tok-b", "tok-c"] {
        for res in [Resolution::M1, Resolution::H1, Resolution::D1] {
            out.push(format!(
                "{:?}",
                store.prices(id, range(res, t)).await.unwrap()
            ));
            out.push(format!(
                "{:?}",
                store.candles(id, range(res, t)).await.unwrap()
            ));
            for start in [t, t + 1] {
                let n = store
                    .count(Table::Prices, id, range(res, start))
                    .await
                    .unwrap();
                out.push(format!("{id} {res:?} from {start}: {n}"));
            }
        }
    }
    out
}

/// Every price block of the store at `db`, in series order.
fn price_blocks(db: &std::path::Path) -> Vec<(i64, i64, i64, i64, i64, Vec<u8>)> {
    rusqlite::Connection::open(db)
        .unwrap()
        .prepare("SELECT sid, res, block, n, ticks, v FROM price_bucket_blocks ORDER BY 1, 2, 3")
        .unwrap()
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The block tables as version 9 created them, each holding every block
/// (version 10 keeps each token's newest in its head, `price_heads`): a
/// store written by this version is put back in that layout (the blocks'
/// bytes are the same in both), the views' rows becoming the tables'.
const TO_V9_BLOCKS: &str = "
CREATE TABLE v9_buckets (
    sid INTEGER NOT NULL, res INTEGER NOT NULL, block INTEGER NOT NULL,
    n INTEGER NOT NULL, ticks INTEGER NOT NULL, v BLOB NOT NULL,
    PRIMARY KEY (res, block, sid)
) WITHOUT ROWID;
INSERT INTO v9_buckets SELECT sid, res, block, n, ticks, v FROM price_bucket_blocks;
CREATE TABLE v9_ticks (
    sid INTEGER NOT NULL, ts INTEGER NOT NULL, log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL, n INTEGER NOT NULL, v BLOB NOT NULL,
    PRIMARY KEY (sid, ts, log_partition, log_offset)
) WITHOUT ROWID;
INSERT INTO v9_ticks SELECT sid, ts, log_partition, log_offset, n, v FROM price_tick_blocks;
DROP VIEW price_bucket_blocks;
DROP VIEW price_tick_blocks;
DROP TABLE price_heads;
DROP TABLE price_bucket_blocks_past;
DROP TABLE price_tick_blocks_past;
ALTER TABLE v9_buckets RENAME TO price_bucket_blocks;
CREATE INDEX price_bucket_blocks_by_series ON price_bucket_blocks (sid, res, block);
ALTER TABLE v9_ticks RENAME TO price_tick_blocks;
UPDATE meta SET value = '9' WHERE key = 'schema_version';
";

/// `price_bucket_blocks` as version 8 created it, keyed by series first
/// (after [`TO_V9_BLOCKS`]).
const TO_V8_PRICE_BLOCKS: &str = "
CREATE TABLE v8 (
    sid INTEGER NOT NULL, res INTEGER NOT NULL, block INTEGER NOT NULL,
    n INTEGER NOT NULL, ticks INTEGER NOT NULL, v BLOB NOT NULL,
    PRIMARY KEY (sid, res, block)
) WITHOUT ROWID;
INSERT INTO v8 SELECT sid, res, block, n, ticks, v FROM price_bucket_blocks;
DROP TABLE price_bucket_blocks;
ALTER TABLE v8 RENAME TO price_bucket_blocks;
UPDATE meta SET value = '8' WHERE key = 'schema_version';
";

/// A store of version 8 opens under the current version with its price
/// blocks keyed by time first and found by series through the index: the
/// same blocks, byte for byte, and every read answers as before; a later
/// write updates a migrated block in place; opening again changes nothing.
#[tokio::test]
async fn a_version_8_store_keeps_its_price_blocks_keyed_by_time_first() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let t = 1_756_684_800_000;
    let (reads, blocks) = {
        let store = SqliteStore::open(dir.path()).unwrap();
        let rows = v8_rows(t, 0);
        store
            .apply(ProjectionWrite {
                rows,
                ..Default::default()
            })
            .await
            .unwrap();
        (v8_reads(&store, t).await, price_blocks(&db))
    };
    assert_eq!(blocks.len(), 5, "tok-a's 1m rows fill two windows");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(TO_V9_BLOCKS).unwrap();
    conn.execute_batch(TO_V8_PRICE_BLOCKS).unwrap();
    drop(conn);
    for round in 0..2 {
        let store = SqliteStore::open(dir.path()).unwrap();
        assert_eq!(v8_reads(&store, t).await, reads, "round {round}");
        assert_eq!(price_blocks(&db), blocks, "round {round}");
        drop(store);
        let conn = assert_migrated(&db, "v8_price_bucket_blocks");
        let key = names(
            &conn,
            "SELECT name FROM pragma_table_info('price_bucket_blocks_past') WHERE pk > 0 ORDER BY pk",
        );
        assert_eq!(key, ["res", "block", "sid"]);
        let by_series = names(
            &conn,
            "SELECT name FROM pragma_index_info('price_bucket_blocks_by_series') ORDER BY seqno",
        );
        assert_eq!(by_series, ["sid", "res", "block"]);
    }
    // Every row again, a step later: each migrated block is rewritten.
    let store = SqliteStore::open(dir.path()).unwrap();
    store
        .apply(ProjectionWrite {
            rows: v8_rows(t, 1),
            ..Default::default()
        })
        .await
        .unwrap();
    let after = v8_reads(&store, t).await;
    assert_ne!(after, reads);
    drop(store);
    let fresh = tempfile::tempdir().unwrap();
    let written = SqliteStore::open(fresh.path()).unwrap();
    for step in [0, 1] {
        written
            .apply(ProjectionWrite {
                rows: v8_rows(t, step),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    assert_eq!(v8_reads(&written, t).await, after);
    assert_eq!(
        price_blocks(&db),
        price_blocks(&fresh.path().join("store.db"))
    );
}

/// Every price tick block of the store at `db`, in series order.
fn tick_blocks(db: &std::path::Path) -> Vec<(i64, i64, i64, i64, Vec<u8>)> {
    rusqlite::Connection::open(db)
        .unwrap()
        .prepare("SELECT sid, ts, log_offset, n, v FROM price_tick_blocks ORDER BY 1, 2, 3")
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// What the tick reads of the version 9 test answer: each token's ticks
/// and their count from three points (before the first, inside a block
/// behind the head, inside the head's).
async fn v9_tick_reads(store: &SqliteStore, t: i64) -> Vec<String> {
    use hindsight_contracts::{TickKey, TickKind, TickRange};
    let mut out = Vec::new();
    for id in ["tok-a", "tok-b"] {
        for from in [t - 1, t + 70 * 60_000, t + 199 * 60_000] {
            let range = TickRange {
                from: TickKey {
                    ts: Timestamp(from),
                    partition: 0,
                    offset: 0,
                },
                end: Timestamp(t + 300 * 60_000),
                limit: 1_000,
            };
            let end = range.end;
            let ticks = store.ticks(TickKind::Price, id, range).await.unwrap();
            out.push(format!("{id} from {from}: {ticks:?}"));
            let n = store
                .count_ticks(TickKind::Price, id, Timestamp(from), end)
                .await
                .unwrap();
            out.push(format!("{id} from {from}: {n} ticks"));
        }
    }
    out
}

/// 200 price ticks of `tok-a` a minute apart (several tick blocks, several
/// 1m windows), and one of `tok-b`.
fn v9_ticks(t: i64) -> Vec<hindsight_contracts::Tick> {
    use hindsight_contracts::{Tick, TickKey, TickValue};
    (0..201)
        .map(|i| Tick {
            token_id: if i < 200 { "tok-a" } else { "tok-b" }.into(),
            key: TickKey {
                ts: Timestamp(t + (i % 200) * 60_000),
                partition: 0,
                offset: i as u64,
            },
            value: TickValue::Price {
                p: 0.5 + (i % 7) as f64 / 100.0,
            },
        })
        .collect()
}

/// A store of version 9 opens under version 10 with each token's newest
/// price block at each resolution and its newest tick block in its head,
/// moved out of the full tables: the same blocks, byte for byte, through
/// the views; every bucket and tick read answers as before; a later write
/// lands as on a store written by this version; opening again changes
/// nothing.
#[tokio::test]
async fn a_version_9_store_keeps_its_newest_blocks_in_heads() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let t = 1_756_684_800_000;
    let write = |step: u64| ProjectionWrite {
        rows: v8_rows(t, step),
        ticks: if step == 0 { v9_ticks(t) } else { Vec::new() },
        ..Default::default()
    };
    let (reads, ticks, blocks) = {
        let store = SqliteStore::open(dir.path()).unwrap();
        store.apply(write(0)).await.unwrap();
        let reads = (v8_reads(&store, t).await, v9_tick_reads(&store, t).await);
        assert!(reads.1.iter().any(|r| r.contains("200 ticks")), "{reads:?}");
        (reads, tick_blocks(&db), price_blocks(&db))
    };
    assert_eq!(blocks.len(), 5, "tok-a's 1m rows fill two windows");
    assert!(
        ticks.len() >= 4,
        "tok-a's ticks fill several blocks: {ticks:?}"
    );
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(TO_V9_BLOCKS)
        .unwrap();
    for round in 0..2 {
        let store = SqliteStore::open(dir.path()).unwrap();
        assert_eq!(v8_reads(&store, t).await, reads.0, "round {round}");
        assert_eq!(v9_tick_reads(&store, t).await, reads.1, "round {round}");
        assert_eq!(price_blocks(&db), blocks, "round {round}");
        assert_eq!(tick_blocks(&db), ticks, "round {round}");
        drop(store);
        let conn = assert_migrated(&db, "v9_buckets");
        // Four series have price blocks at some resolution (tok-a at 1m
        // and 1d, tok-b at 1m and 1h): each newest one is in a head, and
        // the one block behind (tok-a's first 1m window) in the full table.
        let (heads, past, past_ticks): (i64, i64, i64) = conn
            .query_row(
                "SELECT (SELECT count(*) FROM price_heads),
                        (SELECT count(*) FROM price_bucket_blocks_past),
                        (SELECT count(*) FROM price_tick_blocks_past)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((heads, past, past_ticks), (2, 1, ticks.len() as i64 - 2));
    }
    // Every row again, a step later: the heads and the block behind them
    // are rewritten as a store of this version's would be.
    let store = SqliteStore::open(dir.path()).unwrap();
    store.apply(write(1)).await.unwrap();
    let after = v8_reads(&store, t).await;
    assert_ne!(after, reads.0);
    drop(store);
    let fresh = tempfile::tempdir().unwrap();
    let written = SqliteStore::open(fresh.path()).unwrap();
    for step in [0, 1] {
        written.apply(write(step)).await.unwrap();
    }
    assert_eq!(v8_reads(&written, t).await, after);
    assert_eq!(
        price_blocks(&db),
        price_blocks(&fresh.path().join("store.db"))
    );
}

/// `PRAGMA page_size` of the file at `db`.
fn page_size(db: &std::path::Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap()
}

/// A store file created before 16 KiB pages (with SQLite's 4 KiB) keeps
/// its pages and takes the same writes as a new file, which has 16 KiB
/// pages: every bucket and tick read answers alike, and both hold the same
/// blocks, byte for byte.
#[tokio::test]
async fn a_store_with_4_kib_pages_keeps_them_and_reads_as_a_new_one() {
    let (old, db) = old_store("PRAGMA page_size = 4096; PRAGMA journal_mode = WAL;");
    assert_eq!(page_size(&db), 4096);
    let fresh = tempfile::tempdir().unwrap();
    let t = 1_756_684_800_000;
    let mut reads = Vec::new();
    for dir in [old.path(), fresh.path()] {
        let store = SqliteStore::open(dir).unwrap();
        for step in [0, 1] {
            store
                .apply(ProjectionWrite {
                    rows: v8_rows(t, step),
                    ticks: if step == 0 { v9_ticks(t) } else { Vec::new() },
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        reads.push((v8_reads(&store, t).await, v9_tick_reads(&store, t).await));
    }
    let new = fresh.path().join("store.db");
    assert_eq!((page_size(&db), page_size(&new)), (4096, 16_384));
    assert_eq!(reads[0], reads[1]);
    assert!(reads[0].1.iter().any(|r| r.contains("200 ticks")));
    assert_eq!(price_blocks(&db), price_blocks(&new));
    assert_eq!(tick_blocks(&db), tick_blocks(&new));
}
