//! Keyed batches: appended exactly once whichever ingest process takes a
//! retry, and whenever an attempt dies (`docs/design/idempotency.md`).
//!
//! Two mechanisms, each for what only it can do:
//! - the [`IdempotencyStore`] (CQL lightweight transactions across
//!   replicas) says who holds a key, for which body digest, and how far its
//!   attempt got;
//! - a Kafka transaction makes the batch visible all at once or never, and
//!   `init_transactions` under a producer's `transactional.id` fences that
//!   producer: its open transaction is aborted, or its commit completed if
//!   it had already asked for one.
//!
//! An attempt: **claim** the key → begin a transaction on one of this
//! process's transactional producers, send every record and a marker record
//! and wait until all are confirmed (**flush**) → **committing** (the
//! marker's position and the producer's `transactional.id`) →
//! `commit_transaction` → **done**. Only the holder of the key can mark
//! `committing`, and a transaction commits only after that; so an attempt
//! taken over before `committing` never commits (its transaction is aborted
//! by itself, or by the coordinator after `transaction.timeout.ms`, shorter
//! than the lease). An attempt taken over after `committing` may have
//! committed or may still: the new holder fences its producer and then
//! reads its marker with `read_committed` — Kafka's own verdict — instead of
//! guessing. So two attempts never both commit, and an attempt that
//! committed is never repeated.
//!
//! Producers are pooled ([`TxnPool`]): creating one and its
//! `init_transactions` cost 50–500 ms, a transaction on a live one a few
//! milliseconds. Each serves one append at a time, under an id unique to
//! this process (`{prefix}-ingest-{random}-{n}`); one that failed is
//! discarded, its transaction aborted.
//!
//! Every failure after the claim releases the key, so the client's retry
//! need not wait out the lease. The lease is three delivery timeouts (an
//! attempt's flush and commit each take at most one), the transaction
//! timeout two.

use crate::markers::{self, MarkerRecord};
use crate::producer::KafkaLog;
use hindsight_contracts::{
    AppendOutcome, Claim, Error, Hold, Idempotency, IdempotencyStore, Marker, Result,
};
use hindsight_schemas::Event;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// Most transactional producers one process keeps: keyed appends in flight
/// at once (more wait for one, up to a delivery timeout).
const POOL_SIZE: usize = 16;

fn fail(what: &str, e: KafkaError) -> Error {
    Error::unavailable("kafka", format!("{what}: {e}"))
}

async fn blocking<R: Send + 'static>(f: impl FnOnce() -> Result<R> + Send + 'static) -> Result<R> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::backend("kafka", format!("blocking task failed: {e}")))?
}

/// A producer under a `transactional.id`, initialized: every earlier
/// producer with that id is fenced, its transaction completed or aborted.
struct Txn {
    producer: Arc<FutureProducer>,
    id: String,
    timeout: Duration,
}

impl Txn {
    async fn init(log: &KafkaLog, id: String) -> Result<Txn> {
        let mut settings = KafkaLog::producer_settings(&log.config, log.delivery_timeout);
        settings.set("transactional.id", &id).set(
            "transaction.timeout.ms",
            (2 * log.delivery_timeout).as_millis().to_string(),
        );
        let producer: FutureProducer = settings
            .create()
            .map_err(|e| fail("transactional producer", e))?;
        let txn = Txn {
            producer: Arc::new(producer),
            id,
            timeout: log.delivery_timeout,
        };
        txn.run("init_transactions", |p, t| p.init_transactions(t))
            .await?;
        Ok(txn)
    }

    async fn run(
        &self,
        what: &'static str,
        op: impl FnOnce(&FutureProducer, Duration) -> rdkafka::error::KafkaResult<()> + Send + 'static,
    ) -> Result<()> {
        let (p, timeout) = (self.producer.clone(), self.timeout);
        blocking(move || op(&p, timeout).map_err(|e| fail(what, e))).await
    }

    /// Gives the producer up after a failure: its open transaction, if any,
    /// is aborted in the background.
    fn discard(self) {
        let (producer, timeout) = (self.producer.clone(), self.timeout);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || {
                let _ = producer.abort_transaction(timeout);
            });
        }
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

/// This process's transactional producers, each lent to one keyed append at
/// a time and kept for the next.
pub(crate) struct TxnPool {
    idle: Mutex<Vec<Txn>>,
    slots: Arc<Semaphore>,
    /// `{prefix}-ingest-{random}-`: no other process shares an id, so only
    /// a takeover of one of its attempts ever fences one of its producers.
    id_prefix: String,
    next: AtomicU64,
}

impl TxnPool {
    pub(crate) fn new(topic_prefix: &str) -> Result<TxnPool> {
        let mut random = [0u8; 8];
        getrandom::fill(&mut random)
            .map_err(|e| Error::backend("kafka", format!("no random producer ids: {e}")))?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        Ok(TxnPool {
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(POOL_SIZE)),
            id_prefix: format!("{topic_prefix}-ingest-{hex}-"),
            next: AtomicU64::new(0),
        })
    }

    /// A producer with a transaction begun: an idle one, or a new one.
    async fn lend(&self, log: &KafkaLog) -> Result<Lent<'_>> {
        let permit = tokio::time::timeout(log.delivery_timeout, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| {
                Error::unavailable(
                    "kafka",
                    format!("all {POOL_SIZE} transactional producers stayed busy"),
                )
            })?
            .map_err(|e| Error::backend("kafka", e.to_string()))?;
        let idle = self.idle.lock().unwrap().pop();
        let txn = match idle {
            Some(txn) => match txn.producer.begin_transaction() {
                Ok(()) => txn,
                // Fenced or failed while idle: a new one instead.
                Err(_) => {
                    txn.discard();
                    self.begun(log).await?
                }
            },
            None => self.begun(log).await?,
        };
        Ok(Lent {
            txn: Some(txn),
            pool: self,
            _permit: permit,
        })
    }

    async fn begun(&self, log: &KafkaLog) -> Result<Txn> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let txn = Txn::init(log, format!("{}{n}", self.id_prefix)).await?;
        txn.producer
            .begin_transaction()
            .map_err(|e| fail("begin_transaction", e))?;
        Ok(txn)
    }
}

/// A producer lent to one append: back to the pool after a clean end
/// ([`Lent::give_back`]), else discarded (also when the append's future is
/// dropped mid-way, as when its client goes away).
struct Lent<'a> {
    txn: Option<Txn>,
    pool: &'a TxnPool,
    _permit: OwnedSemaphorePermit,
}

impl Lent<'_> {
    fn txn(&self) -> &Txn {
        self.txn.as_ref().expect("a lent producer until given back")
    }

    fn give_back(mut self) {
        if let Some(txn) = self.txn.take() {
            self.pool.idle.lock().unwrap().push(txn);
        }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(txn) = self.txn.take() {
            txn.discard();
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
                &idem.body_digest,
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
        dead: Option<(Marker, Vec<u8>)>,
        events: &[Event],
        idem: &Idempotency,
        owner: u128,
    ) -> Result<AppendOutcome> {
        if let Some((marker, response)) = dead {
            if self.landed(&marker, &idem.key).await? {
                if !store.done(hold).await? {
                    tracing::warn!(key = %idem.key, "idempotency key taken over while resolving a committed attempt");
                }
                return Ok(AppendOutcome::Duplicate { response });
            }
        }
        let lent = self.txns.lend(self).await?;
        let outcome = self
            .transact(store, hold, lent.txn(), events, idem, owner)
            .await?;
        lent.give_back();
        Ok(outcome)
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
        let record = MarkerRecord {
            key: idem.key.clone(),
            body_digest: idem.body_digest,
            owner,
        };
        let position = self
            .send(&txn.producer, events, Some(&record))
            .await?
            .ok_or_else(|| Error::backend("kafka", "the marker record was not confirmed"))?;
        crash_point("after-flush");
        let marker = Marker {
            position,
            writer: txn.id.clone(),
        };
        if !store.committing(hold, &marker).await? {
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

    /// Whether a dead attempt's batch is in the log: fences its producer
    /// (its transaction is then committed or aborted for good), then reads
    /// its marker (see [`markers::landed`]).
    async fn landed(&self, marker: &Marker, key: &str) -> Result<bool> {
        drop(Txn::init(self, marker.writer.clone()).await?);
        let (config, key, at) = (self.config.clone(), key.to_string(), marker.position);
        let timeout = 2 * self.delivery_timeout;
        blocking(move || markers::landed(&config, at, &key, timeout)).await
    }
}
