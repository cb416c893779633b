//! The ScyllaDB read store.
//!
//! - [`schema`]: the CQL schema (`schemas/cql/hindsight.cql`) and `migrate`.
//! - [`statements`]: every statement the backend prepares, as data.
//! - [`store`]: [`ScyllaStore`], implementing the read-store interfaces.
//!
//! No ScyllaDB node can run where this was written: the statements are
//! golden-tested, bind types are checked against the server at connect, and
//! the shared conformance suite runs against a node when
//! `HINDSIGHT_SCYLLA_NODES` is set.

pub mod schema;
pub mod statements;
pub mod store;

pub use store::{ScyllaConfig, ScyllaStore};
