//! Authentication and rate limiting, as one middleware in front of `/v1`.
//!
//! `X-API-Key` is hashed and looked up; a missing or unknown key is refused
//! (401) before any handler runs, and so is a key over its plan's
//! requests-per-minute (429). The authenticated [`Caller`] is handed to the
//! handler as an extractor, and the response gets the rate-limit headers.

use crate::error::ApiError;
use crate::plans::Plan;
use crate::rate::{rate_headers, RateState};
use crate::{keys, ApiState};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
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

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        // Put there by `authenticate`, which guards every /v1 route.
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            ApiError::invariant("no authenticated caller: the route is not behind `authenticate`")
        })
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
        return Err(ApiError::invariant(format!(
            "key {} has an unknown plan `{}`",
            key.key_id, key.plan
        )));
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
