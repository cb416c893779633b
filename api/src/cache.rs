//! The API's caches of what the store answered, kept while the store's
//! stamp says nothing was written since (docs/DESIGN.md, "Caching
//! history"): encoded history pages, the API keys requests present, and
//! where the tokens whose history they ask for belong.
//!
//! Why it is safe: what is kept is a function of its key and the store's
//! contents — a page of its request (route, the id in the path,
//! `start_ts`, `end_ts`, `resolution`, `limit`, `cursor`) and the cursor
//! secret, except with `fill=previous`, which also depends on the clock, so
//! those pages are never kept; a key record of its hash; a token's market
//! and label of its id. The stamp
//! ([`ReadStore::version`](hindsight_contracts::ReadStore::version),
//! [`AuthStore::version`](hindsight_contracts::AuthStore::version)) is read
//! *before* the reads it vouches for, so an answer holding a write that
//! raced them is kept under the older stamp and is never served again: the
//! next request reads the new stamp and misses. A revoked key is therefore
//! refused from the first request after the revocation committed, in every
//! API process. The plan check, the rate limit and the usage count run on
//! every request; only the store's reads (and a page's encoding) are
//! skipped.
//!
//! Why it is coarse: one stamp for the whole store, so any committed write
//! (a projector step, a catalog record, a key) empties a cache. While ticks
//! stream in, a page lives until the next projector commit; on a quiet
//! store (a backfilled history, a closed market) it lives until the budget
//! is full. A backend that cannot stamp cheaply (CQL) answers `None`, and
//! nothing is kept.

use crate::page::Sealed;
use hindsight_contracts::{ApiKeyRecord, TokenRef};
use hindsight_telemetry as tm;
use metrics::{Counter, Gauge};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

/// Default page budget: 64 MiB, some 8 000 pages of 200 points.
pub const DEFAULT_PAGE_BYTES: usize = 64 << 20;
/// Key budget: 4 MiB, some 20 000 keys.
pub const KEY_BYTES: usize = 4 << 20;
/// Token budget: 4 MiB, some 15 000 tokens with ids as long as
/// Polymarket's.
pub const TOKEN_BYTES: usize = 4 << 20;

/// Bytes a kept value costs the budget, near enough.
pub trait Weigh {
    fn weight(&self) -> usize;
}

impl Weigh for Sealed {
    fn weight(&self) -> usize {
        self.len()
    }
}

impl Weigh for TokenRef {
    fn weight(&self) -> usize {
        std::mem::size_of::<TokenRef>()
            + self.token_id.len()
            + self.market_id.len()
            + self.label.len()
    }
}

impl Weigh for ApiKeyRecord {
    fn weight(&self) -> usize {
        std::mem::size_of::<ApiKeyRecord>()
            + self.key_id.len()
            + self.organization.len()
            + self.plan.len()
    }
}

/// Values by key, all read under one store stamp.
pub struct Cache<V> {
    budget: usize,
    events: CacheEvents,
    inner: Mutex<Inner<V>>,
}

/// A cache's metrics, labelled `cache` by its name (`pages`, `keys`,
/// `tokens`):
/// lookups by result and the bytes kept. The handles are taken once, when
/// the cache is built, so a lookup records its count with one atomic add,
/// outside the cache's lock, instead of finding the labelled series each
/// time (1.5 % of a cached page's CPU, under the lock, when it did). The
/// process installs its recorder before it builds the API's state (opening
/// a store does); handles taken before that record nowhere.
struct CacheEvents {
    hits: Counter,
    misses: Counter,
    bytes: Gauge,
}

impl CacheEvents {
    fn register(name: &'static str) -> Self {
        CacheEvents {
            hits: metrics::counter!(tm::API_CACHE, "cache" => name, "result" => "hit"),
            misses: metrics::counter!(tm::API_CACHE, "cache" => name, "result" => "miss"),
            bytes: metrics::gauge!(tm::API_CACHE_BYTES, "cache" => name),
        }
    }
}

struct Inner<V> {
    /// The stamp every kept value was read under.
    stamp: u64,
    values: HashMap<Vec<u8>, V>,
    bytes: usize,
}

impl<V: Clone + Weigh> Cache<V> {
    /// A cache of at most `budget` bytes; 0 keeps nothing.
    pub fn new(name: &'static str, budget: usize) -> Self {
        Cache {
            budget,
            events: CacheEvents::register(name),
            inner: Mutex::new(Inner {
                stamp: 0,
                values: HashMap::new(),
                bytes: 0,
            }),
        }
    }

    /// The value for `key`: kept from an earlier request if the store's
    /// stamp (`stamp()`, read before `build`'s reads) is still the one it
    /// was read under, else `build`'s (kept for the next). With no key (a
    /// page that must always be built), no budget or no stamp, `build`'s,
    /// kept for none; the stamp is read only when it can be used.
    pub async fn serve<E>(
        &self,
        stamp: impl FnOnce() -> Option<u64>,
        key: Option<Vec<u8>>,
        build: impl Future<Output = Result<V, E>>,
    ) -> Result<V, E> {
        let stamped = key
            .filter(|_| self.budget > 0)
            .and_then(|key| Some((stamp()?, key)));
        let Some((stamp, key)) = stamped else {
            return build.await;
        };
        if let Some(value) = self.get(&key, stamp) {
            return Ok(value);
        }
        let value = build.await?;
        self.put(key, stamp, &value);
        Ok(value)
    }

    /// The value for `key` if there is one: kept from an earlier request
    /// while the stamp (`stamp()`, read before `read`'s reads) stands, else
    /// `read`'s, kept only when it found one, so that keys made up by the
    /// thousand cannot push the known ones out. With no budget or no stamp,
    /// `read`'s, kept for none. `read` is called only on a miss (a store's
    /// read allocates its future when called).
    pub async fn known<E, R>(
        &self,
        stamp: impl FnOnce() -> Option<u64>,
        key: &[u8],
        read: impl FnOnce() -> R,
    ) -> Result<Option<V>, E>
    where
        R: Future<Output = Result<Option<V>, E>>,
    {
        let stamp = if self.budget > 0 { stamp() } else { None };
        let Some(stamp) = stamp else {
            return read().await;
        };
        if let Some(value) = self.get(key, stamp) {
            return Ok(Some(value));
        }
        let value = read().await?;
        if let Some(value) = &value {
            self.put(key.to_vec(), stamp, value);
        }
        Ok(value)
    }

    /// The value kept for `key` under `stamp`, counted as a hit or a miss.
    pub fn get(&self, key: &[u8], stamp: u64) -> Option<V> {
        let found = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if stamp > inner.stamp {
                // The store changed: nothing kept can be served again.
                self.clear(&mut inner, stamp);
            }
            // An older stamp: a request that read it before the last
            // write and got here after a newer one. It builds its own
            // answer, which `put` does not keep, and leaves what was kept
            // under the newer stamp: emptied for it, the cache went back to
            // a stamp no later request reads, and the next one emptied it
            // again.
            (inner.stamp == stamp)
                .then(|| inner.values.get(key).cloned())
                .flatten()
        };
        match found {
            Some(_) => self.events.hits.increment(1),
            None => self.events.misses.increment(1),
        }
        found
    }

    /// Keeps `value` if the stamp is still the one it was read under. Over
    /// the budget the cache is emptied first: simpler than an LRU, and a
    /// store write empties it anyway; a value worth keeping comes back with
    /// its next request.
    pub fn put(&self, key: Vec<u8>, stamp: u64, value: &V) {
        let size = value.weight() + key.len();
        if size > self.budget / 8 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.stamp != stamp {
            return;
        }
        if inner.bytes + size > self.budget {
            self.clear(&mut inner, stamp);
        }
        let key_len = key.len();
        if let Some(old) = inner.values.insert(key, value.clone()) {
            inner.bytes -= old.weight() + key_len;
        }
        inner.bytes += size;
        self.events.bytes.set(inner.bytes as f64);
    }

    fn clear(&self, inner: &mut Inner<V>, stamp: u64) {
        inner.stamp = stamp;
        inner.values.clear();
        inner.bytes = 0;
        self.events.bytes.set(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::Page;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// A store's stamp, as the test sets it (0: none).
    struct Stamped(AtomicU64);

    impl Stamped {
        fn version(&self) -> Option<u64> {
            match self.0.load(Ordering::SeqCst) {
                0 => None,
                v => Some(v),
            }
        }
    }

    /// Serves `key` through `cache`, counting builds in `built`; the body
    /// names the build that made it.
    async fn serve(
        cache: &Cache<Sealed>,
        store: &Stamped,
        key: Option<&str>,
        built: &AtomicUsize,
    ) -> Vec<u8> {
        let page = cache
            .serve(
                || store.version(),
                key.map(|k| k.as_bytes().to_vec()),
                async {
                    let n = built.fetch_add(1, Ordering::SeqCst);
                    let body = format!("{{\"build\":{n}}}").into_bytes();
                    Ok::<_, ()>(Page::from_body(body, true).seal())
                },
            )
            .await
            .unwrap();
        page.body().to_vec()
    }

    /// A cache of the default budget, a store at `stamp` and no build yet.
    fn fixture(stamp: u64) -> (Cache<Sealed>, Stamped, AtomicUsize) {
        (
            Cache::new("pages", DEFAULT_PAGE_BYTES),
            Stamped(AtomicU64::new(stamp)),
            AtomicUsize::new(0),
        )
    }

    #[tokio::test]
    async fn a_page_is_built_once_per_request_and_stamp() {
        let (cache, store, built) = fixture(0);
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
        let (cache, store, built) = fixture(1);
        // The build reads stamp 1; a write lands while it reads.
        cache
            .serve(|| store.version(), Some(b"a".to_vec()), async {
                store.0.store(2, Ordering::SeqCst);
                built.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ()>(Page::from_body(b"{}".to_vec(), false).seal())
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
        let cache = Cache::new("pages", 100);
        for key in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
            serve(&cache, &store, Some(key), &built).await;
        }
        let bytes = cache.inner.lock().unwrap().bytes;
        assert!(bytes <= 100, "{bytes} bytes kept");
        // The last one is kept.
        serve(&cache, &store, Some("j"), &built).await;
        assert_eq!(built.load(Ordering::SeqCst), 10);
        // A page over an eighth of the budget is never kept.
        let big = Cache::new("pages", 64);
        serve(&big, &store, Some("a"), &built).await;
        serve(&big, &store, Some("a"), &built).await;
        assert_eq!(built.load(Ordering::SeqCst), 12);
    }

    /// A request that read its stamp before the last write and asks after
    /// a newer one: it is built and not kept, and what was kept under the
    /// newer stamp stays.
    #[tokio::test]
    async fn a_late_request_under_an_older_stamp_leaves_the_newer_pages() {
        let (cache, store, built) = fixture(2);
        let kept = serve(&cache, &store, Some("a"), &built).await;
        store.0.store(1, Ordering::SeqCst);
        assert_ne!(serve(&cache, &store, Some("a"), &built).await, kept);
        assert_ne!(serve(&cache, &store, Some("a"), &built).await, kept);
        assert_eq!(built.load(Ordering::SeqCst), 3, "never served nor kept");
        store.0.store(2, Ordering::SeqCst);
        assert_eq!(serve(&cache, &store, Some("a"), &built).await, kept);
        assert_eq!(built.load(Ordering::SeqCst), 3, "the newer page stayed");
    }

    /// `known`: a found value is kept while the stamp stands; what was not
    /// found is read every time (made-up keys keep nothing); a new stamp
    /// reads again.
    #[tokio::test]
    async fn only_what_was_found_is_known() {
        let (cache, store, reads) = (
            Cache::new("tokens", TOKEN_BYTES),
            Stamped(AtomicU64::new(1)),
            AtomicUsize::new(0),
        );
        let token = |id: &str| TokenRef {
            token_id: id.into(),
            market_id: "m".into(),
            label: "Yes".into(),
        };
        let lookup = |id: &'static str| {
            let reads = &reads;
            cache.known(
                || store.version(),
                id.as_bytes(),
                move || async move {
                    reads.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, ()>((id != "unknown").then(|| token(id)))
                },
            )
        };
        for _ in 0..3 {
            assert_eq!(lookup("t1").await, Ok(Some(token("t1"))));
            assert_eq!(lookup("unknown").await, Ok(None));
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1 + 3, "t1 read once");
        store.0.store(2, Ordering::SeqCst);
        assert_eq!(lookup("t1").await, Ok(Some(token("t1"))));
        assert_eq!(reads.load(Ordering::SeqCst), 5, "read again after a write");
        store.0.store(0, Ordering::SeqCst);
        lookup("t1").await.unwrap();
        lookup("t1").await.unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 7, "no stamp: always read");
    }
}
