//! Failure-injecting wrappers around a log and a store (feature `faults`),
//! for deterministic crash tests: the same failure at the same step on
//! every run, where a SIGKILL lands wherever the scheduler puts it.
//!
//! Each wrapper counts the calls it forwards and fails exactly one of them,
//! as the real backend can: an append that does not happen, an apply that
//! writes nothing, or an apply cut between its rows and its positions (the
//! CQL store writes rows, then catalog, then positions; a crash can fall
//! between them). A test then drops the wrapped service, as a crash would,
//! and restarts a fresh one on the inner backend.

use crate::{
    AppendBatch, AppendOutcome, Applied, Error, EventLog, Frontiers, Position, ProjectionStore,
    ProjectionWrite, Result, Row, RowKey, Series, TokenRef,
};
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};

fn injected(what: String) -> Error {
    Error::unavailable("faults", what)
}

/// Which `append` fails, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFault {
    /// The `n`th append (1-based) appends nothing and fails.
    FailAppend(u64),
    /// The `n`th append is durable, then fails: the acknowledgement is lost
    /// and the caller hears an error for events the log holds.
    LoseAck(u64),
}

/// An [`EventLog`] that fails one `append` as `fault` says; every other
/// call goes to the inner log.
pub struct FaultyLog<L> {
    inner: L,
    fault: LogFault,
    calls: AtomicU64,
}

impl<L: EventLog> FaultyLog<L> {
    pub fn new(inner: L, fault: LogFault) -> Self {
        FaultyLog {
            inner,
            fault,
            calls: AtomicU64::new(0),
        }
    }

    /// Appends forwarded or failed so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl<L: EventLog> EventLog for FaultyLog<L> {
    async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        match self.fault {
            LogFault::FailAppend(n) if n == call => {
                Err(injected(format!("append {call} failed (injected)")))
            }
            LogFault::LoseAck(n) if n == call => {
                self.inner.append(batch).await?;
                Err(injected(format!(
                    "append {call} is durable but its acknowledgement was lost (injected)"
                )))
            }
            _ => self.inner.append(batch).await,
        }
    }

    async fn ready(&self) -> Result<()> {
        self.inner.ready().await
    }
}

/// Which `apply` fails, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFault {
    /// The `n`th apply (1-based) writes nothing and fails.
    FailApply(u64),
    /// The `n`th apply writes its rows and catalog records, then fails
    /// before its consumed positions: a crash between rows and positions.
    CrashBeforePositions(u64),
}

/// A [`ProjectionStore`] that fails one `apply` as `fault` says; every
/// other call goes to the inner store. It counts applies and the tokens
/// looked up.
pub struct FaultyStore<S> {
    inner: S,
    fault: StoreFault,
    applies: AtomicU64,
    tokens_looked_up: AtomicU64,
}

impl<S: ProjectionStore> FaultyStore<S> {
    pub fn new(inner: S, fault: StoreFault) -> Self {
        FaultyStore {
            inner,
            fault,
            applies: AtomicU64::new(0),
            tokens_looked_up: AtomicU64::new(0),
        }
    }

    /// Applies forwarded or failed so far.
    pub fn applies(&self) -> u64 {
        self.applies.load(Ordering::SeqCst)
    }

    /// Token ids asked of `lookup_tokens` so far.
    pub fn tokens_looked_up(&self) -> u64 {
        self.tokens_looked_up.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl<S: ProjectionStore> ProjectionStore for FaultyStore<S> {
    async fn committed(&self) -> Result<Vec<Position>> {
        self.inner.committed().await
    }

    async fn load(&self, keys: Vec<RowKey>) -> Result<Vec<Row>> {
        self.inner.load(keys).await
    }

    async fn frontiers(&self, series: Vec<Series>) -> Result<Vec<Frontiers>> {
        self.inner.frontiers(series).await
    }

    async fn lookup_tokens(&self, token_ids: Vec<String>) -> Result<Vec<TokenRef>> {
        self.tokens_looked_up
            .fetch_add(token_ids.len() as u64, Ordering::SeqCst);
        self.inner.lookup_tokens(token_ids).await
    }

    async fn apply(&self, write: ProjectionWrite) -> Result<Applied> {
        let call = self.applies.fetch_add(1, Ordering::SeqCst) + 1;
        match self.fault {
            StoreFault::FailApply(n) if n == call => {
                Err(injected(format!("apply {call} failed (injected)")))
            }
            StoreFault::CrashBeforePositions(n) if n == call => {
                self.inner
                    .apply(ProjectionWrite {
                        rows: write.rows,
                        catalog: write.catalog,
                        ticks: write.ticks,
                        consumed: Vec::new(),
                    })
                    .await?;
                Err(injected(format!(
                    "apply {call} stopped between rows and positions (injected)"
                )))
            }
            _ => self.inner.apply(write).await,
        }
    }

    async fn reset(&self) -> Result<()> {
        self.inner.reset().await
    }
}
