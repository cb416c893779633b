//! The page cache: history pages kept encoded, with their `ETag`, and
//! served again for the same request while the read store says nothing
//! was written since (docs/DESIGN.md, "Caching history").
//!
//! Why it is safe: a page is a function of the request (route, the id in
//! the path, `start_ts`, `end_ts`, `resolution`, `limit`, `cursor`), the
//! store's contents and the cursor secret — except with `fill=previous`,
//! which also depends on the clock, so those pages are never kept. The
//! store's stamp ([`ReadStore::version`]) is read *before* the page's
//! reads, so a page holding a write that raced them is kept under the
//! older stamp and is never served again: the next request reads the new
//! stamp and misses. The plan check, the rate limit and the usage count
//! run on every request before the cache is asked; only the reads and the
//! encoding are skipped.
//!
//! Why it is coarse: one stamp for the whole store, so any committed write
//! (a projector step, a catalog record, a key) empties it. While ticks
//! stream in, a page lives until the next projector commit; on a quiet
//! store (a backfilled history, a closed market) it lives until it is
//! evicted. A backend that cannot stamp cheaply (CQL) answers `None`, and
//! every page is built.

use crate::error::ApiError;
use crate::page::{Page, Sealed};
use hindsight_contracts::ReadStore;
use hindsight_telemetry as tm;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

/// Default budget: 64 MiB, some 8 000 pages of 200 points.
pub const DEFAULT_BYTES: usize = 64 << 20;

/// Encoded pages by request, all built under one store stamp.
pub struct PageCache {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The stamp every kept page was built under.
    stamp: u64,
    pages: HashMap<String, Sealed>,
    bytes: usize,
}

impl PageCache {
    /// A cache of at most `budget` bytes of page bodies; 0 keeps nothing.
    pub fn new(budget: usize) -> Self {
        PageCache {
            budget,
            inner: Mutex::default(),
        }
    }

    /// The page for `key`: kept from an earlier request if the store's
    /// stamp is still the one it was built under, else `build`'s (kept for
    /// the next). `key` is `None` for a page that must always be built.
    pub async fn serve(
        &self,
        store: &dyn ReadStore,
        key: Option<String>,
        build: impl Future<Output = Result<Page, ApiError>>,
    ) -> Result<Sealed, ApiError> {
        let stamped = match key {
            Some(key) if self.budget > 0 => store.version().map(|stamp| (key, stamp)),
            _ => None,
        };
        let Some((key, stamp)) = stamped else {
            return Ok(build.await?.seal());
        };
        if let Some(page) = self.get(&key, stamp) {
            metrics::counter!(tm::API_PAGE_CACHE, "result" => "hit").increment(1);
            return Ok(page);
        }
        metrics::counter!(tm::API_PAGE_CACHE, "result" => "miss").increment(1);
        let page = build.await?.seal();
        self.put(key, stamp, &page);
        Ok(page)
    }

    fn get(&self, key: &str, stamp: u64) -> Option<Sealed> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.stamp != stamp {
            // The store changed: nothing kept can be served again.
            inner.clear(stamp);
            return None;
        }
        inner.pages.get(key).cloned()
    }

    /// Keeps `page` if the stamp is still the one it was built under. Over
    /// the budget the cache is emptied first: simpler than an LRU, and a
    /// store write empties it anyway; a page worth keeping comes back with
    /// its next request.
    fn put(&self, key: String, stamp: u64, page: &Sealed) {
        let size = page.len() + key.len();
        if size > self.budget / 8 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.stamp != stamp {
            return;
        }
        if inner.bytes + size > self.budget {
            inner.clear(stamp);
        }
        let key_len = key.len();
        if let Some(old) = inner.pages.insert(key, page.clone()) {
            inner.bytes -= old.len() + key_len;
        }
        inner.bytes += size;
        metrics::gauge!(tm::API_PAGE_CACHE_BYTES).set(inner.bytes as f64);
    }
}

impl Inner {
    fn clear(&mut self, stamp: u64) {
        self.stamp = stamp;
        self.pages.clear();
        self.bytes = 0;
        metrics::gauge!(tm::API_PAGE_CACHE_BYTES).set(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use hindsight_contracts::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// A store whose stamp the test sets; its reads are never made.
    #[derive(Default)]
    struct Stamped(AtomicU64);

    #[async_trait]
    impl ReadStore for Stamped {
        fn version(&self) -> Option<u64> {
            match self.0.load(Ordering::SeqCst) {
                0 => None,
                v => Some(v),
            }
        }
        async fn prices(&self, _: &str, _: Range) -> Result<Vec<PricePoint>> {
            unreachable!()
        }
        async fn candles(&self, _: &str, _: Range) -> Result<Vec<CandlePoint>> {
            unreachable!()
        }
        async fn metrics(&self, _: &str, _: Range) -> Result<Vec<MetricsPoint>> {
            unreachable!()
        }
        async fn books(&self, _: &str, _: Range) -> Result<Vec<BookPoint>> {
            unreachable!()
        }
        async fn count(&self, _: Table, _: &str, _: Range) -> Result<u64> {
            unreachable!()
        }
        async fn count_ticks(
            &self,
            _: TickKind,
            _: &str,
            _: hindsight_schemas::Timestamp,
            _: hindsight_schemas::Timestamp,
        ) -> Result<u64> {
            unreachable!()
        }
        async fn ticks(&self, _: TickKind, _: &str, _: TickRange) -> Result<Vec<Tick>> {
            unreachable!()
        }
        async fn book_at(
            &self,
            _: &str,
            _: hindsight_schemas::Timestamp,
            _: hindsight_schemas::Timestamp,
        ) -> Result<Option<Tick>> {
            unreachable!()
        }
        async fn token(&self, _: &str) -> Result<Option<TokenRef>> {
            unreachable!()
        }
        async fn market(&self, _: &str) -> Result<Option<hindsight_schemas::MarketRecord>> {
            unreachable!()
        }
        async fn catalog_changes(
            &self,
            _: Option<&CatalogCursor>,
        ) -> Result<(Vec<hindsight_schemas::Event>, CatalogCursor)> {
            unreachable!()
        }
    }

    /// Serves `key` through `cache`, counting builds in `built`; the body
    /// names the build that made it.
    async fn serve(
        cache: &PageCache,
        store: &Stamped,
        key: Option<&str>,
        built: &AtomicUsize,
    ) -> Vec<u8> {
        let page = cache
            .serve(store, key.map(str::to_string), async {
                let n = built.fetch_add(1, Ordering::SeqCst);
                Ok(Page::from_body(
                    format!("{{\"build\":{n}}}").into_bytes(),
                    true,
                ))
            })
            .await
            .unwrap();
        page.body().to_vec()
    }

    #[tokio::test]
    async fn a_page_is_built_once_per_request_and_stamp() {
        let (cache, store, built) = (
            PageCache::new(DEFAULT_BYTES),
            Stamped::default(),
            AtomicUsize::new(0),
        );
        store.0.store(7, Ordering::SeqCst);
        let first = serve(&cache, &store, Some("a"), &built).await;
        assert_eq!(serve(&cache, &store, Some("a"), &built).await, first);
        assert_eq!(built.load(Ordering::SeqCst), 1, "the second was kept");
        serve(&cache, &store, Some("b"), &built).await;
        assert_eq!(built.load(Ordering::SeqCst), 2, "another request is built");
        // A write: the stamp moves and nothing kept is served.
        store.0.store(8, Ordering::SeqCst);
        assert_ne!(serve(&cache, &store, Some("a"), &built).await, first);
        assert_eq!(built.load(Ordering::SeqCst), 3);
        // No key (fill=previous), or no stamp (CQL): always built.
        serve(&cache, &store, None, &built).await;
        serve(&cache, &store, None, &built).await;
        store.0.store(0, Ordering::SeqCst);
        serve(&cache, &store, Some("a"), &built).await;
        serve(&cache, &store, Some("a"), &built).await;
        assert_eq!(built.load(Ordering::SeqCst), 7);
    }

    #[tokio::test]
    async fn a_page_built_across_a_write_is_not_kept() {
        let (cache, store, built) = (
            PageCache::new(DEFAULT_BYTES),
            Stamped(AtomicU64::new(1)),
            AtomicUsize::new(0),
        );
        // The build reads stamp 1; a write lands while it reads.
        cache
            .serve(&store, Some("a".into()), async {
                store.0.store(2, Ordering::SeqCst);
                built.fetch_add(1, Ordering::SeqCst);
                Ok(Page::from_body(b"{}".to_vec(), false))
            })
            .await
            .unwrap();
        // A request under stamp 2 finds nothing, and builds.
        serve(&cache, &store, Some("a"), &built).await;
        assert_eq!(built.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn over_the_budget_it_starts_again_and_keeps_nothing_too_large() {
        let (store, built) = (Stamped(AtomicU64::new(1)), AtomicUsize::new(0));
        let cache = PageCache::new(100);
        for key in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
            serve(&cache, &store, Some(key), &built).await;
        }
        let bytes = cache.inner.lock().unwrap().bytes;
        assert!(bytes <= 100, "{bytes} bytes kept");
        // The last one is kept.
        serve(&cache, &store, Some("j"), &built).await;
        assert_eq!(built.load(Ordering::SeqCst), 10);
        // A page over an eighth of the budget is never kept.
        let big = PageCache::new(64);
        serve(&big, &store, Some("a"), &built).await;
        serve(&big, &store, Some("a"), &built).await;
        assert_eq!(built.load(Ordering::SeqCst), 12);
    }
}
