//! Every internal metric Hindsight emits, defined in one place.
//!
//! Services record through the `metrics` facade using the constants below;
//! [`install`] registers the Prometheus recorder and describes each metric so
//! `/metrics` carries `# HELP` and `# TYPE` lines. To add a metric, add a
//! constant and a line in [`DESCRIPTIONS`] — nowhere else.

use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

// ---- ingest -----------------------------------------------------------------
/// Events appended to the log, by `kind`.
pub const INGEST_EVENTS_ACCEPTED: &str = "hindsight_ingest_events_accepted_total";
/// Lines refused by validation, by `reason`: the reject's kind
/// (`hindsight_schemas::wire::RejectKind::label`), never the full text.
pub const INGEST_EVENTS_REJECTED: &str = "hindsight_ingest_events_rejected_total";
/// Lines per HTTP batch.
pub const INGEST_BATCH_LINES: &str = "hindsight_ingest_batch_lines";
/// Wall time of one HTTP batch, from body read to response.
pub const INGEST_BATCH_SECONDS: &str = "hindsight_ingest_batch_duration_seconds";
/// Time for the log to durably accept one append.
pub const LOG_APPEND_SECONDS: &str = "hindsight_log_append_duration_seconds";
/// Batches answered from the idempotency table instead of being appended.
pub const INGEST_IDEMPOTENT_REPLAYS: &str = "hindsight_ingest_idempotent_replays_total";
/// Ingest HTTP responses by `status`.
pub const INGEST_RESPONSES: &str = "hindsight_ingest_responses_total";

// ---- projector --------------------------------------------------------------
/// Events folded into buckets, by `kind`.
pub const PROJECTOR_EVENTS_APPLIED: &str = "hindsight_projector_events_applied_total";
/// Events skipped because their bucket row already holds them (replays).
pub const PROJECTOR_REPLAYS_SKIPPED: &str = "hindsight_projector_replays_skipped_total";
/// Bucket rows written, by `table` (prices, metrics, books).
pub const PROJECTOR_ROWS_WRITTEN: &str = "hindsight_projector_rows_written_total";
/// Time to make one batch of buckets durable (with its log position).
pub const PROJECTOR_FLUSH_SECONDS: &str = "hindsight_projector_flush_duration_seconds";
/// Time a projector step spends in each of its own stages, by `stage`:
/// `poll` (reading a batch off the log), `fold` (folding a segment into
/// rows, with the rows it loads), `wait` (until the previous segment's
/// write is durable and this one can be handed to the store, folding into
/// it what the log gains meanwhile). The write itself is the store's
/// `apply` (`hindsight_store_query_duration_seconds`).
pub const PROJECTOR_STEP_SECONDS: &str = "hindsight_projector_step_stage_duration_seconds";
/// Next log position the projector will read, by `partition`.
pub const PROJECTOR_POSITION: &str = "hindsight_projector_position";
/// Events in the log not yet projected, by `partition`.
pub const PROJECTOR_LAG: &str = "hindsight_projector_lag_events";
/// Log records that could not be decoded (skipped and counted, never silent).
pub const PROJECTOR_DECODE_ERRORS: &str = "hindsight_projector_decode_errors_total";
/// Events consumed but not folded by the catalog rule
/// (`hindsight_schemas::claims`), by `reason`: `market_mismatch` (a tick or
/// snapshot whose token the catalog lists under another market),
/// `token_claimed`, `slug_taken` (a market version the store refused). Each
/// is also logged with its log position.
pub const PROJECTOR_NOT_FOLDED: &str = "hindsight_projector_events_not_folded_total";

/// Events sent to the log and not yet confirmed (Kafka).
pub const INGEST_IN_FLIGHT: &str = "hindsight_ingest_in_flight_events";
/// Records the broker did not confirm (Kafka), by `reason`.
pub const KAFKA_DELIVERY_ERRORS: &str = "hindsight_kafka_delivery_errors_total";
/// Batches refused because the in-flight budget was exhausted (answered 503).
pub const INGEST_BACKPRESSURE: &str = "hindsight_ingest_backpressure_total";

// ---- log ----------------------------------------------------------------------
/// Position of the newest event in the log (its head), by `partition`.
pub const LOG_HEAD: &str = "hindsight_log_head_position";

// ---- http (the serving loop of every listener) --------------------------------
/// Connections open on a listener, by `listener` (the service's name, or
/// `ops`).
pub const HTTP_OPEN_CONNECTIONS: &str = "hindsight_http_open_connections";
/// The most connections a listener serves at once, by `listener`; beyond
/// it, new connections wait in the kernel's accept queue.
pub const HTTP_MAX_CONNECTIONS: &str = "hindsight_http_max_connections";
/// Connections and requests cut short by the serving loop's bounds, by
/// `listener` and `bound`: `header` (a request head did not arrive in
/// time: the connection is closed), `idle` (nothing moved: closed),
/// `request` (no answer in time: answered 408).
pub const HTTP_TIMEOUTS: &str = "hindsight_http_timeouts_total";

// ---- api ----------------------------------------------------------------------
/// API responses by `route` (the matched template) and `status`.
pub const API_REQUESTS: &str = "hindsight_api_requests_total";
/// API latency by `route`.
pub const API_REQUEST_SECONDS: &str = "hindsight_api_request_duration_seconds";
/// Refused API keys, by `reason` (missing, invalid).
pub const API_AUTH_FAILURES: &str = "hindsight_api_auth_failures_total";
/// Requests refused by the plan (403), by `reason`.
pub const API_FORBIDDEN: &str = "hindsight_api_forbidden_total";
/// Requests refused for exceeding the rate limit (429).
pub const API_RATE_LIMITED: &str = "hindsight_api_rate_limited_total";
/// Lookups in the API's caches, by `cache` (`pages`: history pages,
/// `keys`: API key records) and `result` (`hit`: served kept, `miss`: read
/// from the store). What a cache never keeps (`fill=previous` pages;
/// anything on a store without a stamp, CQL) is not counted.
pub const API_CACHE: &str = "hindsight_api_cache_total";
/// Bytes the API's caches keep, by `cache`.
pub const API_CACHE_BYTES: &str = "hindsight_api_cache_bytes";
/// Requests that failed on our side (500), by `route` and `cause` (`store`,
/// `invariant`); each is also logged once with its cause.
pub const API_INTERNAL_ERRORS: &str = "hindsight_api_internal_errors_total";
/// Bytes of export files sent, by `kind` (prices, books, metrics) and
/// `format` (csv, parquet).
pub const API_EXPORT_BYTES: &str = "hindsight_api_export_bytes_total";
/// Exports that stopped before their end, by `kind` and `cause`:
/// `client_gone`, `client_stalled` (stopped reading), `store`, `encode`
/// (the last two cut the body short; each is logged with its cause).
pub const API_EXPORTS_CUT: &str = "hindsight_api_exports_cut_total";
/// Export jobs entering a state, by `state`: `queued` (created), `running`
/// (claimed, again after a lost lease), `done`, `failed`, `expired`
/// (deleted with their files after the retention).
pub const API_EXPORT_JOBS: &str = "hindsight_api_export_jobs_total";
/// Bytes of finished export jobs' files, by `kind` and `format`.
pub const API_EXPORT_JOB_BYTES: &str = "hindsight_api_export_job_bytes_total";

// ---- store --------------------------------------------------------------------
/// Read-store query latency, by `op`.
pub const STORE_QUERY_SECONDS: &str = "hindsight_store_query_duration_seconds";
/// Read-store errors, by `op`.
pub const STORE_ERRORS: &str = "hindsight_store_errors_total";

/// `(name, unit, help)` of every metric above.
pub const DESCRIPTIONS: &[(&str, Unit, &str)] = &[
    (
        INGEST_EVENTS_ACCEPTED,
        Unit::Count,
        "Events appended to the log, by kind.",
    ),
    (
        INGEST_EVENTS_REJECTED,
        Unit::Count,
        "Ingest lines refused by validation, by reason.",
    ),
    (INGEST_BATCH_LINES, Unit::Count, "Lines per ingest batch."),
    (
        INGEST_BATCH_SECONDS,
        Unit::Seconds,
        "Wall time of one ingest batch.",
    ),
    (
        LOG_APPEND_SECONDS,
        Unit::Seconds,
        "Time for the log to durably accept one append.",
    ),
    (
        INGEST_IDEMPOTENT_REPLAYS,
        Unit::Count,
        "Ingest batches answered from the idempotency table.",
    ),
    (
        INGEST_RESPONSES,
        Unit::Count,
        "Ingest HTTP responses, by status.",
    ),
    (
        PROJECTOR_EVENTS_APPLIED,
        Unit::Count,
        "Events applied to the read store (buckets, tick-level tables, catalog), by kind.",
    ),
    (
        PROJECTOR_REPLAYS_SKIPPED,
        Unit::Count,
        "Re-delivered events skipped because their bucket already holds them.",
    ),
    (
        PROJECTOR_ROWS_WRITTEN,
        Unit::Count,
        "Bucket rows written, by table.",
    ),
    (
        PROJECTOR_FLUSH_SECONDS,
        Unit::Seconds,
        "Time from folding one segment of events to its rows being durable.",
    ),
    (
        PROJECTOR_STEP_SECONDS,
        Unit::Seconds,
        "Time a projector step spends polling the log, folding, and waiting for the previous write (folding what arrives meanwhile), by stage.",
    ),
    (
        PROJECTOR_POSITION,
        Unit::Count,
        "Next log position the projector reads, by partition.",
    ),
    (
        PROJECTOR_LAG,
        Unit::Count,
        "Events in the log not yet projected, by partition.",
    ),
    (
        PROJECTOR_DECODE_ERRORS,
        Unit::Count,
        "Log records that could not be decoded.",
    ),
    (
        PROJECTOR_NOT_FOLDED,
        Unit::Count,
        "Events not folded because the catalog contradicts them (a tick under another market than its token's, a market taking another's token or slug), by reason.",
    ),
    (
        LOG_HEAD,
        Unit::Count,
        "Position after the newest event in the log, by partition.",
    ),
    (
        HTTP_OPEN_CONNECTIONS,
        Unit::Count,
        "Connections open on a listener, by listener.",
    ),
    (
        HTTP_MAX_CONNECTIONS,
        Unit::Count,
        "The most connections a listener serves at once, by listener.",
    ),
    (
        HTTP_TIMEOUTS,
        Unit::Count,
        "Connections closed (header, idle) or requests answered 408 (request) by the serving loop's bounds, by listener and bound.",
    ),
    (
        API_REQUESTS,
        Unit::Count,
        "API responses, by route and status.",
    ),
    (
        API_REQUEST_SECONDS,
        Unit::Seconds,
        "API request latency, by route.",
    ),
    (
        API_AUTH_FAILURES,
        Unit::Count,
        "Refused API keys, by reason.",
    ),
    (
        INGEST_IN_FLIGHT,
        Unit::Count,
        "Events sent to the log and not yet confirmed (Kafka).",
    ),
    (
        KAFKA_DELIVERY_ERRORS,
        Unit::Count,
        "Records the broker did not confirm (Kafka), by reason.",
    ),
    (
        INGEST_BACKPRESSURE,
        Unit::Count,
        "Batches refused because the in-flight budget was exhausted (503).",
    ),
    (
        API_FORBIDDEN,
        Unit::Count,
        "Requests refused by the plan (403), by reason.",
    ),
    (
        API_RATE_LIMITED,
        Unit::Count,
        "API requests refused for exceeding the rate limit (429).",
    ),
    (
        API_CACHE,
        Unit::Count,
        "Lookups in the API's caches, by cache (pages, keys, tokens) and result (hit, miss).",
    ),
    (
        API_CACHE_BYTES,
        Unit::Bytes,
        "Bytes the API's caches keep, by cache.",
    ),
    (
        API_INTERNAL_ERRORS,
        Unit::Count,
        "API requests that failed on our side (500), by route and cause.",
    ),
    (
        API_EXPORT_BYTES,
        Unit::Bytes,
        "Bytes of export files sent, by kind and format.",
    ),
    (
        API_EXPORTS_CUT,
        Unit::Count,
        "Exports that stopped before their end, by kind and cause.",
    ),
    (
        API_EXPORT_JOBS,
        Unit::Count,
        "Export jobs entering a state (queued, running, done, failed, expired), by state.",
    ),
    (
        API_EXPORT_JOB_BYTES,
        Unit::Bytes,
        "Bytes of finished export jobs' files, by kind and format.",
    ),
    (
        STORE_QUERY_SECONDS,
        Unit::Seconds,
        "Read-store query latency, by operation.",
    ),
    (
        STORE_ERRORS,
        Unit::Count,
        "Read-store errors, by operation.",
    ),
];

/// Latency buckets for request-scale work: 0.5 ms up to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const SIZE_BUCKETS: &[f64] = &[1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once) and returns the
/// handle that renders `/metrics`.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(INGEST_BATCH_LINES.into()), SIZE_BUCKETS)
                })
                .expect("bucket lists are non-empty")
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).expect("no other metrics recorder is installed");
            for (name, unit, help) in DESCRIPTIONS {
                match unit {
                    Unit::Seconds => metrics::describe_histogram!(*name, *unit, *help),
                    _ if name.ends_with("_total") => {
                        metrics::describe_counter!(*name, *unit, *help)
                    }
                    _ if *name == INGEST_BATCH_LINES => {
                        metrics::describe_histogram!(*name, *unit, *help)
                    }
                    _ => metrics::describe_gauge!(*name, *unit, *help),
                }
            }
            handle
        })
        .clone()
}

/// Registers every family at zero so `/metrics` lists each from the start:
/// a dashboard or an alert can then tell "none yet" from "not exported".
/// `known` gives the series of labelled families, as `(family, labels)`,
/// each with the label values the caller knows it can record; a family not
/// named there gets one series without labels. Gauges keyed by something
/// only known at run time (a partition) are left to whoever learns it.
/// Registering never changes a value already recorded.
pub fn register_zeros(known: &[(&'static str, Vec<(&'static str, String)>)]) {
    // Keyed by partition: a zero for a partition that may not exist (or
    // whose real position is not 0) would mislead. Keyed by listener: each
    // listener registers its own series as it starts serving.
    const KEYED_AT_RUN_TIME: [&str; 6] = [
        LOG_HEAD,
        PROJECTOR_POSITION,
        PROJECTOR_LAG,
        HTTP_OPEN_CONNECTIONS,
        HTTP_MAX_CONNECTIONS,
        HTTP_TIMEOUTS,
    ];
    install();
    for (name, unit, _) in DESCRIPTIONS {
        if KEYED_AT_RUN_TIME.contains(name) {
            continue;
        }
        let series: Vec<Vec<metrics::Label>> = known
            .iter()
            .filter(|(family, _)| family == name)
            .map(|(_, labels)| {
                labels
                    .iter()
                    .map(|(k, v)| metrics::Label::new(*k, v.clone()))
                    .collect()
            })
            .collect();
        let series = if series.is_empty() {
            vec![Vec::new()]
        } else {
            series
        };
        for labels in series {
            match unit {
                Unit::Seconds => {
                    let _ = metrics::histogram!(*name, labels);
                }
                _ if name.ends_with("_total") => metrics::counter!(*name, labels).increment(0),
                _ if *name == INGEST_BATCH_LINES => {
                    let _ = metrics::histogram!(*name, labels);
                }
                _ => metrics::gauge!(*name, labels).increment(0.0),
            }
        }
    }
}
