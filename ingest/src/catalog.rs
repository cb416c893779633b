//! The catalog as ingest checks lines against it (`hindsight_schemas::claims`):
//! which market each token is listed under and which market has each slug.
//!
//! [`CatalogView`] keeps those two maps in memory, loaded from the read
//! store and refreshed from its change feed ([`ReadStore::catalog_changes`])
//! once older than [`IngestLimits::catalog_max_age`](crate::http::IngestLimits)
//! by the first batch that finds it so, so the hot path is a hash lookup per
//! line and no store read. A store that is slow or cannot be read leaves the
//! view as it was (logged): ingest keeps acknowledging, and the projector
//! applies the same rule to whatever the view missed.
//!
//! [`BatchClaims`] adds what the lines before in the same batch (or the
//! same backfill) claimed, which the store does not hold yet.

use hindsight_contracts::{CatalogCursor, ReadStore};
use hindsight_schemas::claims::{self, Claims};
use hindsight_schemas::wire::Reject;
use hindsight_schemas::{Event, MarketRecord, Timestamp};
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

/// The markets of the catalog, by what they hold.
///
/// Each id and slug is allocated once and shared by the maps that hold it:
/// with a copy per map, a view of 120 000 tokens with ids of Polymarket's
/// lengths held ~53 MB at the live benchmark's peak (`heaptrack`,
/// `HINDSIGHT_BENCH_LIVE_LONG_IDS=1`), shared ~31 MB.
#[derive(Debug, Default)]
pub struct Index {
    /// Market id → the version applied last.
    markets: HashMap<Arc<str>, Listing>,
    tokens: HashMap<Arc<str>, Arc<str>>,
    slugs: HashMap<Arc<str>, Arc<str>>,
}

/// What the version of a market applied last lists.
#[derive(Debug)]
struct Listing {
    updated_at: Timestamp,
    slug: Arc<str>,
    tokens: Vec<Arc<str>>,
}

impl Index {
    /// Applies a market version read from the change feed, unless an
    /// applied one is newer (the feed may repeat and reorder versions; the
    /// greatest `updated_at` wins, the later on a tie).
    fn apply(&mut self, m: &MarketRecord) {
        let id: Arc<str> = match self.markets.get_key_value(m.id.as_str()) {
            Some((id, listed)) => {
                if m.updated_at < listed.updated_at {
                    return;
                }
                if self.slugs.get(&listed.slug) == Some(id) {
                    self.slugs.remove(&listed.slug);
                }
                for t in &listed.tokens {
                    if self.tokens.get(t) == Some(id) {
                        self.tokens.remove(t);
                    }
                }
                id.clone()
            }
            None => m.id.as_str().into(),
        };
        let slug: Arc<str> = m.slug.as_str().into();
        let tokens: Vec<Arc<str>> = m.tokens.iter().map(|t| t.id.as_str().into()).collect();
        self.slugs.insert(slug.clone(), id.clone());
        for t in &tokens {
            self.tokens.insert(t.clone(), id.clone());
        }
        let listed = Listing {
            updated_at: m.updated_at,
            slug,
            tokens,
        };
        self.markets.insert(id, listed);
    }
}

impl Claims for Index {
    fn token_market(&self, token_id: &str) -> Option<&str> {
        self.tokens.get(token_id).map(|m| &**m)
    }

    fn slug_market(&self, slug: &str) -> Option<&str> {
        self.slugs.get(slug).map(|m| &**m)
    }
}

/// The read store's catalog, cached for ingest's checks.
pub struct CatalogView {
    store: Arc<dyn ReadStore>,
    max_age: Duration,
    index: RwLock<Index>,
    /// Where the view stands in the store's change feed.
    cursor: Mutex<Option<CatalogCursor>>,
    /// When the view was last refreshed (or tried to be).
    fresh_at: Mutex<Option<Instant>>,
    /// A refresh is running.
    refreshing: AtomicBool,
}

/// How long a batch waits for a refresh of its view before it is checked
/// against the view as it is (the refresh goes on for the next batches): a
/// read store that is slow or down does not hold ingest up.
pub const REFRESH_WAIT: Duration = Duration::from_millis(200);

impl CatalogView {
    /// A view of `store`'s catalog, read again once older than `max_age`
    /// (zero: at every batch). Nothing is read until the first batch.
    pub fn new(store: Arc<dyn ReadStore>, max_age: Duration) -> Self {
        CatalogView {
            store,
            max_age,
            index: RwLock::new(Index::default()),
            cursor: Mutex::new(None),
            fresh_at: Mutex::new(None),
            refreshing: AtomicBool::new(false),
        }
    }

    fn is_fresh(&self) -> bool {
        !self.max_age.is_zero()
            && self
                .fresh_at
                .lock()
                .unwrap()
                .is_some_and(|at| at.elapsed() <= self.max_age)
    }

    /// Reads the store's changes since the last refresh when the view is
    /// older than its maximum age, waiting at most [`REFRESH_WAIT`] for
    /// them. A batch arriving while a refresh runs is checked against the
    /// view as it is.
    pub async fn refresh(self: &Arc<Self>) {
        if self.is_fresh() || self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let view = self.clone();
        let task = tokio::spawn(async move {
            view.read_changes().await;
            view.refreshing.store(false, Ordering::Release);
        });
        let _ = tokio::time::timeout(REFRESH_WAIT, task).await;
    }

    async fn read_changes(&self) {
        let started = Instant::now();
        let since = self.cursor.lock().unwrap().clone();
        match self.store.catalog_changes(since.as_ref()).await {
            Ok((changes, cursor)) => {
                let mut index = self.index.write().unwrap();
                for e in &changes {
                    if let Event::Market(m) = e {
                        index.apply(m);
                    }
                }
                *self.cursor.lock().unwrap() = Some(cursor);
            }
            Err(e) => {
                // At most once per maximum age: the next attempt waits for
                // the view to age again.
                tracing::warn!(error = %e, "ingest cannot refresh its catalog view; checking lines against the last one read");
            }
        }
        *self.fresh_at.lock().unwrap() = Some(started);
    }

    /// The view, for checking a batch (a short synchronous section: do not
    /// hold it across an `.await`).
    pub fn read(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap()
    }
}

/// What the accepted lines of one batch (or one backfill) claimed: the
/// tokens and slugs of their market records, checked on top of the view.
/// A claim stays until the batch ends, even if a later line of the same
/// batch drops it: moving a token from one market to another takes two
/// batches (the market dropping it first, and once that is projected, the
/// one taking it), because on Kafka nothing orders two markets' records.
#[derive(Debug, Default)]
pub struct BatchClaims {
    tokens: HashMap<String, String>,
    slugs: HashMap<String, String>,
}

/// The view with a batch's claims on top.
struct Layered<'a> {
    base: &'a dyn Claims,
    batch: &'a BatchClaims,
}

impl Claims for Layered<'_> {
    fn token_market(&self, token_id: &str) -> Option<&str> {
        match self.batch.tokens.is_empty() {
            true => None,
            false => self.batch.tokens.get(token_id).map(String::as_str),
        }
        .or_else(|| self.base.token_market(token_id))
    }

    fn slug_market(&self, slug: &str) -> Option<&str> {
        self.batch
            .slugs
            .get(slug)
            .map(String::as_str)
            .or_else(|| self.base.slug_market(slug))
    }
}

impl BatchClaims {
    /// Checks `event` against `base` and the batch's claims; an accepted
    /// market's tokens and slug become the batch's.
    pub fn check(&mut self, base: &dyn Claims, event: &Event) -> Result<(), Reject> {
        claims::check(&Layered { base, batch: self }, event)?;
        if let Event::Market(m) = event {
            for t in &m.tokens {
                self.tokens.insert(t.id.clone(), m.id.clone());
            }
            self.slugs.insert(m.slug.clone(), m.id.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_contracts::conformance::T0;
    use hindsight_schemas::wire::{parse_line, RejectKind};

    const NOW: Timestamp = Timestamp(1_760_000_000_000);

    /// Market `id` with `slug`, `tokens` and version `day` (days after 2025-09-01).
    fn market(id: &str, slug: &str, tokens: &[&str], day: i64) -> MarketRecord {
        let tokens: Vec<(&str, &str)> = tokens.iter().map(|t| (*t, *t)).collect();
        hindsight_contracts::conformance::store::market(
            id,
            slug,
            "q",
            T0 + day * 86_400_000,
            &tokens,
        )
    }

    #[test]
    fn a_newer_version_replaces_what_a_market_holds_and_an_older_one_changes_nothing() {
        let mut index = Index::default();
        index.apply(&market("a", "a-slug", &["t1", "t2"], 0));
        index.apply(&market("a", "a-slug2", &["t2"], 1));
        index.apply(&market("a", "a-slug", &["t1", "t2"], 0));
        assert_eq!(index.token_market("t1"), None);
        assert_eq!(index.token_market("t2"), Some("a"));
        assert_eq!(index.slug_market("a-slug"), None);
        assert_eq!(index.slug_market("a-slug2"), Some("a"));
        // A token another market took since is left to it.
        index.apply(&market("b", "b-slug", &["t1"], 1));
        index.apply(&market("a", "a-slug2", &["t4"], 2));
        assert_eq!(index.token_market("t1"), Some("b"));
    }

    /// A market's id is allocated once for every map that holds it: a
    /// view holds every token of the catalog.
    #[test]
    fn a_market_id_is_shared_by_its_tokens_and_slug() {
        let mut index = Index::default();
        index.apply(&market("a", "a-slug", &["t1", "t2"], 0));
        index.apply(&market("a", "a-slug2", &["t2", "t3"], 1));
        let (id, listed) = index.markets.get_key_value("a").unwrap();
        for t in ["t2", "t3"] {
            assert!(Arc::ptr_eq(&index.tokens[t], id), "{t}");
        }
        assert!(Arc::ptr_eq(&index.slugs["a-slug2"], id));
        let (slug_key, _) = index.slugs.get_key_value("a-slug2").unwrap();
        assert!(Arc::ptr_eq(slug_key, &listed.slug));
        let (t3, _) = index.tokens.get_key_value("t3").unwrap();
        assert!(Arc::ptr_eq(t3, &listed.tokens[1]));
    }

    #[test]
    fn a_batch_cannot_list_a_token_or_slug_twice_nor_tick_it_under_another_market() {
        let base = Index::default();
        let mut batch = BatchClaims::default();
        let a = Event::Market(Box::new(market("a", "s", &["t1"], 0)));
        assert_eq!(batch.check(&base, &a), Ok(()));
        let b = Event::Market(Box::new(market("b", "s2", &["t9", "t1"], 0)));
        let reject = batch.check(&base, &b).unwrap_err();
        assert_eq!(reject.kind(), RejectKind::TokenClaimed);
        let c = Event::Market(Box::new(market("c", "s", &["t3"], 0)));
        assert_eq!(
            batch.check(&base, &c).unwrap_err().kind(),
            RejectKind::SlugTaken
        );
        let tick = parse_line(
            r#"{"kind":"price","market_id":"b","token_id":"t1","ts":1756684830,"p":0.5}"#,
            NOW,
        )
        .unwrap();
        assert_eq!(
            batch.check(&base, &tick).unwrap_err().kind(),
            RejectKind::MarketMismatch
        );
        // The refused market claimed nothing: its other token is free.
        let d = Event::Market(Box::new(market("d", "s4", &["t9"], 0)));
        assert_eq!(batch.check(&base, &d), Ok(()));
    }
}
