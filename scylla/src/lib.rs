//! The CQL read store: ScyllaDB in production, Apache Cassandra 5.0 in
//! tests (the same protocol and data model; the `scylla` driver's own CI
//! runs against both).
//!
//! - [`schema`]: the CQL schema (`schemas/cql/hindsight.cql`) and `migrate`.
//! - [`statements`]: every statement the backend prepares, as data.
//! - [`store`]: [`ScyllaStore`], implementing the read-store interfaces.
//! - [`accounts`]: the same store as the dashboard's `AccountStore`.
//! - [`exports`]: the same store as the API's `ExportJobStore` (export
//!   jobs and their files in chunks).
//! - [`idempotency`]: the same store as ingest's `IdempotencyStore` in Kafka
//!   mode (`idempotency_keys`, lightweight transactions).
//!
//! Verified against Apache Cassandra 5.0 (one node, `scripts/engines.sh`):
//! `migrate` creates the schema and is a no-op the second time; every
//! statement prepares with the bind types declared in [`statements`]; the
//! shared store conformance suite passes, one test per check
//! (`tests/conformance.rs`, which fails rather than skips without
//! `HINDSIGHT_SCYLLA_NODES`). That covers whole-row writes, positions
//! written last, catalog versions, slug and token replacement, the change
//! feed after a cursor, `reset`, keys and the rate-limit log (its bound
//! under concurrent handles included), and a
//! 2 400-row write with 400 rows of ~2 KiB in one partition.
//!
//! What only ScyllaDB itself could confirm (it cannot run here):
//! - Batch size limits: the store sends unlogged batches of at most 100
//!   rows, each within one partition. Cassandra exempts single-partition
//!   batches from `batch_size_fail_threshold` (50 KiB by default); ScyllaDB
//!   has the same thresholds and is expected to, but that is untested.
//! - Lightweight transactions: only ingest's idempotency keys use them
//!   (catalog versions are compared by the single projector owning a log
//!   partition). Cassandra answers a failed condition with `[applied]` and
//!   the checked columns, ScyllaDB always with the row; [`idempotency`]
//!   reads columns by name, so either shape works, but only Cassandra's is
//!   tested.
//! - Timeouts: per-request timeouts are the driver's (`request_timeout`);
//!   ScyllaDB's `USING TIMEOUT` is not used, Cassandra would refuse it.
//! - Shard-aware routing is ScyllaDB's; on Cassandra the driver routes by
//!   token only. Performance figures from Cassandra say nothing of ScyllaDB.

pub mod accounts;
pub mod exports;
pub mod idempotency;
pub mod schema;
pub mod statements;
pub mod store;

pub use store::{ScyllaConfig, ScyllaStore};
