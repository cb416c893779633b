//! Authentication and rate limiting: two middlewares in front of `/v1`.
//!
//! - [`authenticate`] guards every `/v1` route: `X-API-Key` is hashed and
//!   looked up; a missing or unknown key is refused (401) before any handler
//!   runs. The authenticated [`Caller`] is handed on as an extractor.
//! - [`meter`] guards every route but `/v1/usage`: it takes a hit in the
//!   key's sliding window, shared by every API replica through the
//!   [`AuthStore`](hindsight_contracts::AuthStore), refuses a key over its
//!   plan's requests per minute (429), and adds the rate-limit headers.
//!   `/v1/usage` is not metered, so a limited key can always see where it
//!   stands ([`standing`]) and when it may resume.

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

/// The authenticated caller of a `/v1` request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub key: ApiKeyRecord,
    pub plan: Plan,
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
    let key = state
        .known_keys
        .known(
            || state.keys.version(),
            &hash,
            || state.keys.key_by_hash(hash),
        )
        .await?
        .ok_or_else(invalid)?;
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

/// The `/v1` guard: authenticate, then run the route with its [`Caller`].
pub async fn authenticate(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let now = state.clock.now();
    let (key, plan) = match identify(&state, &parts).await {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let key_id = key.key_id.clone();
    parts.extensions.insert(Caller { key, plan, now });
    let response = next.run(Request::from_parts(parts, body)).await;
    // The key's usage counts (the dashboard's charts), written in batches.
    state.usage.count(&key_id, now, response.status().as_u16());
    response
}

/// The guard of metered routes (every route but `/v1/usage`, inside
/// [`authenticate`]): takes a hit for the caller, 429 when its plan's limit
/// is reached, the rate-limit headers on the answer otherwise.
pub async fn meter(
    State(state): State<ApiState>,
    caller: Caller,
    request: Request,
    next: Next,
) -> Response {
    match take(&state, &caller).await {
        Err(refused) => refused.into_response(),
        Ok(rate) => {
            let mut response = next.run(request).await;
            if let Some(rate) = rate {
                rate_headers(&mut response, &rate);
            }
            response
        }
    }
}

/// Takes one request from the caller's plan limit: where the caller then
/// stands (`None` on unlimited plans), or the 429 when the limit is
/// reached. Keys' requests take it in [`meter`]; the dashboard's explorer
/// takes it for the `/v1` requests it runs for an organization.
pub async fn take(state: &ApiState, caller: &Caller) -> Result<Option<RateState>, ApiError> {
    let Some(limit) = caller.plan.requests_per_minute else {
        return Ok(None);
    };
    let taken = state
        .keys
        .take_hit(&caller.key.key_id, caller.now, limit)
        .await?;
    let rate = RateState::of(limit, &taken.hits, caller.now);
    if !taken.admitted {
        metrics::counter!(tm::API_RATE_LIMITED).increment(1);
        return Err(ApiError::RateLimited(rate));
    }
    Ok(Some(rate))
}

/// Where the caller stands, without counting a request; `None` on
/// unlimited plans.
pub async fn standing(state: &ApiState, caller: &Caller) -> Result<Option<RateState>, ApiError> {
    let Some(limit) = caller.plan.requests_per_minute else {
        return Ok(None);
    };
    let hits = state.keys.rate_hits(&caller.key.key_id, caller.now).await?;
    Ok(Some(RateState::of(limit, &hits, caller.now)))
}
