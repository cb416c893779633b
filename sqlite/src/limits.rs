//! The rate-limit log in `limits.db`: one row per admitted request.
//!
//! A file of its own: every API request writes here, and must not queue
//! behind the projector's transactions on `store.db`. Every API process on
//! the data directory opens it, and SQLite's write lock serializes their
//! decisions: each `take_hit` counts and records in one `IMMEDIATE`
//! transaction, so the decision is exact (the contract's "one caller at a
//! time" case, always).
//!
//! Cost: counting reads at most `limit` index entries of one key; the log
//! holds at most `limit` rows per key per window, and rows older than
//! [`RATE_HIT_RETENTION_MS`] are deleted as the key is used (and, for keys no
//! longer used, by a sweep every [`SWEEP_EVERY`] hits taken).

use crate::db::{blocking, Durability, SideFile};
use crate::{CResult, Result};
use hindsight_contracts::auth::{counted_range, RateHits, RATE_HIT_RETENTION_MS};
use hindsight_schemas::Timestamp;
use hindsight_telemetry as tm;
use rusqlite::{params, Connection, TransactionBehavior};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Version 1 counted fixed minute windows (`rate_windows`), which let twice
/// a plan's rate through around a window's edge; the log replaces them.
const SCHEMA: &str = "
DROP TABLE IF EXISTS rate_windows;
CREATE TABLE IF NOT EXISTS rate_hits (key_id TEXT NOT NULL, at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS rate_hits_by_key ON rate_hits (key_id, at);
";

/// Hits taken between two sweeps of every key's expired hits.
const SWEEP_EVERY: u64 = 1024;

pub(crate) struct RateLog {
    file: Arc<SideFile>,
    taken: AtomicU64,
}

fn counted(conn: &Connection, key_id: &str, now: Timestamp) -> Result<Vec<Timestamp>> {
    let (after, before) = counted_range(now);
    let mut stmt = conn.prepare_cached(
        "SELECT at FROM rate_hits WHERE key_id = ?1 AND at > ?2 AND at < ?3 ORDER BY at",
    )?;
    let hits = stmt
        .query_map(params![key_id, after.millis(), before.millis()], |r| {
            Ok(Timestamp(r.get(0)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(hits)
}

impl RateLog {
    pub(crate) fn new(dir: &Path) -> Self {
        RateLog {
            file: Arc::new(SideFile::new(
                dir,
                crate::db::LIMITS_FILE,
                Durability::Normal,
                SCHEMA,
            )),
            taken: AtomicU64::new(0),
        }
    }

    pub(crate) async fn take_hit(
        &self,
        key_id: &str,
        now: Timestamp,
        limit: u32,
    ) -> CResult<RateHits> {
        let sweep = self
            .taken
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SWEEP_EVERY);
        let (file, key_id) = (self.file.clone(), key_id.to_string());
        timed("take_hit", async move {
            blocking(move || {
                file.with(|conn| {
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let mut hits = counted(&tx, &key_id, now)?;
                    let admitted = hits.len() < limit as usize;
                    if admitted {
                        tx.prepare_cached("INSERT INTO rate_hits (key_id, at) VALUES (?1, ?2)")?
                            .execute(params![key_id, now.millis()])?;
                        let expired = now.millis() - RATE_HIT_RETENTION_MS;
                        if sweep {
                            tx.prepare_cached("DELETE FROM rate_hits WHERE at <= ?1")?
                                .execute(params![expired])?;
                        } else {
                            tx.prepare_cached(
                                "DELETE FROM rate_hits WHERE key_id = ?1 AND at <= ?2",
                            )?
                            .execute(params![key_id, expired])?;
                        }
                        let at = hits.partition_point(|h| *h <= now);
                        hits.insert(at, now);
                    }
                    tx.commit()?;
                    Ok(RateHits { admitted, hits })
                })
            })
            .await
        })
        .await
    }

    pub(crate) async fn rate_hits(&self, key_id: &str, now: Timestamp) -> CResult<Vec<Timestamp>> {
        let (file, key_id) = (self.file.clone(), key_id.to_string());
        timed("read_hits", async move {
            blocking(move || file.with(|conn| counted(conn, &key_id, now))).await
        })
        .await
    }
}

async fn timed<R>(
    op: &'static str,
    work: impl std::future::Future<Output = CResult<R>>,
) -> CResult<R> {
    let started = Instant::now();
    let out = work.await;
    metrics::histogram!(tm::STORE_QUERY_SECONDS, "op" => op)
        .record(started.elapsed().as_secs_f64());
    if out.is_err() {
        metrics::counter!(tm::STORE_ERRORS, "op" => op).increment(1);
    }
    out
}
