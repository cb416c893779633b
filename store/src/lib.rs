//! The two narrow interfaces every backend implements, and the embedded one.
//!
//! - [`log`]: the event log — append durably (ingest), consume in order
//!   (projector). Kafka in the distributed deployment.
//! - [`read`]: the read store — bucket rows and catalog written by the
//!   projector together with the log position they derive from, and read by
//!   the API. ScyllaDB in the distributed deployment.
//! - [`sqlite`]: both, on local SQLite files: the embedded default.
//!
//! Everything above these traits (validation, rollups, API, auth) is written
//! once and does not know which backend it runs on.

pub mod conformance;
pub mod log;
pub mod read;
pub mod sqlite;

pub use log::{Delivered, EventLog, LogConsumer, Position};
pub use read::{ReadStore, Row, RowKey, RowValue, Table};

/// A backend failure. Its text is for logs and operators, never for API
/// clients (the API answers 500 "failed to fetch data").
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
