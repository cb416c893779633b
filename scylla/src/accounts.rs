//! [`AccountStore`] on CQL: the dashboard's accounts, shared by every API
//! replica.
//!
//! - Plain whole-row upserts for organizations, users, organizations' keys
//!   and sessions; sign-in tokens and sessions carry a TTL until their
//!   expiry, so forgotten ones disappear.
//! - `take_sign_in_token`: read the row, then `DELETE … IF EXISTS` (a
//!   lightweight transaction): of concurrent takes, only the one whose
//!   delete applied gets the token.
//! - Usage: a counter per key, hour and status class (increments are never
//!   retried by the driver, so a lost answer may lose one count, never add
//!   one); `key_last_used` is written `USING TIMESTAMP` of the use, so the
//!   latest use wins whatever order replicas write in.

use crate::idempotency::Lwt;
use crate::statements::Stmt;
use crate::store::{corrupt, ts, ScyllaStore};
use async_trait::async_trait;
use hindsight_contracts::{
    AccountStore, KeyUsage, KeyUse, OrgKey, Organization, Result, Session, SignInToken,
    StatusClass, UsageCount, User,
};
use hindsight_schemas::Timestamp;
use scylla::value::CqlTimestamp;

pub(crate) fn stmt(name: &str, cql: String, binds: &[&'static str]) -> Stmt {
    Stmt {
        name: name.into(),
        cql,
        binds: binds.to_vec(),
    }
}

/// The statements of this module, appended to [`crate::statements::all`].
pub fn statements(ks: &str) -> Vec<Stmt> {
    vec![
        stmt(
            "upsert_organization",
            format!("INSERT INTO {ks}.organizations (name, plan, created_at) VALUES (?, ?, ?)"),
            &["text", "text", "timestamp"],
        ),
        stmt(
            "select_organization",
            format!("SELECT name, plan, created_at FROM {ks}.organizations WHERE name = ?"),
            &["text"],
        ),
        stmt(
            "upsert_user",
            format!("INSERT INTO {ks}.users (email, organization, role, password_hash, created_at) VALUES (?, ?, ?, ?, ?)"),
            &["text", "text", "text", "text", "timestamp"],
        ),
        stmt(
            "upsert_user_by_org",
            format!("INSERT INTO {ks}.users_by_org (organization, email) VALUES (?, ?)"),
            &["text", "text"],
        ),
        stmt(
            "select_user",
            format!("SELECT email, organization, role, password_hash, created_at FROM {ks}.users WHERE email = ?"),
            &["text"],
        ),
        stmt(
            "select_users_by_org",
            format!("SELECT email FROM {ks}.users_by_org WHERE organization = ?"),
            &["text"],
        ),
        stmt(
            "insert_sign_in_token",
            format!("INSERT INTO {ks}.sign_in_tokens (hash, email, expires_at) VALUES (?, ?, ?) USING TTL ?"),
            &["blob", "text", "timestamp", "int"],
        ),
        stmt(
            "select_sign_in_token",
            format!("SELECT hash, email, expires_at FROM {ks}.sign_in_tokens WHERE hash = ?"),
            &["blob"],
        ),
        stmt(
            "take_sign_in_token",
            format!("DELETE FROM {ks}.sign_in_tokens WHERE hash = ? IF EXISTS"),
            &["blob"],
        ),
        stmt(
            "insert_session",
            format!("INSERT INTO {ks}.sessions (hash, email, created_at, expires_at) VALUES (?, ?, ?, ?) USING TTL ?"),
            &["blob", "text", "timestamp", "timestamp", "int"],
        ),
        stmt(
            "select_session",
            format!("SELECT hash, email, created_at, expires_at FROM {ks}.sessions WHERE hash = ?"),
            &["blob"],
        ),
        stmt(
            "delete_session",
            format!("DELETE FROM {ks}.sessions WHERE hash = ?"),
            &["blob"],
        ),
        stmt(
            "upsert_org_key",
            format!("INSERT INTO {ks}.org_keys (organization, key_id, name, prefix, hash, created_at) VALUES (?, ?, ?, ?, ?, ?)"),
            &["text", "text", "text", "text", "blob", "timestamp"],
        ),
        stmt(
            "select_org_keys",
            format!("SELECT organization, key_id, name, prefix, hash, created_at FROM {ks}.org_keys WHERE organization = ?"),
            &["text"],
        ),
        stmt(
            "count_use",
            format!("UPDATE {ks}.key_usage SET count = count + ? WHERE key_id = ? AND hour = ? AND class = ?"),
            &["counter", "text", "timestamp", "text"],
        ),
        stmt(
            "upsert_last_used",
            format!("INSERT INTO {ks}.key_last_used (key_id, at) VALUES (?, ?) USING TIMESTAMP ?"),
            &["text", "timestamp", "bigint"],
        ),
        stmt(
            "select_usage",
            format!("SELECT hour, class, count FROM {ks}.key_usage WHERE key_id = ? AND hour >= ?"),
            &["text", "timestamp"],
        ),
        stmt(
            "select_last_used",
            format!("SELECT at FROM {ks}.key_last_used WHERE key_id = ?"),
            &["text"],
        ),
    ]
}

/// Seconds from `now` until `expires_at`, for `USING TTL` (at least one).
fn ttl_until(expires_at: Timestamp) -> i32 {
    let left = (expires_at.0 - Timestamp::now().0 + 999) / 1000;
    left.clamp(1, i32::MAX as i64) as i32
}

fn hash32(bytes: Vec<u8>) -> Result<[u8; 32]> {
    bytes
        .try_into()
        .map_err(|_| corrupt("an account hash is not 32 bytes"))
}

type UserRow = (String, String, String, Option<String>, CqlTimestamp);
type OrgKeyRow = (String, String, String, String, Vec<u8>, CqlTimestamp);

impl ScyllaStore {
    pub(crate) async fn rows<R>(
        &self,
        op: &'static str,
        name: &str,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<Vec<R>>
    where
        R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm>,
    {
        let rows = self
            .exec(op, name, values)
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        rows.rows::<R>()
            .map_err(corrupt)?
            .map(|r| r.map_err(corrupt))
            .collect()
    }
}

#[async_trait]
impl AccountStore for ScyllaStore {
    async fn put_organization(&self, org: Organization) -> Result<()> {
        self.exec(
            "put_organization",
            "upsert_organization",
            (org.name.as_str(), org.plan.as_str(), ts(org.created_at.0)),
        )
        .await
        .map(|_| ())
    }

    async fn organization(&self, name: &str) -> Result<Option<Organization>> {
        let rows: Vec<(String, String, CqlTimestamp)> = self
            .rows("read_organization", "select_organization", (name,))
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|(name, plan, created)| Organization {
                name,
                plan,
                created_at: Timestamp(created.0),
            }))
    }

    /// The user row, then its organization's index entry (a user whose
    /// index write failed is still found by email, and the put can be
    /// retried).
    async fn put_user(&self, user: User) -> Result<()> {
        self.exec(
            "put_user",
            "upsert_user",
            (
                user.email.as_str(),
                user.organization.as_str(),
                user.role.as_str(),
                user.password_hash.as_deref(),
                ts(user.created_at.0),
            ),
        )
        .await?;
        self.exec(
            "put_user",
            "upsert_user_by_org",
            (user.organization.as_str(), user.email.as_str()),
        )
        .await
        .map(|_| ())
    }

    async fn user(&self, email: &str) -> Result<Option<User>> {
        let rows: Vec<UserRow> = self.rows("read_user", "select_user", (email,)).await?;
        Ok(rows.into_iter().next().map(user_from))
    }

    async fn users(&self, organization: &str) -> Result<Vec<User>> {
        let emails: Vec<(String,)> = self
            .rows("read_users", "select_users_by_org", (organization,))
            .await?;
        let mut out = Vec::new();
        for (email,) in emails {
            // An entry of a user since moved to another organization is not
            // theirs any more.
            if let Some(user) = self.user(&email).await? {
                if user.organization == organization {
                    out.push(user);
                }
            }
        }
        out.sort_by(|a, b| (a.created_at, &a.email).cmp(&(b.created_at, &b.email)));
        Ok(out)
    }

    async fn put_sign_in_token(&self, token: SignInToken) -> Result<()> {
        self.exec(
            "put_sign_in_token",
            "insert_sign_in_token",
            (
                token.hash.to_vec(),
                token.email.as_str(),
                ts(token.expires_at.0),
                ttl_until(token.expires_at),
            ),
        )
        .await
        .map(|_| ())
    }

    async fn take_sign_in_token(&self, hash: [u8; 32]) -> Result<Option<SignInToken>> {
        let rows: Vec<(Vec<u8>, String, CqlTimestamp)> = self
            .rows(
                "take_sign_in_token",
                "select_sign_in_token",
                (hash.to_vec(),),
            )
            .await?;
        let Some((stored, email, expires)) = rows.into_iter().next() else {
            return Ok(None);
        };
        let deleted = Lwt::read(
            self.exec("take_sign_in_token", "take_sign_in_token", (hash.to_vec(),))
                .await?,
        )?
        .applied;
        if !deleted {
            return Ok(None);
        }
        Ok(Some(SignInToken {
            hash: hash32(stored)?,
            email,
            expires_at: Timestamp(expires.0),
        }))
    }

    async fn put_session(&self, session: Session) -> Result<()> {
        self.exec(
            "put_session",
            "insert_session",
            (
                session.hash.to_vec(),
                session.email.as_str(),
                ts(session.created_at.0),
                ts(session.expires_at.0),
                ttl_until(session.expires_at),
            ),
        )
        .await
        .map(|_| ())
    }

    async fn session(&self, hash: [u8; 32]) -> Result<Option<Session>> {
        let rows: Vec<(Vec<u8>, String, CqlTimestamp, CqlTimestamp)> = self
            .rows("read_session", "select_session", (hash.to_vec(),))
            .await?;
        rows.into_iter()
            .next()
            .map(|(h, email, created, expires)| {
                Ok(Session {
                    hash: hash32(h)?,
                    email,
                    created_at: Timestamp(created.0),
                    expires_at: Timestamp(expires.0),
                })
            })
            .transpose()
    }

    async fn delete_session(&self, hash: [u8; 32]) -> Result<()> {
        self.exec("delete_session", "delete_session", (hash.to_vec(),))
            .await
            .map(|_| ())
    }

    async fn put_org_key(&self, key: OrgKey) -> Result<()> {
        self.exec(
            "put_org_key",
            "upsert_org_key",
            (
                key.organization.as_str(),
                key.key_id.as_str(),
                key.name.as_str(),
                key.prefix.as_str(),
                key.hash.to_vec(),
                ts(key.created_at.0),
            ),
        )
        .await
        .map(|_| ())
    }

    async fn org_keys(&self, organization: &str) -> Result<Vec<OrgKey>> {
        let rows: Vec<OrgKeyRow> = self
            .rows("read_org_keys", "select_org_keys", (organization,))
            .await?;
        let mut out = rows
            .into_iter()
            .map(|(organization, key_id, name, prefix, hash, created)| {
                Ok(OrgKey {
                    organization,
                    key_id,
                    name,
                    prefix,
                    hash: hash32(hash)?,
                    created_at: Timestamp(created.0),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        out.sort_by(|a, b| (a.created_at, &a.key_id).cmp(&(b.created_at, &b.key_id)));
        Ok(out)
    }

    /// A counter update and a last-used write per tally. Not a batch: a
    /// counter batch is not idempotent either, and the tallies of one
    /// flush are few (one per key, hour and class in a second).
    async fn record_uses(&self, uses: Vec<KeyUse>) -> Result<()> {
        for u in &uses {
            let count = scylla::value::Counter(i64::try_from(u.count).unwrap_or(i64::MAX));
            self.exec(
                "record_uses",
                "count_use",
                (count, u.key_id.as_str(), ts(u.hour.0), u.class.as_str()),
            )
            .await?;
            self.exec(
                "record_uses",
                "upsert_last_used",
                (
                    u.key_id.as_str(),
                    ts(u.last_at.0),
                    u.last_at.0.saturating_mul(1000),
                ),
            )
            .await?;
        }
        Ok(())
    }

    async fn key_usage(&self, key_id: &str, since: Timestamp) -> Result<KeyUsage> {
        let rows: Vec<(CqlTimestamp, String, scylla::value::Counter)> = self
            .rows("read_usage", "select_usage", (key_id, ts(since.0)))
            .await?;
        let mut counts = rows
            .into_iter()
            .map(|(hour, class, count)| {
                Ok(UsageCount {
                    hour: Timestamp(hour.0),
                    class: StatusClass::parse(&class)
                        .ok_or_else(|| corrupt(format!("usage of {key_id}: class {class:?}")))?,
                    count: count.0.max(0) as u64,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        counts.retain(|c| c.count > 0);
        counts.sort_by_key(|c| (c.hour, c.class));
        let last: Vec<(CqlTimestamp,)> = self
            .rows("read_usage", "select_last_used", (key_id,))
            .await?;
        Ok(KeyUsage {
            last_used: last.into_iter().next().map(|(t,)| Timestamp(t.0)),
            counts,
        })
    }
}

fn user_from((email, organization, role, password_hash, created): UserRow) -> User {
    User {
        email,
        organization,
        role,
        password_hash,
        created_at: Timestamp(created.0),
    }
}
