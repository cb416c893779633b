//! The embedded backends: SQLite files in WAL mode under the data directory.
//! A peer adapter: it implements `hindsight-contracts` and nothing above
//! depends on it but the composition root.
//!
//! - `log.db`: the event log ([`SqliteLog`]). `synchronous=FULL`: an append
//!   returns after fsync, so an acknowledged batch survives power loss.
//! - `store.db`: the read store ([`SqliteStore`]). Buckets, catalog and the
//!   projector's consumed position commit in one transaction, so a crash
//!   anywhere neither loses nor double-counts an event. `synchronous=NORMAL`
//!   is enough here: a power loss can only roll back whole transactions, and
//!   the projector then re-reads those events from the log.
//! - `limits.db`: the rate-limit log of the API processes (`limits`).
//! - `accounts.db`: the dashboard's organizations, users, sign-in tokens,
//!   sessions, organizations' keys and per-key usage counts (`accounts`).
//!   `synchronous=NORMAL`, as `limits.db`: every API request counts here;
//!   a power loss may roll back the last transactions, never corrupt.
//! - `exports.db`: export jobs and their files in chunks (`exports`).
//!   `synchronous=FULL`: a job answered with `202` survives power loss.
//! - `idempotency.db`: claims of idempotency keys ([`IdempotencyFile`]) for
//!   an ingest process whose log is Kafka and that has no CQL store.
//!
//! Separate files rather than one so that ingest and the projector never wait on
//! each other's write lock. `limits.db`, `accounts.db` and `exports.db` are
//! created by their first use (`db::SideFile`): only the API's requests
//! touch them, not a `backfill`, `rebuild` or projector. Several processes
//! (`hindsight ingest`, `projector`, `api`) can share a data directory;
//! SQLite's locking keeps them consistent.

mod accounts;
mod bucketblock;
mod checkpoint;
mod db;
mod decimal;
mod exports;
mod head;
mod headmerge;
mod idempotency;
mod limits;
mod log;
mod rowcodec;
mod stamp;
mod store;
mod tickblock;

pub use idempotency::IdempotencyFile;
pub use log::{EmbeddedSource, SqliteConsumer, SqliteLog};
pub use store::{res_code, SqliteStore, SCHEMA_VERSION};

/// What goes wrong inside this adapter; converted to the contracts' error at
/// the trait boundary.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    #[error("{0}")]
    Corrupt(String),
    #[error("{0}")]
    Io(String),
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
/// What the contracts' methods return.
pub(crate) type CResult<T> = hindsight_contracts::Result<T>;

impl From<Error> for hindsight_contracts::Error {
    fn from(e: Error) -> Self {
        use rusqlite::ErrorCode::*;
        match e {
            Error::Corrupt(_) => hindsight_contracts::Error::corrupt("sqlite", e),
            Error::Sql(rusqlite::Error::SqliteFailure(f, _))
                if matches!(
                    f.code,
                    DatabaseBusy | DatabaseLocked | DiskFull | CannotOpen
                ) =>
            {
                hindsight_contracts::Error::unavailable("sqlite", e)
            }
            _ => hindsight_contracts::Error::backend("sqlite", e),
        }
    }
}
