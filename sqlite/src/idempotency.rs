//! [`IdempotencyFile`]: the claims of Kafka's idempotency keys in
//! `idempotency.db`, for one ingest process (or several sharing a data
//! directory on one host) without a CQL store.
//!
//! Claims are linearizable because each one is a single `IMMEDIATE`
//! transaction on the file; the file is local, so only processes on this
//! host share it. Ingest replicas on several hosts need the CQL store's
//! `idempotency_keys` instead (`hindsight-scylla`).

use crate::db::{blocking, open, Durability};
use crate::log::IDEMPOTENCY_TTL_MS;
use crate::{CResult, Error, Result};
use async_trait::async_trait;
use hindsight_contracts::{Claim, Hold, IdempotencyStore, Marker, Position};
use hindsight_schemas::Timestamp;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key              TEXT PRIMARY KEY,
    -- NULL: recorded before digests were kept; replayed for any body.
    body_sha256      BLOB,
    owner            BLOB NOT NULL,
    lease_until      INTEGER NOT NULL,
    -- 'pending' | 'committing' | 'done'
    state            TEXT NOT NULL,
    -- the attempt's marker (set at 'committing'): where, and whose
    marker_partition INTEGER,
    marker_offset    INTEGER,
    marker_writer    TEXT,
    response         BLOB NOT NULL,
    created_at       INTEGER NOT NULL
);
";

/// Keys recorded by earlier versions (`idempotency`: key, response, time;
/// recorded once the batch was confirmed) become `done` claims without a
/// digest, so their retries keep being answered for the rest of their 24 h.
const UPGRADE: &str = "
INSERT OR IGNORE INTO idempotency_keys
    (key, body_sha256, owner, lease_until, state, response, created_at)
    SELECT key, NULL, zeroblob(16), 0, 'done', response, created_at FROM idempotency;
DROP TABLE idempotency;
";

pub struct IdempotencyFile {
    conn: Arc<Mutex<Connection>>,
    /// New keys claimed through this handle: expired keys are deleted every
    /// 64th.
    claims: AtomicU64,
}

impl IdempotencyFile {
    pub fn open(dir: &Path) -> CResult<Self> {
        Self::open_inner(dir).map_err(Into::into)
    }

    fn open_inner(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
        let mut conn = open(&dir.join("idempotency.db"), Durability::Full)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(SCHEMA)?;
        let legacy: i64 = tx.query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'idempotency'",
            [],
            |r| r.get(0),
        )?;
        if legacy > 0 {
            tx.execute_batch(UPGRADE)?;
        }
        tx.commit()?;
        Ok(IdempotencyFile {
            conn: Arc::new(Mutex::new(conn)),
            claims: AtomicU64::new(0),
        })
    }

    /// Runs `f` on the connection off the async runtime.
    async fn with<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<R> + Send + 'static,
    ) -> CResult<R> {
        let conn = self.conn.clone();
        blocking(move || f(&mut conn.lock().unwrap())).await
    }
}

/// A stored claim, as `claim` reads it.
struct Row {
    body_digest: Option<Vec<u8>>,
    owner: Vec<u8>,
    lease_until: i64,
    state: String,
    marker: Option<Marker>,
    response: Vec<u8>,
    created_at: i64,
}

fn read(conn: &Connection, key: &str) -> Result<Option<Row>> {
    Ok(conn
        .query_row(
            "SELECT body_sha256, owner, lease_until, state, marker_partition, marker_offset, marker_writer,
                    response, created_at
             FROM idempotency_keys WHERE key = ?1",
            params![key],
            |r| {
                let marker = match (r.get::<_, Option<i64>>(4)?, r.get::<_, Option<i64>>(5)?, r.get(6)?) {
                    (Some(p), Some(o), Some(writer)) => Some(Marker {
                        position: Position {
                            partition: p as u32,
                            offset: o as u64,
                        },
                        writer,
                    }),
                    _ => None,
                };
                Ok(Row {
                    body_digest: r.get(0)?,
                    owner: r.get(1)?,
                    lease_until: r.get(2)?,
                    state: r.get(3)?,
                    marker,
                    response: r.get(7)?,
                    created_at: r.get(8)?,
                })
            },
        )
        .optional()?)
}

fn until(ms: i64) -> Duration {
    Duration::from_millis(ms.max(1) as u64)
}

#[async_trait]
impl IdempotencyStore for IdempotencyFile {
    async fn claim(
        &self,
        key: &str,
        body_digest: &[u8; 32],
        owner: u128,
        response: &[u8],
        lease: Duration,
    ) -> CResult<Claim> {
        let (key, digest, response) = (key.to_string(), *body_digest, response.to_vec());
        let sweep = self.claims.fetch_add(1, Ordering::Relaxed) & 63 == 0;
        let me = owner.to_be_bytes();
        let lease_ms = lease.as_millis() as i64;
        self.with(move |conn| {
            let now = Timestamp::now().millis();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if sweep {
                tx.execute(
                    "DELETE FROM idempotency_keys WHERE created_at <= ?1",
                    params![now - IDEMPOTENCY_TTL_MS],
                )?;
            }
            let row = read(&tx, &key)?.filter(|r| r.created_at > now - IDEMPOTENCY_TTL_MS);
            let claim = match row {
                None => {
                    tx.execute(
                        "INSERT OR REPLACE INTO idempotency_keys
                         (key, body_sha256, owner, lease_until, state, response, created_at)
                         VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?6)",
                        params![key, digest, me, now + lease_ms, response, now],
                    )?;
                    Claim::Owned(Hold {
                        key: key.clone(),
                        owner,
                        expires_at: now + IDEMPOTENCY_TTL_MS,
                    })
                }
                Some(row) => {
                    let hold = Hold {
                        key: key.clone(),
                        owner,
                        expires_at: row.created_at + IDEMPOTENCY_TTL_MS,
                    };
                    if row.body_digest.as_ref().is_some_and(|d| d[..] != digest[..]) {
                        Claim::Conflict
                    } else if row.state == "done" {
                        Claim::Done {
                            response: row.response,
                        }
                    } else if row.owner[..] != me[..] && row.lease_until > now {
                        Claim::Busy {
                            retry_after: until(row.lease_until - now),
                        }
                    } else {
                        tx.execute(
                            "UPDATE idempotency_keys SET owner = ?2, lease_until = ?3 WHERE key = ?1",
                            params![key, me, now + lease_ms],
                        )?;
                        match (row.state.as_str(), row.marker) {
                            ("committing", Some(marker)) => Claim::TakenOver {
                                hold,
                                marker,
                                response: row.response,
                            },
                            ("pending", _) => Claim::Owned(hold),
                            (state, marker) => {
                                return Err(Error::Corrupt(format!(
                                    "idempotency key {key}: state {state:?} with marker {marker:?}"
                                )))
                            }
                        }
                    }
                }
            };
            tx.commit()?;
            Ok(claim)
        })
        .await
    }

    async fn committing(&self, hold: &Hold, marker: &Marker) -> CResult<bool> {
        let (key, me, marker) = (hold.key.clone(), hold.owner.to_be_bytes(), marker.clone());
        self.with(move |conn| {
            Ok(conn.execute(
                "UPDATE idempotency_keys
                 SET state = 'committing', marker_partition = ?3, marker_offset = ?4, marker_writer = ?5
                 WHERE key = ?1 AND owner = ?2",
                params![
                    key,
                    me,
                    marker.position.partition,
                    marker.position.offset as i64,
                    marker.writer
                ],
            )? == 1)
        })
        .await
    }

    async fn done(&self, hold: &Hold) -> CResult<bool> {
        let (key, me) = (hold.key.clone(), hold.owner.to_be_bytes());
        self.with(move |conn| {
            Ok(conn.execute(
                "UPDATE idempotency_keys SET state = 'done' WHERE key = ?1 AND owner = ?2",
                params![key, me],
            )? == 1)
        })
        .await
    }

    async fn release(&self, hold: &Hold) -> CResult<()> {
        let (key, me) = (hold.key.clone(), hold.owner.to_be_bytes());
        self.with(move |conn| {
            conn.execute(
                "UPDATE idempotency_keys SET lease_until = 0 WHERE key = ?1 AND owner = ?2",
                params![key, me],
            )?;
            Ok(())
        })
        .await
    }
}
