//! `/metrics` for Prometheus, and for orchestrators `/livez` (the process
//! answers) and `/readyz` (its log and store answer too; 503 otherwise).
//! Unauthenticated, unlike `/v1/health`.

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use hindsight_contracts::{EventLog, ProjectionStore};
use std::sync::Arc;

/// What a service needs to be ready: its log, its store, or both.
#[derive(Clone, Default)]
pub struct Readiness {
    pub log: Option<Arc<dyn EventLog>>,
    pub store: Option<Arc<dyn ProjectionStore>>,
}

impl Readiness {
    async fn check(&self) -> Result<(), String> {
        if let Some(log) = &self.log {
            log.ready().await.map_err(|e| format!("event log: {e}"))?;
        }
        if let Some(store) = &self.store {
            store
                .committed()
                .await
                .map_err(|e| format!("read store: {e}"))?;
        }
        Ok(())
    }
}

/// The ops routes over the process's one metrics registry (installed here
/// on first use, with every family registered at zero).
pub fn router(readiness: Readiness) -> Router {
    let handle = hindsight_telemetry::install();
    hindsight_telemetry::register_zeros(&known_series());
    Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    match readiness.check().await {
                        Ok(()) => (StatusCode::OK, "ok".to_string()),
                        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e),
                    }
                }
            }),
        )
}

/// Statuses the `/v1` routes answer (each route is registered with each).
const API_STATUSES: [&str; 7] = ["200", "400", "401", "403", "404", "429", "500"];
/// Statuses ingest's handler answers and counts.
const INGEST_STATUSES: [&str; 8] = ["200", "400", "401", "409", "413", "415", "422", "503"];
/// The `op` labels of the read stores (embedded and CQL) that every
/// deployment exercises; an op missing here appears with its first query.
const STORE_OPS: [&str; 20] = [
    "apply",
    "catalog_changes",
    "committed",
    "count_rows",
    "count_ticks",
    "list_keys",
    "load_rows",
    "put_key",
    "read_books",
    "read_candles",
    "read_hits",
    "read_key",
    "read_market",
    "read_metrics",
    "read_prices",
    "read_token",
    "reset",
    "take_hit",
    "write_catalog",
    "write_consumed",
];

/// The label values each labelled family can be recorded with, so that
/// [`hindsight_telemetry::register_zeros`] shows every one at zero from the
/// start (alerts on `rate(..._rejected_total{reason="…"})` then see 0, not
/// nothing). Routes come from the OpenAPI document, reject reasons and event
/// kinds from their enums.
fn known_series() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    use hindsight_schemas::event::EventKind;
    use hindsight_schemas::wire::RejectKind;
    use hindsight_telemetry as tm;
    let one = |family, key, value: &str| (family, vec![(key, value.to_string())]);
    let mut out = Vec::new();
    for kind in EventKind::ALL {
        out.push(one(tm::INGEST_EVENTS_ACCEPTED, "kind", kind.as_str()));
    }
    for reject in RejectKind::ALL {
        out.push(one(tm::INGEST_EVENTS_REJECTED, "reason", reject.label()));
    }
    for status in INGEST_STATUSES {
        out.push(one(tm::INGEST_RESPONSES, "status", status));
    }
    for kind in ["price", "book", "metrics", "trade", "catalog"] {
        out.push(one(tm::PROJECTOR_EVENTS_APPLIED, "kind", kind));
    }
    for reason in RejectKind::CATALOG {
        out.push(one(tm::PROJECTOR_NOT_FOLDED, "reason", reason.label()));
    }
    for table in ["prices", "metrics", "books"] {
        out.push(one(tm::PROJECTOR_ROWS_WRITTEN, "table", table));
    }
    for stage in hindsight_projector::runner::STAGES {
        out.push(one(tm::PROJECTOR_STEP_SECONDS, "stage", stage));
    }
    for reason in ["not_confirmed", "cancelled"] {
        out.push(one(tm::KAFKA_DELIVERY_ERRORS, "reason", reason));
    }
    for reason in ["missing", "invalid"] {
        out.push(one(tm::API_AUTH_FAILURES, "reason", reason));
    }
    for reason in ["data_point", "resolution", "coverage", "lookback"] {
        out.push(one(tm::API_FORBIDDEN, "reason", reason));
    }
    let routes = hindsight_api::openapi::document()
        .paths
        .paths
        .into_keys()
        .filter(|p| p.starts_with("/v1/"));
    for route in routes {
        out.push(one(tm::API_REQUEST_SECONDS, "route", &route));
        for status in API_STATUSES {
            let labels = vec![("route", route.clone()), ("status", status.to_string())];
            out.push((tm::API_REQUESTS, labels));
        }
        for cause in ["store", "invariant"] {
            let labels = vec![("route", route.clone()), ("cause", cause.to_string())];
            out.push((tm::API_INTERNAL_ERRORS, labels));
        }
    }
    for kind in ["prices", "books", "metrics"] {
        for format in ["csv", "parquet"] {
            let labels = vec![("kind", kind.to_string()), ("format", format.to_string())];
            out.push((tm::API_EXPORT_BYTES, labels.clone()));
            out.push((tm::API_EXPORT_JOB_BYTES, labels));
        }
        for cause in ["client_gone", "client_stalled", "store", "encode"] {
            let labels = vec![("kind", kind.to_string()), ("cause", cause.to_string())];
            out.push((tm::API_EXPORTS_CUT, labels));
        }
    }
    for cache in ["pages", "keys", "tokens"] {
        for result in ["hit", "miss"] {
            let labels = vec![("cache", cache.to_string()), ("result", result.to_string())];
            out.push((tm::API_CACHE, labels));
        }
    }
    for state in ["queued", "running", "done", "failed", "expired"] {
        out.push(one(tm::API_EXPORT_JOBS, "state", state));
    }
    for op in STORE_OPS {
        out.push(one(tm::STORE_QUERY_SECONDS, "op", op));
        out.push(one(tm::STORE_ERRORS, "op", op));
    }
    out
}
