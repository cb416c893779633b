//! The `/v1` API, served from precomputed buckets and the projected catalog.
//!
//! - [`error`]: the one error type; every refusal's status and text.
//! - [`auth`]: `X-API-Key` → the caller's key and plan (an extractor).
//! - [`plans`]: what each plan allows.
//! - [`query`]: history query parameters, validated in an extractor.
//! - [`routes`]: the handlers, which read as the happy path.
//! - [`keys`]: creating API keys (only hashes are stored).

pub mod auth;
pub mod cursor;
pub mod error;
pub mod keys;
pub mod plans;
pub mod query;
pub mod routes;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use hindsight_store::read::{KeyStore, ReadStore};
use hindsight_telemetry as tm;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone)]
pub struct ApiState {
    pub store: Arc<dyn ReadStore>,
    pub keys: Arc<dyn KeyStore>,
    pub plans: Arc<plans::Plans>,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/health", get(routes::health))
        .route("/v1/tokens/{token_id}/prices", get(routes::token_prices))
        .with_state(state)
        .layer(middleware::from_fn(observe))
}

/// Gives every response an `x-request-id` (the caller's, or a new one) and
/// records requests and latency by matched route and status.
async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let request_id = request
        .headers()
        .get("x-request-id")
        .filter(|v| v.len() <= 128)
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&keys::random_hex(8)).expect("hex is a valid header")
        });
    let mut response = next.run(request).await;
    response.headers_mut().insert("x-request-id", request_id);
    let status = response.status().as_u16().to_string();
    metrics::counter!(tm::API_REQUESTS, "route" => route.clone(), "status" => status).increment(1);
    metrics::histogram!(tm::API_REQUEST_SECONDS, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}
