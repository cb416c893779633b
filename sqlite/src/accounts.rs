//! The dashboard's accounts in `accounts.db`: organizations, users, sign-in
//! tokens, sessions, organizations' keys and per-key hourly usage counts.
//!
//! A file of its own, like `limits.db`: every API request adds to a usage
//! count here, and must not queue behind the projector's transactions on
//! `store.db`. Every API process on the data directory opens it; SQLite's
//! write lock makes each statement atomic across them (a token is deleted
//! by exactly one `DELETE … RETURNING`, counts are added in place).

use crate::db::{blocking, Durability, SideFile};
use crate::store::SqliteStore;
use crate::{CResult, Error, Result};
use async_trait::async_trait;
use hindsight_contracts::{
    AccountStore, KeyUsage, KeyUse, OrgKey, Organization, Session, SignInToken, StatusClass,
    UsageCount, User,
};
use hindsight_schemas::Timestamp;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::Arc;

pub(crate) const ACCOUNTS_FILE: &str = "accounts.db";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS organizations (
    name TEXT PRIMARY KEY, plan TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS users (
    email TEXT PRIMARY KEY, organization TEXT NOT NULL, role TEXT NOT NULL,
    password_hash TEXT, created_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS users_by_org ON users (organization, created_at);
CREATE TABLE IF NOT EXISTS sign_in_tokens (
    hash BLOB PRIMARY KEY, email TEXT NOT NULL, expires_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    hash BLOB PRIMARY KEY, email TEXT NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS org_keys (
    organization TEXT NOT NULL, key_id TEXT NOT NULL, name TEXT NOT NULL,
    prefix TEXT NOT NULL, hash BLOB NOT NULL, created_at INTEGER NOT NULL,
    PRIMARY KEY (organization, key_id));
CREATE TABLE IF NOT EXISTS key_usage (
    key_id TEXT NOT NULL, hour INTEGER NOT NULL, class TEXT NOT NULL,
    count INTEGER NOT NULL, PRIMARY KEY (key_id, hour, class));
CREATE TABLE IF NOT EXISTS key_last_used (key_id TEXT PRIMARY KEY, at INTEGER NOT NULL);
";

type OrgKeyRow = (String, String, String, String, Vec<u8>, i64);

pub(crate) struct Accounts {
    file: Arc<SideFile>,
}

fn hash32(what: &str, bytes: Vec<u8>) -> Result<[u8; 32]> {
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| Error::Corrupt(format!("{what}: hash of {} bytes", b.len())))
}

impl Accounts {
    pub(crate) fn new(dir: &Path) -> Self {
        Accounts {
            file: Arc::new(SideFile::new(
                dir,
                ACCOUNTS_FILE,
                Durability::Normal,
                SCHEMA,
            )),
        }
    }

    async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R> + Send + 'static,
    ) -> CResult<R> {
        let file = self.file.clone();
        blocking(move || file.with(|c| f(c))).await
    }
}

fn user_from(r: &rusqlite::Row) -> rusqlite::Result<User> {
    Ok(User {
        email: r.get(0)?,
        organization: r.get(1)?,
        role: r.get(2)?,
        password_hash: r.get(3)?,
        created_at: Timestamp(r.get(4)?),
    })
}

#[async_trait]
impl AccountStore for SqliteStore {
    async fn put_organization(&self, org: Organization) -> CResult<()> {
        self.accounts
            .run(move |c| {
                c.execute(
                    "INSERT OR REPLACE INTO organizations VALUES (?1, ?2, ?3)",
                    params![org.name, org.plan, org.created_at.millis()],
                )?;
                Ok(())
            })
            .await
    }

    async fn organization(&self, name: &str) -> CResult<Option<Organization>> {
        let name = name.to_string();
        self.accounts
            .run(move |c| {
                Ok(c.query_row(
                    "SELECT name, plan, created_at FROM organizations WHERE name = ?1",
                    params![name],
                    |r| {
                        Ok(Organization {
                            name: r.get(0)?,
                            plan: r.get(1)?,
                            created_at: Timestamp(r.get(2)?),
                        })
                    },
                )
                .optional()?)
            })
            .await
    }

    async fn put_user(&self, user: User) -> CResult<()> {
        self.accounts
            .run(move |c| {
                c.execute(
                    "INSERT OR REPLACE INTO users VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        user.email,
                        user.organization,
                        user.role,
                        user.password_hash,
                        user.created_at.millis()
                    ],
                )?;
                Ok(())
            })
            .await
    }

    async fn user(&self, email: &str) -> CResult<Option<User>> {
        let email = email.to_string();
        self.accounts
            .run(move |c| {
                Ok(c.query_row(
                    "SELECT email, organization, role, password_hash, created_at FROM users WHERE email = ?1",
                    params![email],
                    user_from,
                )
                .optional()?)
            })
            .await
    }

    async fn users(&self, organization: &str) -> CResult<Vec<User>> {
        let org = organization.to_string();
        self.accounts
            .run(move |c| {
                let mut stmt = c.prepare_cached(
                    "SELECT email, organization, role, password_hash, created_at FROM users \
                     WHERE organization = ?1 ORDER BY created_at, email",
                )?;
                let users = stmt
                    .query_map(params![org], user_from)?
                    .collect::<rusqlite::Result<_>>()?;
                Ok(users)
            })
            .await
    }

    async fn put_sign_in_token(&self, token: SignInToken) -> CResult<()> {
        self.accounts
            .run(move |c| {
                c.execute(
                    "INSERT OR REPLACE INTO sign_in_tokens VALUES (?1, ?2, ?3)",
                    params![token.hash.to_vec(), token.email, token.expires_at.millis()],
                )?;
                Ok(())
            })
            .await
    }

    /// One `DELETE … RETURNING`: the process whose statement deletes the row
    /// is the one that took it.
    async fn take_sign_in_token(&self, hash: [u8; 32]) -> CResult<Option<SignInToken>> {
        self.accounts
            .run(move |c| {
                let row = c
                    .query_row(
                        "DELETE FROM sign_in_tokens WHERE hash = ?1 RETURNING hash, email, expires_at",
                        params![hash.to_vec()],
                        |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get(1)?, r.get(2)?)),
                    )
                    .optional()?;
                row.map(|(h, email, expires)| {
                    Ok(SignInToken {
                        hash: hash32("sign-in token", h)?,
                        email,
                        expires_at: Timestamp(expires),
                    })
                })
                .transpose()
            })
            .await
    }

    async fn put_session(&self, session: Session) -> CResult<()> {
        self.accounts
            .run(move |c| {
                // Sessions past their expiry are swept as new ones start.
                c.execute(
                    "DELETE FROM sessions WHERE expires_at < ?1",
                    params![session.created_at.millis()],
                )?;
                c.execute(
                    "INSERT OR REPLACE INTO sessions VALUES (?1, ?2, ?3, ?4)",
                    params![
                        session.hash.to_vec(),
                        session.email,
                        session.created_at.millis(),
                        session.expires_at.millis()
                    ],
                )?;
                Ok(())
            })
            .await
    }

    async fn session(&self, hash: [u8; 32]) -> CResult<Option<Session>> {
        self.accounts
            .run(move |c| {
                let row = c
                    .query_row(
                        "SELECT hash, email, created_at, expires_at FROM sessions WHERE hash = ?1",
                        params![hash.to_vec()],
                        |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                    )
                    .optional()?;
                row.map(|(h, email, created, expires)| {
                    Ok(Session {
                        hash: hash32("session", h)?,
                        email,
                        created_at: Timestamp(created),
                        expires_at: Timestamp(expires),
                    })
                })
                .transpose()
            })
            .await
    }

    async fn delete_session(&self, hash: [u8; 32]) -> CResult<()> {
        self.accounts
            .run(move |c| {
                c.execute(
                    "DELETE FROM sessions WHERE hash = ?1",
                    params![hash.to_vec()],
                )?;
                Ok(())
            })
            .await
    }

    async fn put_org_key(&self, key: OrgKey) -> CResult<()> {
        self.accounts
            .run(move |c| {
                c.execute(
                    "INSERT OR REPLACE INTO org_keys VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![
                        key.organization,
                        key.key_id,
                        key.name,
                        key.prefix,
                        key.hash.to_vec(),
                        key.created_at.millis()
                    ],
                )?;
                Ok(())
            })
            .await
    }

    async fn org_keys(&self, organization: &str) -> CResult<Vec<OrgKey>> {
        let org = organization.to_string();
        self.accounts
            .run(move |c| {
                let mut stmt = c.prepare_cached(
                    "SELECT organization, key_id, name, prefix, hash, created_at FROM org_keys \
                     WHERE organization = ?1 ORDER BY created_at, key_id",
                )?;
                let rows = stmt
                    .query_map(params![org], |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get::<_, Vec<u8>>(4)?,
                            r.get(5)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<OrgKeyRow>>>()?;
                rows.into_iter()
                    .map(|(organization, key_id, name, prefix, hash, created)| {
                        Ok(OrgKey {
                            hash: hash32(&key_id, hash)?,
                            organization,
                            key_id,
                            name,
                            prefix,
                            created_at: Timestamp(created),
                        })
                    })
                    .collect()
            })
            .await
    }

    async fn record_uses(&self, uses: Vec<KeyUse>) -> CResult<()> {
        self.accounts
            .run(move |c| {
                let tx = c.unchecked_transaction()?;
                for u in &uses {
                    tx.prepare_cached(
                        "INSERT INTO key_usage VALUES (?1, ?2, ?3, ?4) \
                         ON CONFLICT (key_id, hour, class) DO UPDATE SET count = count + excluded.count",
                    )?
                    .execute(params![u.key_id, u.hour.millis(), u.class.as_str(), u.count as i64])?;
                    tx.prepare_cached(
                        "INSERT INTO key_last_used VALUES (?1, ?2) \
                         ON CONFLICT (key_id) DO UPDATE SET at = max(at, excluded.at)",
                    )?
                    .execute(params![u.key_id, u.last_at.millis()])?;
                }
                tx.commit()?;
                Ok(())
            })
            .await
    }

    async fn key_usage(&self, key_id: &str, since: Timestamp) -> CResult<KeyUsage> {
        let key_id = key_id.to_string();
        self.accounts
            .run(move |c| {
                let last_used = c
                    .query_row(
                        "SELECT at FROM key_last_used WHERE key_id = ?1",
                        params![key_id],
                        |r| r.get(0),
                    )
                    .optional()?
                    .map(Timestamp);
                let mut stmt = c.prepare_cached(
                    "SELECT hour, class, count FROM key_usage WHERE key_id = ?1 AND hour >= ?2",
                )?;
                let rows = stmt
                    .query_map(params![key_id, since.millis()], |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, i64>(2)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let mut counts = rows
                    .into_iter()
                    .map(|(hour, class, count)| {
                        Ok(UsageCount {
                            hour: Timestamp(hour),
                            class: StatusClass::parse(&class).ok_or_else(|| {
                                Error::Corrupt(format!("usage of {key_id}: status class {class:?}"))
                            })?,
                            count: count as u64,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                counts.sort_by_key(|u| (u.hour, u.class));
                Ok(KeyUsage { last_used, counts })
            })
            .await
    }
}
