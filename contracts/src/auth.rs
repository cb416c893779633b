//! API keys and the rate-limit log, shared by every API replica.

use crate::Result;
use async_trait::async_trait;
use hindsight_schemas::Timestamp;

/// A stored API key: only its hash is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRecord {
    /// Short public handle (`hs_ab12cd34`) used by `keys list/revoke`.
    pub key_id: String,
    pub hash: [u8; 32],
    pub organization: String,
    pub plan: String,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
}

/// The length of a rate window: a plan's requests per minute bound every
/// interval of this many milliseconds, wherever it starts.
pub const RATE_WINDOW_MS: i64 = 60_000;

/// How long a hit must stay readable: a hit at `at` is counted by hits up to
/// `at + RATE_WINDOW_MS` on the clock of whichever replica takes them, so a
/// backend keeps hits at least this long (one window, plus two minutes of
/// clock difference between replicas) and may forget them afterwards.
pub const RATE_HIT_RETENTION_MS: i64 = 3 * RATE_WINDOW_MS;

/// The hits that count against a request at `now`: those in
/// `(now - RATE_WINDOW_MS, now + RATE_WINDOW_MS)`, exclusive at both ends.
///
/// Hits later than `now` count too. With one clock they never exist; with
/// several replicas whose clocks differ they do, and counting them is what
/// makes the bound hold whatever order hits arrive in (see [`AuthStore`]).
pub fn counted_range(now: Timestamp) -> (Timestamp, Timestamp) {
    (
        Timestamp(now.0 - RATE_WINDOW_MS),
        Timestamp(now.0 + RATE_WINDOW_MS),
    )
}

/// What [`AuthStore::take_hit`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct RateHits {
    /// The hit was taken: the request may proceed.
    pub admitted: bool,
    /// The hits counted at `now` ([`counted_range`]), ascending, including
    /// this one when admitted and never when refused. (A hit refused in a
    /// race may report fewer than the limit: the window had room before
    /// the racers came.)
    pub hits: Vec<Timestamp>,
}

/// Keys, and the log of admitted requests behind rate limits.
///
/// Contract:
/// - `put_key` inserts or replaces the key with its `key_id`, visible to
///   `key_by_hash` and `list_keys` of every process at once (revocation and
///   plan changes take effect on the next request). A key's hash never
///   changes: a new secret is a new key with a new `key_id` (the CQL store
///   keys rows by hash).
/// - A stored hash that is not 32 bytes is `ErrorKind::Corrupt`, never a
///   key that matches nothing or everything.
/// - `take_hit(key, now, limit)` records a hit of `key` at `now` and admits
///   it only if fewer than `limit` hits are counted at `now`
///   ([`counted_range`]). Whatever the concurrency between processes sharing
///   the store, and whatever order their clocks put hits in, **no interval
///   of [`RATE_WINDOW_MS`] ever holds more than `limit` admitted hits** of a
///   key. A refused hit leaves no trace once `take_hit` returns; while it is
///   being decided it may count against a concurrent hit, so racing hits
///   near the limit may both be refused (never both admitted past it). With
///   one caller at a time the decision is exact: admitted if and only if
///   fewer than `limit` hits are counted.
/// - `rate_hits(key, now)` is what `take_hit` would count at `now`,
///   ascending, without taking a hit (`/v1/usage`).
/// - Hits are kept at least [`RATE_HIT_RETENTION_MS`] and may be forgotten
///   after.
#[async_trait]
pub trait AuthStore: Send + Sync {
    /// A stamp of the keys: once a `put_key` (a new key, a revocation) has
    /// committed through any handle, in any process, a stamp read after it
    /// differs from every stamp read before it, and stamps read through one
    /// handle never decrease. `None`: the backend cannot
    /// tell at the cost of [`crate::ReadStore::version`], whose contract
    /// this is for keys (the API keeps the key records it read while the
    /// stamp stands, `hindsight_api::cache`).
    fn version(&self) -> Option<u64> {
        None
    }
    async fn put_key(&self, key: ApiKeyRecord) -> Result<()>;
    async fn key_by_hash(&self, hash: [u8; 32]) -> Result<Option<ApiKeyRecord>>;
    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>>;
    async fn take_hit(&self, key_id: &str, now: Timestamp, limit: u32) -> Result<RateHits>;
    async fn rate_hits(&self, key_id: &str, now: Timestamp) -> Result<Vec<Timestamp>>;
}
