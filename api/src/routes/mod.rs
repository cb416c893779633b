//! `/v1` handlers. The auth middleware and extractors have authenticated the
//! caller and validated the query; a handler checks the plan, reads, shapes.

pub mod discovery;
pub mod estimate;
pub mod export;
pub mod exports;
pub mod history;

use crate::auth::{self, Caller};
use crate::error::{issue, ApiError};
use crate::rate::rate_headers;
use crate::ApiState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use hindsight_schemas::api::*;
use hindsight_schemas::{Timestamp, MAX_ID_LEN};

use axum::Json;

/// A path id of 1..200 characters (docs/SPEC.md §4).
pub fn path_id(name: &str, value: String) -> Result<String, ApiError> {
    let len = value.chars().count();
    if len == 0 {
        return Err(ApiError::Validation(vec![issue(
            "path",
            name,
            "String should have at least 1 character",
            "string_too_short",
        )]));
    }
    if len > MAX_ID_LEN {
        return Err(ApiError::Validation(vec![issue(
            "path",
            name,
            format!("String should have at most {MAX_ID_LEN} characters"),
            "string_too_long",
        )]));
    }
    Ok(value)
}

pub fn iso(t: Option<Timestamp>) -> Option<String> {
    t.map(|t| t.to_rfc3339())
}

/// Authenticated liveness check.
#[utoipa::path(get, path = "/v1/health", tag = "utility",
    responses((status = 200, body = HealthResponse), (status = 401, body = ErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn health(_caller: Caller) -> Json<HealthResponse> {
    Json(HealthResponse {
        status: "ok".into(),
        timestamp: Timestamp::now().to_rfc3339(),
    })
}

/// Plan, rate-limit remaining, allowed data points.
///
/// Not rate-limited, so that a key over its limit can see where it stands:
/// it counts nothing, and carries the same rate-limit headers as a counted
/// answer. Unlimited plans report `requests_per_minute` and
/// `requests_remaining` as -1 and `reset_at` as null.
#[utoipa::path(get, path = "/v1/usage", tag = "utility",
    responses((status = 200, body = UsageResponse), (status = 401, body = ErrorResponse)))]
pub async fn usage(State(state): State<ApiState>, caller: Caller) -> Result<Response, ApiError> {
    let rate = auth::standing(&state, &caller).await?;
    let plan = &caller.plan;
    let mut response = Json(UsageResponse {
        plan: plan.name.clone(),
        organization: caller.key.organization.clone(),
        limits: UsageLimits {
            requests_per_minute: rate.map_or(-1, |r| i64::from(r.limit)),
            requests_remaining: rate.map_or(-1, |r| r.remaining() as i64),
            granularity_allowed: plan.finest.as_str().into(),
            max_history_days: plan.max_history_days.into(),
            data_points: DataPoints {
                metrics: plan.metrics,
                prices: plan.prices,
                books: plan.books,
                trades: plan.trades,
            },
        },
        reset_at: rate.map(|r| r.reset_at),
    })
    .into_response();
    if let Some(rate) = &rate {
        rate_headers(&mut response, rate);
    }
    Ok(response)
}
