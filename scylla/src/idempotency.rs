//! [`IdempotencyStore`] on CQL: the `idempotency_keys` table, written only
//! with lightweight transactions (Paxos), so that every ingest replica sees
//! one linearizable history per key.
//!
//! - `claim`: `INSERT … IF NOT EXISTS`. Not applied, the answer carries the
//!   stored row, from which the claim decides: another digest is a
//!   conflict, `done` a replay, a live lease of another owner `Busy`; an
//!   expired one (or the caller's own, after a lost answer) is taken over
//!   with `UPDATE … IF owner = ? AND state = ?`, re-read if another claim
//!   moved the key first.
//! - `committing`, `done`, `release`: `UPDATE … IF owner = ?`.
//!
//! The key is forgotten 24 h after its first claim: the claim writes with
//! `USING TTL 86400`, and every later write with the TTL left until then,
//! so that the row's cells expire together. A row caught with some cells
//! expired (the second they expire in) is answered `Busy` for a second.
//!
//! Cassandra answers a condition that did not hold with `[applied]` and the
//! columns it checked (for `IF NOT EXISTS`, the whole row); ScyllaDB sends
//! the row whether or not it applied. Columns are read by name, so both
//! work; only Cassandra 5.0 is tested.

use crate::store::{corrupt, ts, ScyllaStore};
use async_trait::async_trait;
use hindsight_contracts::{Claim, Hold, IdempotencyStore, Marker, Position, Result};
use hindsight_schemas::Timestamp;
use scylla::response::query_result::QueryResult;
use scylla::value::{CqlValue, Row};
use std::collections::HashMap;
use std::time::Duration;

/// The idempotency window, as the claim's `USING TTL` says.
const WINDOW_MS: i64 = 86_400_000;

/// How many times a claim re-reads a key that another claim moved meanwhile
/// before answering `Busy`.
const CLAIM_ROUNDS: usize = 4;

/// The answer of a lightweight transaction: applied or not, and the columns
/// the server sent back, by name.
pub(crate) struct Lwt {
    pub(crate) applied: bool,
    columns: HashMap<String, CqlValue>,
}

impl Lwt {
    pub(crate) fn read(result: QueryResult) -> Result<Lwt> {
        let rows = result.into_rows_result().map_err(corrupt)?;
        let names: Vec<String> = rows
            .column_specs()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        let row = rows
            .maybe_first_row::<Row>()
            .map_err(corrupt)?
            .ok_or_else(|| corrupt("a lightweight transaction answered no row"))?;
        let columns: HashMap<String, CqlValue> = names
            .into_iter()
            .zip(row.columns)
            .filter_map(|(name, value)| Some((name, value?)))
            .collect();
        let applied = matches!(columns.get("[applied]"), Some(CqlValue::Boolean(true)));
        Ok(Lwt { applied, columns })
    }

    fn blob(&self, name: &str) -> Option<&[u8]> {
        match self.columns.get(name)? {
            CqlValue::Blob(b) => Some(b),
            _ => None,
        }
    }

    fn text(&self, name: &str) -> Option<&str> {
        match self.columns.get(name)? {
            CqlValue::Text(t) | CqlValue::Ascii(t) => Some(t),
            _ => None,
        }
    }

    fn millis(&self, name: &str) -> Option<i64> {
        match self.columns.get(name)? {
            CqlValue::Timestamp(t) => Some(t.0),
            _ => None,
        }
    }

    fn marker(&self) -> Option<Marker> {
        match (
            self.columns.get("marker_partition")?,
            self.columns.get("marker_offset")?,
            self.text("marker_writer")?,
        ) {
            (CqlValue::Int(p), CqlValue::BigInt(o), writer) => Some(Marker {
                position: Position {
                    partition: *p as u32,
                    offset: *o as u64,
                },
                writer: writer.to_string(),
            }),
            _ => None,
        }
    }

    /// Applied, or not applied because this very owner's earlier attempt of
    /// the same statement was (a lost answer the driver retried).
    fn applied_for(&self, owner: &[u8]) -> bool {
        self.applied || self.blob("owner") == Some(owner)
    }
}

/// Seconds left until `expires_at`, for `USING TTL` (at least one).
fn ttl_until(expires_at: i64, now: i64) -> i32 {
    ((expires_at - now + 999) / 1000).clamp(1, WINDOW_MS / 1000) as i32
}

fn owner_bytes(owner: u128) -> Vec<u8> {
    owner.to_be_bytes().to_vec()
}

/// A row caught while its cells expire: answered as a short wait.
const EXPIRING: Claim = Claim::Busy {
    retry_after: Duration::from_secs(1),
};

impl ScyllaStore {
    /// `UPDATE … IF owner = ?` statements of a hold; whether it applied.
    async fn holder_update(
        &self,
        op: &'static str,
        statement: &str,
        hold: &Hold,
        values: impl FnOnce(i32) -> Vec<CqlValue>,
    ) -> Result<bool> {
        let now = Timestamp::now().millis();
        let mut bound = values(ttl_until(hold.expires_at, now));
        bound.push(CqlValue::Text(hold.key.clone()));
        bound.push(CqlValue::Blob(owner_bytes(hold.owner)));
        let answer = Lwt::read(self.exec(op, statement, bound).await?)?;
        Ok(answer.applied)
    }
}

#[async_trait]
impl IdempotencyStore for ScyllaStore {
    async fn claim(
        &self,
        key: &str,
        body_digest: &[u8; 32],
        owner: u128,
        response: &[u8],
        lease: Duration,
    ) -> Result<Claim> {
        let me = owner_bytes(owner);
        let lease_ms = lease.as_millis() as i64;
        for _ in 0..CLAIM_ROUNDS {
            let now = Timestamp::now().millis();
            let claimed = Lwt::read(
                self.exec(
                    "idempotency_claim",
                    "claim_key",
                    (
                        key,
                        body_digest.to_vec(),
                        me.clone(),
                        ts(now + lease_ms),
                        response.to_vec(),
                        ts(now),
                    ),
                )
                .await?,
            )?;
            if claimed.applied {
                return Ok(Claim::Owned(Hold {
                    key: key.to_string(),
                    owner,
                    expires_at: now + WINDOW_MS,
                }));
            }
            let (
                Some(digest),
                Some(holder),
                Some(state),
                Some(lease_until),
                Some(created),
                Some(stored),
            ) = (
                claimed.blob("body_sha256"),
                claimed.blob("owner"),
                claimed.text("state"),
                claimed.millis("lease_until"),
                claimed.millis("created_at"),
                claimed.blob("response"),
            )
            else {
                return Ok(EXPIRING);
            };
            if digest != &body_digest[..] {
                return Ok(Claim::Conflict);
            }
            if state == "done" {
                return Ok(Claim::Done {
                    response: stored.to_vec(),
                });
            }
            if holder != me && lease_until > now {
                return Ok(Claim::Busy {
                    retry_after: Duration::from_millis((lease_until - now) as u64),
                });
            }
            let hold = Hold {
                key: key.to_string(),
                owner,
                expires_at: created + WINDOW_MS,
            };
            let marker = claimed.marker();
            let took = Lwt::read(
                self.exec(
                    "idempotency_take_over",
                    "take_over_key",
                    (
                        ttl_until(hold.expires_at, now),
                        me.clone(),
                        ts(now + lease_ms),
                        key,
                        holder.to_vec(),
                        state,
                    ),
                )
                .await?,
            )?;
            if !took.applied_for(&me) {
                // Another claim moved the key first: look again.
                continue;
            }
            return match (state, marker) {
                ("pending", _) => Ok(Claim::Owned(hold)),
                ("committing", Some(marker)) => Ok(Claim::TakenOver {
                    hold,
                    marker,
                    response: stored.to_vec(),
                }),
                (state, marker) => Err(corrupt(format!(
                    "idempotency key {key}: state {state:?} with marker {marker:?}"
                ))),
            };
        }
        Ok(EXPIRING)
    }

    async fn committing(&self, hold: &Hold, marker: &Marker) -> Result<bool> {
        self.holder_update("idempotency_committing", "committing_key", hold, |ttl| {
            vec![
                CqlValue::Int(ttl),
                CqlValue::Int(marker.position.partition as i32),
                CqlValue::BigInt(marker.position.offset as i64),
                CqlValue::Text(marker.writer.clone()),
            ]
        })
        .await
    }

    async fn done(&self, hold: &Hold) -> Result<bool> {
        self.holder_update("idempotency_done", "done_key", hold, |ttl| {
            vec![CqlValue::Int(ttl)]
        })
        .await
    }

    async fn release(&self, hold: &Hold) -> Result<()> {
        self.holder_update("idempotency_release", "release_key", hold, |ttl| {
            vec![CqlValue::Int(ttl), CqlValue::Timestamp(ts(0))]
        })
        .await
        .map(|_| ())
    }
}
