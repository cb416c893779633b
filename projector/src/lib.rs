//! The projector: consumes the event log and keeps the read tables current.
//!
//! - [`rollup`]: the pure engine — folds events into bucket rows at every
//!   resolution, skipping events a row already holds.
//! - [`runner`]: the loop — poll the log, load the rows a batch touches, fold,
//!   write rows and consumed position together, commit.
//! - [`ticks`]: the tick-level record of each price tick, book snapshot and
//!   trade, written with the buckets.
//! - [`owners`]: which market each token is listed under, for the catalog
//!   rule (a tick under another market than its token's is not folded).

pub mod owners;
pub mod rollup;
pub mod runner;
pub mod ticks;

pub use rollup::Rollup;
pub use runner::{Projector, ProjectorConfig, StepStats};
