//! Authentication and rate limiting, as one middleware in front of `/v1`.
//!
//! `X-API-Key` is hashed and looked up; a missing or unknown key is refused
//! (401) before any handler runs, and so is a key over its plan's
//! requests-per-minute (429). The authenticated [`Caller`] is handed to the
//! handler as an extractor, and the response gets the rate-limit headers.

use crate::error::ApiError;
use crate::plans::Plan;
use crate::{keys, ApiState};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hindsight_contracts::ApiKeyRecord;
use hindsight_schemas::Timestamp;
use hindsight_telemetry as tm;
use subtle::ConstantTimeEq;

/// Length of a rate-limit window.
pub const WINDOW_MS: i64 = 60_000;

/// The authenticated caller of a `/v1` request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub key: ApiKeyRecord,
    pub plan: Plan,
    pub rate: RateState,
    /// When the request was authenticated, from the API's clock: its rate
    /// window and its plan's lookback are measured from this instant.
    pub now: Timestamp,
}

/// Where the caller stands in its rate window (after this request).
#[derive(Debug, Clone, Copy)]
pub struct RateState {
    /// `None` on unlimited plans.
    pub limit: Option<u32>,
    pub used: u64,
    /// Unix seconds when the window resets.
    pub reset_at: i64,
}

impl RateState {
    pub fn remaining(&self) -> Option<u64> {
        self.limit.map(|l| (l as u64).saturating_sub(self.used))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        // Put there by `authenticate`, which guards every /v1 route.
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(ApiError::Internal)
    }
}

async fn identify(state: &ApiState, parts: &Parts) -> Result<(ApiKeyRecord, Plan), ApiError> {
    let Some(sent) = parts.headers.get("x-api-key") else {
        metrics::counter!(tm::API_AUTH_FAILURES, "reason" => "missing").increment(1);
        return Err(ApiError::MissingKey);
    };
    let invalid = || {
        metrics::counter!(tm::API_AUTH_FAILURES, "reason" => "invalid").increment(1);
        ApiError::InvalidKey
    };
    let hash = keys::hash(sent.to_str().map_err(|_| invalid())?);
    let key = state.keys.key_by_hash(hash).await?.ok_or_else(invalid)?;
    // The lookup is by hash already; compare again in constant time so that
    // no code path branches on a partial match of secret material.
    if !bool::from(key.hash.ct_eq(&hash)) || key.revoked_at.is_some() {
        return Err(invalid());
    }
    let Some(plan) = state.plans.get(&key.plan).cloned() else {
        tracing::error!(key_id = %key.key_id, plan = %key.plan, "key has an unknown plan");
        return Err(ApiError::Internal);
    };
    Ok((key, plan))
}

/// Counts the request in the key's window, shared by every API process.
async fn count(
    state: &ApiState,
    key: &ApiKeyRecord,
    plan: &Plan,
    now: Timestamp,
) -> Result<RateState, ApiError> {
    let now = now.millis();
    let window = now.div_euclid(WINDOW_MS) * WINDOW_MS;
    let reset_at = (window + WINDOW_MS) / 1000;
    let Some(limit) = plan.requests_per_minute else {
        return Ok(RateState {
            limit: None,
            used: 0,
            reset_at,
        });
    };
    let used = state
        .keys
        .hit_window(&key.key_id, Timestamp(window))
        .await?;
    let rate = RateState {
        limit: Some(limit),
        used,
        reset_at,
    };
    if used > limit as u64 {
        metrics::counter!(tm::API_RATE_LIMITED).increment(1);
        return Err(ApiError::RateLimited {
            retry_after: ((reset_at * 1000 - now + 999) / 1000).max(1) as u64,
            rate,
        });
    }
    Ok(rate)
}

/// The `/v1` guard: authenticate, count, run the handler, add headers.
pub async fn authenticate(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let now = state.clock.now();
    let caller = match identify(&state, &parts).await {
        Ok((key, plan)) => match count(&state, &key, &plan, now).await {
            Ok(rate) => Caller {
                key,
                plan,
                rate,
                now,
            },
            Err(e) => return e.into_response(),
        },
        Err(e) => return e.into_response(),
    };
    let rate = caller.rate;
    parts.extensions.insert(caller);
    let mut response = next.run(Request::from_parts(parts, body)).await;
    rate_headers(&mut response, &rate);
    response
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Unix seconds), on limited plans.
pub fn rate_headers(response: &mut Response, rate: &RateState) {
    if let (Some(limit), Some(remaining)) = (rate.limit, rate.remaining()) {
        let h = response.headers_mut();
        h.insert("x-ratelimit-limit", HeaderValue::from(limit));
        h.insert("x-ratelimit-remaining", HeaderValue::from(remaining));
        h.insert("x-ratelimit-reset", HeaderValue::from(rate.reset_at));
    }
}
