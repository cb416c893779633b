//! Keyed batches: appended exactly once whichever ingest process takes a
//! retry, and whenever an attempt dies (`docs/design/idempotency.md`).
//!
//! Two mechanisms, each for what only it can do:
//! - the [`IdempotencyStore`] (CQL lightweight transactions across
//!   replicas) says who holds a key, for which body digest, and how far its
//!   attempt got;
//! - a Kafka transaction under a `transactional.id` derived from the key
//!   makes the batch visible all at once or never, and a new attempt's
//!   `init_transactions` fences every earlier one: its open transaction is
//!   aborted, or its commit completed if it had already asked for one.
//!
//! An attempt: **claim** the key → `init_transactions`, send every record
//! and a marker record in one transaction and wait until all are confirmed
//! (**flush**) → **committing**(marker position) → `commit_transaction` →
//! **done**. Only the holder of the key can mark `committing`, and a
//! transaction commits only after that; a takeover (after the holder's
//! lease) fences the holder before it appends; and a retry that finds a
//! dead attempt `committing` reads that attempt's marker with
//! `read_committed` — Kafka's own verdict — instead of guessing. So two
//! attempts never both commit, and an attempt that committed is never
//! repeated.
//!
//! Every failure after the claim aborts the transaction and releases the
//! key, so the client's retry need not wait out the lease. The lease is
//! three delivery timeouts (an attempt's init, flush and commit each take at
//! most one), the transaction timeout two: a hung attempt's transaction is
//! aborted by the coordinator about when its lease ends.

use crate::markers::{self, Marker};
use crate::producer::KafkaLog;
use hindsight_contracts::{
    AppendOutcome, Claim, Error, Hold, Idempotency, IdempotencyStore, Position, Result,
};
use hindsight_schemas::Event;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// **Test only.** Names a point of the keyed append at which the process
/// aborts (as if SIGKILLed there): `after-claim`, `after-flush`,
/// `after-committing` or `after-commit`. The distributed fault tests set it
/// on one ingest replica; nothing else should.
pub const FAULT_ENV: &str = "HINDSIGHT_FAULT_ABORT_AT";

/// Aborts the process when [`FAULT_ENV`] names `point`.
fn crash_point(point: &str) {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    if AT.get_or_init(|| std::env::var(FAULT_ENV).ok()).as_deref() == Some(point) {
        eprintln!("{FAULT_ENV}={point}: aborting the process here (test-only fault hook)");
        std::process::abort();
    }
}

fn fail(what: &str, e: KafkaError) -> Error {
    Error::unavailable("kafka", format!("{what}: {e}"))
}

async fn blocking<R: Send + 'static>(f: impl FnOnce() -> Result<R> + Send + 'static) -> Result<R> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::backend("kafka", format!("blocking task failed: {e}")))?
}

/// A producer under a key's transactional id, initialized: every earlier
/// producer with that id is fenced, its transaction completed or aborted.
struct Txn {
    producer: Arc<FutureProducer>,
    timeout: Duration,
}

impl Txn {
    async fn init(log: &KafkaLog, key: &str) -> Result<Txn> {
        let mut settings = KafkaLog::producer_settings(&log.config, log.delivery_timeout);
        settings
            .set(
                "transactional.id",
                markers::transactional_id(&log.config, key),
            )
            .set(
                "transaction.timeout.ms",
                (2 * log.delivery_timeout).as_millis().to_string(),
            );
        let producer: FutureProducer = settings
            .create()
            .map_err(|e| fail("transactional producer", e))?;
        let producer = Arc::new(producer);
        let timeout = log.delivery_timeout;
        let p = producer.clone();
        blocking(move || {
            p.init_transactions(timeout)
                .map_err(|e| fail("init_transactions", e))
        })
        .await?;
        Ok(Txn { producer, timeout })
    }

    async fn run(
        &self,
        what: &'static str,
        op: impl FnOnce(&FutureProducer, Duration) -> rdkafka::error::KafkaResult<()> + Send + 'static,
    ) -> Result<()> {
        let (p, timeout) = (self.producer.clone(), self.timeout);
        blocking(move || op(&p, timeout).map_err(|e| fail(what, e))).await
    }
}

impl Drop for Txn {
    /// Destroying a librdkafka handle joins its threads: off the runtime.
    fn drop(&mut self) {
        let producer = self.producer.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || drop(producer));
        }
    }
}

/// A fresh owner id for one attempt.
fn new_owner() -> Result<u128> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::backend("kafka", format!("no random owner id: {e}")))?;
    Ok(u128::from_be_bytes(bytes))
}

impl KafkaLog {
    /// How long an attempt holds its key before a retry may take it over.
    fn lease(&self) -> Duration {
        3 * self.delivery_timeout
    }

    pub(crate) async fn append_keyed(
        &self,
        store: &dyn IdempotencyStore,
        events: &[Event],
        idem: &Idempotency,
    ) -> Result<AppendOutcome> {
        let owner = new_owner()?;
        let claim = store
            .claim(
                &idem.key,
                &idem.body_sha256,
                owner,
                &idem.response,
                self.lease(),
            )
            .await?;
        let (hold, dead) = match claim {
            Claim::Done { response } => return Ok(AppendOutcome::Duplicate { response }),
            Claim::Conflict => return Ok(AppendOutcome::Conflict),
            Claim::Busy { retry_after } => return Ok(AppendOutcome::Busy { retry_after }),
            Claim::Owned(hold) => {
                crash_point("after-claim");
                (hold, None)
            }
            Claim::TakenOver {
                hold,
                marker,
                response,
            } => (hold, Some((marker, response))),
        };
        let attempt = self.attempt(store, &hold, dead, events, idem, owner).await;
        if attempt.is_err() {
            if let Err(e) = store.release(&hold).await {
                tracing::warn!(key = %idem.key, error = %e, "cannot release an idempotency key after a failed append; its lease runs out instead");
            }
        }
        attempt
    }

    /// Everything after the claim. `dead`: the marker and response of a
    /// taken-over attempt that had reached `committing`.
    async fn attempt(
        &self,
        store: &dyn IdempotencyStore,
        hold: &Hold,
        dead: Option<(Position, Vec<u8>)>,
        events: &[Event],
        idem: &Idempotency,
        owner: u128,
    ) -> Result<AppendOutcome> {
        // Fences every earlier attempt at this key first.
        let txn = Txn::init(self, &idem.key).await?;
        if let Some((marker, response)) = dead {
            if self.landed(marker, &idem.key).await? {
                if !store.done(hold).await? {
                    tracing::warn!(key = %idem.key, "idempotency key taken over while resolving a committed attempt");
                }
                return Ok(AppendOutcome::Duplicate { response });
            }
        }
        txn.run("begin_transaction", |p, _| p.begin_transaction())
            .await?;
        let transacted = self.transact(store, hold, &txn, events, idem, owner).await;
        if transacted.is_err() {
            // Best effort: a transaction left open is aborted by the next
            // attempt's fencing or the transaction timeout anyway.
            let _ = txn
                .run("abort_transaction", |p, t| p.abort_transaction(t))
                .await;
        }
        transacted
    }

    async fn transact(
        &self,
        store: &dyn IdempotencyStore,
        hold: &Hold,
        txn: &Txn,
        events: &[Event],
        idem: &Idempotency,
        owner: u128,
    ) -> Result<AppendOutcome> {
        let marker = Marker {
            key: idem.key.clone(),
            body_sha256: idem.body_sha256,
            owner,
        };
        let at = self
            .send(&txn.producer, events, Some(&marker))
            .await?
            .ok_or_else(|| Error::backend("kafka", "the marker record was not confirmed"))?;
        crash_point("after-flush");
        if !store.committing(hold, at).await? {
            return Err(Error::unavailable(
                "kafka",
                format!(
                    "Idempotency-Key {} was taken over by another attempt during this append",
                    idem.key
                ),
            ));
        }
        crash_point("after-committing");
        txn.run("commit_transaction", |p, t| p.commit_transaction(t))
            .await?;
        crash_point("after-commit");
        // The batch is visible: acknowledged whatever `done` says. Left at
        // `committing`, the key is resolved from the marker by a retry.
        match store.done(hold).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(key = %idem.key, "idempotency key taken over after its batch committed")
            }
            Err(e) => {
                tracing::warn!(key = %idem.key, error = %e, "cannot mark an appended idempotency key done")
            }
        }
        Ok(AppendOutcome::Appended {
            count: events.len(),
        })
    }

    /// Whether a dead attempt's marker is committed (see [`markers::landed`]).
    async fn landed(&self, marker: Position, key: &str) -> Result<bool> {
        let (config, key, timeout) = (
            self.config.clone(),
            key.to_string(),
            2 * self.delivery_timeout,
        );
        blocking(move || markers::landed(&config, marker, &key, timeout)).await
    }
}
