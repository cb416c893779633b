//! What the projector's integration tests share: price ticks to append, every
//! row a log can touch, and a snapshot of the read tables to compare
//! projections by.

// Each test crate includes this module and uses part of it.
#![allow(dead_code)]

use hindsight_contracts::{Position, ProjectionStore, ReadStore, Row, RowKey, Table};
use hindsight_schemas::{Event, MarketRecord, PriceTick, Resolution, Timestamp};
use hindsight_sqlite::SqliteStore;
use std::collections::BTreeSet;

/// Price ticks number `from` to `from + n - 1` of market `m`: one a second
/// from 2025-09-01, tick `i` on token `t{i % tokens}`.
pub fn ticks(from: i64, n: i64, tokens: i64) -> Vec<Event> {
    (from..from + n)
        .map(|i| {
            Event::Price(PriceTick {
                market_id: "m".into(),
                token_id: format!("t{}", i % tokens),
                ts: Timestamp(1_756_684_800_000 + i * 1_000),
                p: 0.5,
            })
        })
        .collect()
}

/// The bucket row an event feeds at `res`, if it feeds one.
pub fn row_key(event: &Event, res: Resolution) -> Option<RowKey> {
    let (table, id, ts) = match event {
        Event::Price(p) => (Table::Prices, &p.token_id, p.ts),
        Event::Book(b) => (Table::Books, &b.token_id, b.ts),
        Event::Metrics(m) => (Table::Metrics, &m.market_id, m.ts),
        _ => return None,
    };
    Some(RowKey {
        table,
        id: id.as_str().into(),
        res,
        bucket: res.bucket_start(ts),
    })
}

/// Every row any event can touch.
pub fn all_keys(events: &[Event]) -> Vec<RowKey> {
    let keys: BTreeSet<RowKey> = events
        .iter()
        .flat_map(|e| {
            Resolution::ALL
                .into_iter()
                .filter_map(|res| row_key(e, res))
        })
        .collect();
    keys.into_iter().collect()
}

/// Everything the read tables hold for `events`.
#[derive(Debug, PartialEq)]
pub struct Tables {
    pub rows: Vec<Row>,
    pub committed: Vec<Position>,
    pub catalog: Vec<String>,
    pub markets: Vec<Option<MarketRecord>>,
}

pub async fn tables(store: &SqliteStore, events: &[Event]) -> Tables {
    let mut rows = store.load(all_keys(events)).await.unwrap();
    rows.sort_by(|a, b| a.key.cmp(&b.key));
    let (changes, _) = store.catalog_changes(None).await.unwrap();
    let mut catalog: Vec<String> = changes.iter().map(|e| format!("{e:?}")).collect();
    catalog.sort();
    let ids: BTreeSet<&str> = events.iter().map(Event::key).collect();
    let mut markets = Vec::new();
    for id in ids {
        markets.push(store.market(id).await.unwrap());
    }
    Tables {
        rows,
        committed: store.committed().await.unwrap(),
        catalog,
        markets,
    }
}

/// What a test does around the store's calls it watches; every other call
/// goes straight through ([`Hooked`]).
#[async_trait::async_trait]
pub trait Hooks: Send + Sync + 'static {
    /// The write, given to `inner` when the test lets it through.
    async fn apply(
        &self,
        inner: &SqliteStore,
        write: hindsight_contracts::ProjectionWrite,
    ) -> hindsight_contracts::Result<hindsight_contracts::Applied> {
        inner.apply(write).await
    }

    /// Told the tokens the projector looks up, before they are.
    fn looking_up(&self, _token_ids: &[String]) {}
}

/// The embedded store, with a test's [`Hooks`] around its writes and token
/// lookups: one forwarding wrapper for every test that watches the
/// projector's calls.
pub struct Hooked<H> {
    pub inner: std::sync::Arc<SqliteStore>,
    pub hooks: H,
}

#[async_trait::async_trait]
impl<H: Hooks> ProjectionStore for Hooked<H> {
    async fn committed(&self) -> hindsight_contracts::Result<Vec<Position>> {
        self.inner.committed().await
    }
    async fn load(&self, keys: Vec<RowKey>) -> hindsight_contracts::Result<Vec<Row>> {
        self.inner.load(keys).await
    }
    async fn frontiers(
        &self,
        series: Vec<hindsight_contracts::Series>,
    ) -> hindsight_contracts::Result<Vec<hindsight_contracts::Frontiers>> {
        self.inner.frontiers(series).await
    }
    async fn lookup_tokens(
        &self,
        token_ids: Vec<String>,
    ) -> hindsight_contracts::Result<Vec<hindsight_contracts::TokenRef>> {
        self.hooks.looking_up(&token_ids);
        self.inner.lookup_tokens(token_ids).await
    }
    async fn apply(
        &self,
        write: hindsight_contracts::ProjectionWrite,
    ) -> hindsight_contracts::Result<hindsight_contracts::Applied> {
        self.hooks.apply(&self.inner, write).await
    }
    async fn reset(&self) -> hindsight_contracts::Result<()> {
        self.inner.reset().await
    }
}
