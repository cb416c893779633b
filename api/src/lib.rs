//! The `/v1` API, served from precomputed buckets and the projected catalog.
//!
//! - [`error`]: the one error type; every refusal's status and text.
//! - [`rate`]: the caller's rate window and its headers.
//! - [`plans`]: what each plan allows.
//! - [`auth`]: `X-API-Key` → the caller's key and plan, and rate limits.
//! - [`cursor`]: signed pagination cursors, bound to their request.
//! - [`query`]: query parameters, validated in extractors.
//! - [`catalog`]: the in-memory catalog behind the discovery lists.
//! - [`routes`]: the handlers, which read as the happy path.
//! - [`page`]: history pages encoded into one buffer, with their `ETag`
//!   and caching policy.
//! - [`conditional`]: `If-None-Match` → `304`, for any answer with an `ETag`.
//! - [`export`]: export files (CSV, Parquet) encoded in pieces as the
//!   store is read, for the streamed bulk export routes.
//! - [`jobs`]: export jobs (`POST /v1/exports`): the worker that runs
//!   them with the streamed export's producer into stored chunks.
//! - [`openapi`]: the OpenAPI document, generated from the handlers.
//! - [`keys`]: creating API keys (only hashes are stored).
//! - [`dashboard`]: the account holders' pages under `/dashboard`: sign-in,
//!   keys, usage (not `/v1`, not in the OpenAPI document).
//! - Around it all, `hindsight_http::edge`: JSON error bodies on every
//!   status, size limits on request lines and headers, `nosniff`, and
//!   `no-store` on key-bearing answers that set no `Cache-Control` of their
//!   own (the same edge as ingest's).
//!
//! Modules depend one way: `rate` ← `error` ← `plans` ← `auth` ← `routes`.

pub mod auth;
pub mod cache;
pub mod catalog;
pub mod conditional;
pub mod cursor;
pub mod dashboard;
pub mod error;
pub mod export;
pub mod hex;
pub mod jobs;
pub mod keys;
pub mod openapi;
pub mod page;
pub mod plans;
pub mod query;
pub mod rate;
pub mod routes;
pub mod usage;

use axum::extract::{FromRef, MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use catalog::Catalog;
use hindsight_contracts::{AccountStore, AuthStore, ReadStore};
use hindsight_telemetry as tm;
use routes::{discovery, estimate, history};
use std::sync::Arc;
use std::time::Instant;

/// What every handler reads, behind one `Arc`: axum hands each extractor
/// and middleware its own clone of the state, and a clone of the parts
/// themselves (a dozen reference counts and the dashboard's strings) cost
/// more than a cached page's whole answer.
#[derive(Clone)]
pub struct ApiState(Arc<ApiParts>);

impl From<ApiParts> for ApiState {
    fn from(parts: ApiParts) -> Self {
        ApiState(Arc::new(parts))
    }
}

impl std::ops::Deref for ApiState {
    type Target = ApiParts;

    fn deref(&self) -> &ApiParts {
        &self.0
    }
}

pub struct ApiParts {
    pub store: Arc<dyn ReadStore>,
    pub keys: Arc<dyn AuthStore>,
    /// The dashboard's accounts, and every key's usage counts.
    pub accounts: Arc<dyn AccountStore>,
    /// Requests counted in their key's usage, written to `accounts` in
    /// batches ([`usage::UsageMeter::run`]).
    pub usage: Arc<usage::UsageMeter>,
    pub dashboard: dashboard::DashboardConfig,
    pub plans: Arc<plans::Plans>,
    pub catalog: Arc<Catalog>,
    /// "Now" for rate-limit windows and plan lookback (tests move it).
    pub clock: Arc<dyn hindsight_schemas::time::Clock>,
    /// Signs and checks pagination cursors; the same on every replica.
    pub cursors: cursor::CursorKeys,
    /// History pages kept encoded while the store is unchanged.
    pub pages: Arc<cache::Cache<page::Sealed>>,
    /// Key records as `keys` answered them, kept while it is unchanged.
    pub known_keys: Arc<cache::Cache<hindsight_contracts::ApiKeyRecord>>,
    /// Where tokens belong, as `store` answered, kept while it is unchanged
    /// (every history page of a token reads it first).
    pub tokens: Arc<cache::Cache<hindsight_contracts::TokenRef>>,
    /// The bulk exports this replica may run at once.
    pub exports: routes::export::ExportSlots,
    /// Export jobs: their store and how they run.
    pub jobs: jobs::Jobs,
}

/// The query extractors seal and open cursors with the API's keys.
impl FromRef<ApiState> for cursor::CursorKeys {
    fn from_ref(state: &ApiState) -> Self {
        state.cursors.clone()
    }
}

pub fn router(state: ApiState) -> Router {
    // Every route but /v1/usage counts against the key's rate limit.
    let metered = Router::new()
        .route("/v1/health", get(routes::health))
        .route("/v1/series", get(discovery::list_series))
        .route("/v1/events", get(discovery::list_events))
        .route("/v1/markets", get(discovery::list_markets))
        .route("/v1/markets/{id_or_slug}", get(discovery::get_market))
        .route("/v1/tags", get(discovery::list_tags))
        .route(
            "/v1/markets/{id_or_slug}/metrics",
            get(history::market_metrics),
        )
        .route(
            "/v1/markets/{id_or_slug}/prices",
            get(history::market_prices),
        )
        .route("/v1/tokens/{token_id}/prices", get(history::token_prices))
        .route("/v1/markets/{id_or_slug}/books", get(history::market_books))
        .route("/v1/tokens/{token_id}/books", get(history::token_books))
        .route("/v1/export/prices", get(routes::export::export_prices))
        .route("/v1/export/books", get(routes::export::export_books))
        .route("/v1/export/metrics", get(routes::export::export_metrics))
        .route("/v1/export/trades", get(routes::export::export_trades))
        .route("/v1/export/candles", get(routes::export::export_candles))
        .route(
            "/v1/exports",
            get(routes::exports::list_export_jobs).post(routes::exports::create_export_job),
        )
        .route("/v1/exports/{id}", get(routes::exports::get_export_job))
        .route(
            "/v1/exports/{id}/download",
            get(routes::exports::download_export_job),
        )
        .route(
            "/v1/markets/{id_or_slug}/candles",
            get(history::market_candles),
        )
        .route("/v1/tokens/{token_id}/candles", get(history::token_candles))
        .route("/v1/estimate/{kind}", get(estimate::estimate))
        .route("/v1/tokens/{token_id}/trades", get(history::token_trades))
        .route("/v1/tokens/{token_id}/book", get(history::token_book))
        .route("/v1/markets/{id_or_slug}/book", get(history::market_book))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::meter))
        // Around `meter`: the request was counted before the comparison,
        // and a 304 keeps the rate headers `meter` put on the 200.
        .route_layer(middleware::from_fn(conditional::not_modified));
    let v1 = Router::new()
        .route("/v1/usage", get(routes::usage))
        .merge(metered)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .with_state(state.clone());
    let router = Router::new()
        .merge(v1)
        .route(
            "/openapi.json",
            get(|| async { axum::Json(openapi::document()) }),
        )
        .fallback(|| async { error::ApiError::NotFound("Not Found".into()).into_response() })
        .layer(middleware::from_fn(error::report_internal_errors));
    let api = hindsight_http::edge(
        router,
        hindsight_http::NoStore::WhenHeader(HeaderName::from_static("x-api-key")),
    );
    // The dashboard's pages sit beside the API, outside its JSON edge (its
    // errors are pages); the API's fallback answers every other path.
    dashboard::router(state)
        .merge(api)
        .layer(middleware::from_fn(observe))
}

/// A request id: 16 hex digits, distinct within the process. An id is not
/// a secret, so it costs no call to the OS's random source (a system call
/// per request): a counter from a random start drawn once, through
/// splitmix64's mix, a bijection, so that ids neither repeat nor show how
/// many requests came before.
fn new_request_id() -> HeaderValue {
    static NEXT: std::sync::LazyLock<std::sync::atomic::AtomicU64> =
        std::sync::LazyLock::new(|| {
            let mut start = [0u8; 8];
            getrandom::fill(&mut start).expect("the OS random source is available");
            u64::from_le_bytes(start).into()
        });
    let mut z = NEXT
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    HeaderValue::from_str(&format!("{z:016x}")).expect("hex is a valid header")
}

/// Gives every request and its response an `x-request-id` (the caller's, or
/// a new one; inner layers log it) and records requests and latency by
/// matched route and status.
async fn observe(mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let request_id = request
        .headers()
        .get("x-request-id")
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .cloned()
        .unwrap_or_else(new_request_id);
    request
        .headers_mut()
        .insert("x-request-id", request_id.clone());
    let mut response = next.run(request).await;
    response.headers_mut().insert("x-request-id", request_id);
    let status = response.status().as_u16().to_string();
    metrics::counter!(tm::API_REQUESTS, "route" => route.clone(), "status" => status).increment(1);
    metrics::histogram!(tm::API_REQUEST_SECONDS, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    /// Ids are 16 hex digits and do not repeat, nor count up visibly.
    #[test]
    fn request_ids_are_distinct_hex() {
        let ids: Vec<String> = (0..100_000)
            .map(|_| super::new_request_id().to_str().unwrap().to_string())
            .collect();
        assert!(ids
            .iter()
            .all(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())));
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        let (a, b) = (
            u64::from_str_radix(&ids[0], 16).unwrap(),
            u64::from_str_radix(&ids[1], 16).unwrap(),
        );
        assert!(a.abs_diff(b) > 1 << 32, "consecutive ids {a:x} and {b:x}");
    }
}
