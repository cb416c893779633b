//! API keys and rate windows, shared by every API replica.

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

/// Keys and request counting.
///
/// Contract:
/// - `put_key` inserts or replaces the key with its `key_id`, visible to
///   `key_by_hash` and `list_keys` of every process at once (revocation and
///   plan changes take effect on the next request). A key's hash never
///   changes: a new secret is a new key with a new `key_id` (the CQL store
///   keys rows by hash).
/// - A stored hash that is not 32 bytes is `ErrorKind::Corrupt`, never a
///   key that matches nothing or everything.
/// - `hit_window` counts one request of `key_id` in the window starting at
///   `window`, across every process sharing the store, and returns the
///   window's count including this request; concurrent hits never
///   under-count.
#[async_trait]
pub trait AuthStore: Send + Sync {
    async fn put_key(&self, key: ApiKeyRecord) -> Result<()>;
    async fn key_by_hash(&self, hash: [u8; 32]) -> Result<Option<ApiKeyRecord>>;
    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>>;
    async fn hit_window(&self, key_id: &str, window: Timestamp) -> Result<u64>;
}
