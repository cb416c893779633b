//! The contracts between Hindsight's services and its backends.
//!
//! Services (`ingest`, `projector`, `api`) are written against these traits
//! only; each backend is a peer adapter crate that implements them:
//!
//! | contract | embedded (`hindsight-sqlite`) | distributed |
//! | --- | --- | --- |
//! | [`EventLog`], [`LogConsumer`], [`ConsumerSource`] | `log.db` | Kafka (`hindsight-kafka`) |
//! | [`IdempotencyStore`] | `log.db` (atomic with the append) | CQL (`idempotency_keys`, lightweight transactions); `idempotency.db` for one ingest process without CQL |
//! | [`ProjectionStore`], [`ReadStore`] | `store.db` | CQL (`hindsight-scylla`) |
//! | [`AuthStore`] | `store.db`, `limits.db` | CQL |
//! | [`AccountStore`] | `accounts.db` | CQL |
//! | [`ExportJobStore`] | `exports.db` | CQL |
//!
//! Every trait states its contract on itself: what a caller may rely on,
//! whichever backend answers. `docs/contracts.md` is the same in prose, and
//! the [`conformance`] suite (feature `conformance`) checks each clause
//! against every backend the machine can start, one test per check. The
//! [`faults`] wrappers (feature `faults`) fail a log append or a store write
//! at a chosen step, for deterministic crash tests.

pub mod accounts;
pub mod auth;
pub mod error;
pub mod exports;
pub mod log;
pub mod prefetch;
pub mod store;

#[cfg(feature = "conformance")]
pub mod conformance;

#[cfg(feature = "faults")]
pub mod faults;

pub use accounts::{
    AccountStore, KeyUsage, KeyUse, OrgKey, Organization, Session, SignInToken, StatusClass,
    UsageCount, User,
};
pub use auth::{ApiKeyRecord, AuthStore, RateHits};
pub use error::{Error, ErrorKind, Result};
pub use exports::{ExportJob, ExportJobStore, JobStatus};
pub use log::{
    append_body, AppendBatch, AppendOutcome, Claim, ConsumerSource, Delivered, EventLog, Hold,
    Idempotency, IdempotencyStore, LogConsumer, Marker, Position,
};
pub use store::{
    Applied, BookPoint, Candle, CandlePoint, CatalogCursor, Frontiers, Mark, MetricsPoint,
    PricePoint, ProjectionStore, ProjectionWrite, Range, ReadStore, Refused, Row, RowKey, RowValue,
    Series, Store, Table, Tick, TickKey, TickKind, TickRange, TickValue, TokenRef, TradeTotals,
    TRADE_TOTALS_PAGE,
};
