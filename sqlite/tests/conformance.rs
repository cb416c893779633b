//! The embedded backends pass the shared conformance suites: the read store
//! (`store.db`, `limits.db`), the export jobs (`exports.db`), the event log (`log.db`) and the idempotency
//! claims of Kafka's ingest without CQL (`idempotency.db`), one test per
//! check.

use hindsight_contracts::conformance::{
    Backend, ExportJobsPair, IdempotencyPair, LogFixture, Scope, StorePair,
};
use hindsight_contracts::{
    ConsumerSource, EventLog, ExportJobStore, IdempotencyStore, ProjectionStore,
};
use hindsight_sqlite::{EmbeddedSource, IdempotencyFile, SqliteLog, SqliteStore};
use std::sync::Arc;

/// Two handles on one data directory: two processes' worth of clients. A
/// directory per check, so every scope is exclusive.
async fn store(_: Scope) -> StorePair {
    let dir = tempfile::tempdir().expect("temporary directory");
    let a: Arc<dyn Backend> = Arc::new(SqliteStore::open(dir.path()).expect("open store"));
    let b: Arc<dyn Backend> = Arc::new(SqliteStore::open(dir.path()).expect("open store"));
    StorePair {
        a,
        b,
        keep: Box::new(dir),
    }
}

/// The embedded log resumes from the position the read store holds.
async fn log(_prefix: &str) -> LogFixture {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = Arc::new(SqliteLog::open(dir.path()).expect("open log"));
    let store: Arc<dyn ProjectionStore> =
        Arc::new(SqliteStore::open(dir.path()).expect("open store"));
    let source: Arc<dyn ConsumerSource> = Arc::new(EmbeddedSource {
        log: log.clone(),
        store: store.clone(),
    });
    LogFixture {
        log: log as Arc<dyn EventLog>,
        source,
        store,
        keep: Box::new(dir),
    }
}

/// Two handles on one `idempotency.db`: two ingest processes sharing a
/// data directory.
async fn idempotency(_prefix: &str) -> IdempotencyPair {
    let dir = tempfile::tempdir().expect("temporary directory");
    let open = || -> Arc<dyn IdempotencyStore> {
        Arc::new(IdempotencyFile::open(dir.path()).expect("open idempotency file"))
    };
    IdempotencyPair {
        a: open(),
        b: open(),
        keep: Box::new(dir),
    }
}

/// Two handles on one `exports.db`: two API processes sharing a data
/// directory.
async fn export_jobs(_prefix: &str) -> ExportJobsPair {
    let dir = tempfile::tempdir().expect("temporary directory");
    let open = || -> Arc<dyn ExportJobStore> {
        Arc::new(SqliteStore::open(dir.path()).expect("open store"))
    };
    ExportJobsPair {
        a: open(),
        b: open(),
        keep: Box::new(dir),
    }
}

mod sqlite {
    hindsight_contracts::store_conformance!(super::store);
    hindsight_contracts::log_conformance!(super::log);
    hindsight_contracts::idempotency_conformance!(super::idempotency);
    hindsight_contracts::export_jobs_conformance!(super::export_jobs);
}
