//! Accounts behind the dashboard: organizations, their users, one-time
//! sign-in tokens, sessions, the organization's API keys, and per-key usage
//! counters. Shared by every API replica, like [`crate::AuthStore`].
//!
//! Secrets never reach the store in plain text: a password is stored as its
//! Argon2id PHC string, a sign-in token and a session id as the SHA-256 of
//! the random value handed to the browser (256 bits each: nothing to
//! brute-force).

use crate::Result;
use async_trait::async_trait;
use hindsight_schemas::Timestamp;

/// An organization: what its keys are billed against.
#[derive(Debug, Clone, PartialEq)]
pub struct Organization {
    pub name: String,
    /// The plan every key of the organization gets.
    pub plan: String,
    pub created_at: Timestamp,
}

/// A user of one organization, named by email (lowercased by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct User {
    pub email: String,
    pub organization: String,
    /// `owner` (may invite) or `member`.
    pub role: String,
    /// Argon2id PHC string; `None` until the user follows a sign-in link.
    pub password_hash: Option<String>,
    pub created_at: Timestamp,
}

/// A one-time sign-in link's token, by the SHA-256 of its secret.
#[derive(Debug, Clone, PartialEq)]
pub struct SignInToken {
    pub hash: [u8; 32],
    pub email: String,
    pub expires_at: Timestamp,
}

/// A signed-in browser, by the SHA-256 of its cookie's value.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub hash: [u8; 32],
    pub email: String,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
}

/// A key created from the dashboard: its name and organization. The key
/// itself (hash, plan, revocation) is the [`crate::ApiKeyRecord`] the API
/// checks; this is the organization's list of them.
#[derive(Debug, Clone, PartialEq)]
pub struct OrgKey {
    pub organization: String,
    pub key_id: String,
    pub name: String,
    /// The key's first characters (`hsk_` and 8 more), to recognise it by:
    /// 32 bits of a 256-bit secret.
    pub prefix: String,
    /// The key's hash, to read its [`crate::ApiKeyRecord`].
    pub hash: [u8; 32],
    pub created_at: Timestamp,
}

/// Requests of one key answered in one hour with one status class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageCount {
    /// Start of the hour (UTC).
    pub hour: Timestamp,
    pub class: StatusClass,
    pub count: u64,
}

/// Requests of one key in one hour and status class, tallied together
/// (the API counts requests in memory and writes them in batches).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyUse {
    pub key_id: String,
    /// Start of the hour (UTC).
    pub hour: Timestamp,
    pub class: StatusClass,
    /// Requests tallied, at least one.
    pub count: u64,
    /// The latest of them.
    pub last_at: Timestamp,
}

/// What a request's status counts as in usage charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatusClass {
    /// 2xx and 3xx (a `304` is a served request).
    Ok,
    /// 429: refused by the rate limit.
    Limited,
    /// Every other 4xx and the 5xx: refused or failed.
    Error,
}

impl StatusClass {
    pub fn of(status: u16) -> Self {
        match status {
            429 => StatusClass::Limited,
            s if s < 400 => StatusClass::Ok,
            _ => StatusClass::Error,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StatusClass::Ok => "2xx",
            StatusClass::Limited => "429",
            StatusClass::Error => "4xx",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [StatusClass::Ok, StatusClass::Limited, StatusClass::Error]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

pub const HOUR_MS: i64 = 3_600_000;

/// The start of the hour holding `at`.
pub fn hour_of(at: Timestamp) -> Timestamp {
    Timestamp(at.0.div_euclid(HOUR_MS) * HOUR_MS)
}

/// A key's usage since some hour.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyUsage {
    /// The latest `at` recorded for the key, ever.
    pub last_used: Option<Timestamp>,
    /// Non-zero counts at or after the asked hour, ascending by hour then
    /// class.
    pub counts: Vec<UsageCount>,
}

/// Organizations, users, sign-in tokens, sessions, dashboard keys, usage.
///
/// Contract (every write visible to every process at once, as
/// [`crate::AuthStore`]):
/// - `put_organization`, `put_user`, `put_org_key` insert or replace by
///   name, email, and (organization, key id); `organization`, `user` read
///   them back, `users` and `org_keys` list an organization's, ascending by
///   creation time.
/// - `take_sign_in_token(hash)` returns the stored token and deletes it,
///   **once**: of any number of concurrent takes of one token, across
///   processes, exactly one gets it. Expiry is the caller's to check (an
///   expired token taken is refused, and gone); a backend may forget a
///   token after its `expires_at`.
/// - `session(hash)` returns a stored session until `delete_session`; a
///   backend may forget it after its `expires_at` (the caller checks).
/// - `record_uses(uses)` adds each use's `count` to its key's count of its
///   hour and status class, and moves the key's `last_used` to its
///   `last_at` if later; no increment is lost under concurrency between
///   processes. `key_usage(key, since)` returns the counts of hours at or
///   after `since`.
#[async_trait]
pub trait AccountStore: Send + Sync {
    async fn put_organization(&self, org: Organization) -> Result<()>;
    async fn organization(&self, name: &str) -> Result<Option<Organization>>;
    async fn put_user(&self, user: User) -> Result<()>;
    async fn user(&self, email: &str) -> Result<Option<User>>;
    async fn users(&self, organization: &str) -> Result<Vec<User>>;
    async fn put_sign_in_token(&self, token: SignInToken) -> Result<()>;
    async fn take_sign_in_token(&self, hash: [u8; 32]) -> Result<Option<SignInToken>>;
    async fn put_session(&self, session: Session) -> Result<()>;
    async fn session(&self, hash: [u8; 32]) -> Result<Option<Session>>;
    async fn delete_session(&self, hash: [u8; 32]) -> Result<()>;
    async fn put_org_key(&self, key: OrgKey) -> Result<()>;
    async fn org_keys(&self, organization: &str) -> Result<Vec<OrgKey>>;
    async fn record_uses(&self, uses: Vec<KeyUse>) -> Result<()>;
    async fn key_usage(&self, key_id: &str, since: Timestamp) -> Result<KeyUsage>;
}
