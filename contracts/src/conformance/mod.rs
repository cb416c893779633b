//! The conformance suite: every clause of the written contracts, as checks
//! each backend must pass.
//!
//! - [`store`]: [`crate::ProjectionStore`], [`crate::ReadStore`] and [`crate::AuthStore`]. Each
//!   check is `async fn(a, b, prefix) -> Result<(), String>`: two handles on
//!   one backend (two "clients", as two API replicas or a projector and an
//!   API would be) and a prefix for every id it writes, so checks can share
//!   one database or keyspace.
//! - [`log`]: [`crate::EventLog`], [`crate::ConsumerSource`] and [`crate::LogConsumer`]. Each
//!   check is `async fn(&LogFixture, prefix) -> Result<(), String>` on a log
//!   of its own.
//!
//! - [`exports`]: [`crate::ExportJobStore`], each check on a store of its
//!   own ([`ExportJobsPair`]).
//!
//! An adapter runs the suite by invoking [`crate::store_conformance!`] or
//! [`crate::log_conformance!`] inside a module named after the backend, which
//! expands to one `#[tokio::test]` per check, so the test output names each
//! check per backend (`test cql::catalog_token_list_is_replaced ... ok`):
//!
//! ```text
//! mod sqlite {
//!     hindsight_contracts::store_conformance!(super::backend);
//! }
//! // where: async fn backend(scope: Scope) -> StorePair
//! ```
//!
//! A check returns `Err` with what differs from the contract; a backend
//! that cannot be reached fails the test rather than skipping it.

pub mod accounts;
pub mod exports;
pub mod idempotency;
pub mod log;
pub mod store;
pub mod ticks;

use crate::{ConsumerSource, Error, EventLog, ExportJobStore, IdempotencyStore, ProjectionStore};
use std::any::Any;
use std::sync::Arc;

pub use crate::store::Store as Backend;

/// What a check returns: `Err` says which clause failed and how.
pub type Check = Result<(), String>;

pub(crate) fn ensure(cond: bool, what: impl FnOnce() -> String) -> Check {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

pub(crate) fn store_err(e: Error) -> String {
    format!("backend error: {e}")
}

/// 2025-09-01T00:00:00Z: the time every check's data starts at.
pub const T0: i64 = 1_756_684_800_000;

/// Whether a check may share its database with the other checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Writes only ids under its prefix: may share a database (keyspace)
    /// with every other shared check, running at the same time.
    Shared,
    /// Affects the whole store (`reset`): needs a database of its own.
    Exclusive,
}

/// Two handles on one store backend, and whatever must live as long as they
/// do (a temporary directory).
pub struct StorePair {
    pub a: Arc<dyn Backend>,
    pub b: Arc<dyn Backend>,
    pub keep: Box<dyn Any + Send + Sync>,
}

/// A log of its own for one log check.
pub struct LogFixture {
    pub log: Arc<dyn EventLog>,
    /// Opens consumers of one group (a new one resumes after the positions
    /// recorded as the projector records them, see [`log::record_consumed`]).
    pub source: Arc<dyn ConsumerSource>,
    /// The read store the projector writes consumed positions to, in the
    /// same step as its rows (the embedded log resumes from it; Kafka from
    /// its group's committed offsets).
    pub store: Arc<dyn ProjectionStore>,
    pub keep: Box<dyn Any + Send + Sync>,
}

/// Two handles on one idempotency store, and whatever must live as long as
/// they do.
pub struct IdempotencyPair {
    pub a: Arc<dyn IdempotencyStore>,
    pub b: Arc<dyn IdempotencyStore>,
    pub keep: Box<dyn Any + Send + Sync>,
}

/// Two handles on one export job store of the check's own (a claim takes
/// any job of the store), and whatever must live as long as they do.
pub struct ExportJobsPair {
    pub a: Arc<dyn ExportJobStore>,
    pub b: Arc<dyn ExportJobStore>,
    pub keep: Box<dyn Any + Send + Sync>,
}

/// A prefix for a check's ids, unique to this process and check.
pub fn prefix(check: &str) -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{check}-{}-{nanos}", std::process::id())
}

/// One `#[tokio::test]` per store check. `$make` is a path to
/// `async fn(Scope) -> StorePair`; invoke inside a module named after the
/// backend.
#[macro_export]
macro_rules! store_conformance {
    ($make:path) => {
        $crate::__conformance_tests!(store, $make;
            bucket_round_trips: Shared,
            candles_round_trip_with_their_price_rows: Shared,
            counts_are_the_rows_a_range_holds: Shared,
            ranges_ordering_and_paging: Shared,
            sparse_ranges_over_decades_cost_what_their_rows_cost: Shared,
            large_writes_round_trip: Shared,
            ticks_round_trip_in_key_order_and_page: Shared,
            tick_counts_are_the_ticks_a_span_holds: Shared,
            trade_ids_count_once_whatever_write_they_come_in: Shared,
            trade_totals_sum_the_deduplicated_trades_per_bucket: Shared,
            book_at_is_the_latest_snapshot_at_or_before: Shared,
            rows_are_whole_and_last_applied_wins: Shared,
            frontiers_bound_every_stored_bucket: Shared,
            version_moves_with_every_committed_write: Shared,
            committed_positions_per_partition: Shared,
            positions_never_advance_past_unwritten_rows: Shared,
            catalog_newest_version_wins_whatever_arrival_order: Shared,
            catalog_token_list_is_replaced: Shared,
            catalog_first_market_keeps_its_tokens_and_slug: Shared,
            catalog_replay_decides_nothing_again: Shared,
            catalog_slug_change_moves_the_lookup: Shared,
            catalog_series_and_events_are_stored_and_listed: Shared,
            catalog_changes_after_a_cursor: Shared,
            reset_drops_rows_ticks_catalog_and_positions: Exclusive,
            keys_found_by_hash_and_revocation_sticks: Shared,
            rate_limit_decisions_are_the_sliding_window: Shared,
            rate_limit_holds_under_concurrent_handles: Shared,
            accounts_round_trip_and_replace: Shared,
            sign_in_tokens_are_taken_exactly_once: Shared,
            sessions_live_until_deleted: Shared,
            usage_counts_add_up_across_handles: Shared,
        );
    };
}

/// One `#[tokio::test]` per log check. `$make` is a path to
/// `async fn(prefix: &str) -> LogFixture` giving a log of its own.
#[macro_export]
macro_rules! log_conformance {
    ($make:path) => {
        $crate::__conformance_tests!(log, $make;
            log_delivers_every_event_once_in_order_per_key,
            log_positions_are_dense_per_partition,
            log_commit_then_reopen_resumes_after_committed,
            log_idempotency_key_appends_once,
            log_idempotency_key_with_another_body_conflicts,
            log_a_key_recorded_with_a_sha256_digest_answers_its_retries,
            log_lag_reaches_zero,
            log_assignment_changed_at_most_once_for_a_lone_consumer,
        );
    };
}

/// One `#[tokio::test]` per idempotency store check. `$make` is a path to
/// `async fn(prefix: &str) -> IdempotencyPair`.
#[macro_export]
macro_rules! idempotency_conformance {
    ($make:path) => {
        $crate::__conformance_tests!(idempotency, $make;
            idempotency_concurrent_claims_grant_exactly_one_owner,
            idempotency_another_body_conflicts_in_every_state,
            idempotency_an_expired_lease_is_taken_over_and_the_old_holder_is_ignored,
            idempotency_a_committing_holder_is_taken_over_with_its_marker,
            idempotency_release_lets_the_next_claim_take_over_at_once,
            idempotency_a_repeated_claim_of_the_same_owner_is_granted_again,
        );
    };
}

/// One `#[tokio::test]` per export job store check. `$make` is a path to
/// `async fn(prefix: &str) -> ExportJobsPair` giving a store of its own.
#[macro_export]
macro_rules! export_jobs_conformance {
    ($make:path) => {
        $crate::__conformance_tests!(exports, $make;
            export_jobs_round_trip_and_list_newest_first,
            export_job_claims_are_exclusive_and_oldest_first,
            export_job_an_expired_lease_is_reclaimed_and_the_old_holder_is_fenced,
            export_job_chunks_round_trip_and_replace,
            export_job_failure_is_recorded_and_final,
            export_jobs_expire_with_their_chunks,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    (store, $make:path; $($check:ident: $scope:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let pair = $make($crate::conformance::Scope::$scope).await;
                let prefix = $crate::conformance::prefix(stringify!($check));
                if let Err(e) = $crate::conformance::store::$check(
                    pair.a.as_ref(),
                    pair.b.as_ref(),
                    &prefix,
                )
                .await
                {
                    panic!("{} does not hold: {}", stringify!($check), e);
                }
            }
        )*
    };
    (log, $make:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let prefix = $crate::conformance::prefix(stringify!($check));
                let fixture = $make(&prefix).await;
                if let Err(e) = $crate::conformance::log::$check(&fixture, &prefix).await {
                    panic!("{} does not hold: {}", stringify!($check), e);
                }
            }
        )*
    };
    (exports, $make:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let prefix = $crate::conformance::prefix(stringify!($check));
                let pair = $make(&prefix).await;
                if let Err(e) = $crate::conformance::exports::$check(&pair, &prefix).await {
                    panic!("{} does not hold: {}", stringify!($check), e);
                }
            }
        )*
    };
    (idempotency, $make:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let prefix = $crate::conformance::prefix(stringify!($check));
                let pair = $make(&prefix).await;
                if let Err(e) = $crate::conformance::idempotency::$check(&pair, &prefix).await {
                    panic!("{} does not hold: {}", stringify!($check), e);
                }
            }
        )*
    };
}
