//! `/v1` handlers. The auth middleware and extractors have authenticated the
//! caller and validated the query; a handler checks the plan, reads, shapes.

pub mod discovery;
pub mod history;

use crate::auth::Caller;
use crate::error::{issue, ApiError};
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
/// Unlimited plans report `requests_per_minute` and `requests_remaining` as
/// -1 and `reset_at` as null.
#[utoipa::path(get, path = "/v1/usage", tag = "utility",
    responses((status = 200, body = UsageResponse), (status = 401, body = ErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn usage(caller: Caller) -> Json<UsageResponse> {
    let (plan, rate) = (&caller.plan, &caller.rate);
    Json(UsageResponse {
        plan: plan.name.clone(),
        organization: caller.key.organization.clone(),
        limits: UsageLimits {
            requests_per_minute: rate.limit.map_or(-1, i64::from),
            requests_remaining: rate.remaining().map_or(-1, |r| r as i64),
            granularity_allowed: plan.finest.as_str().into(),
            max_history_days: plan.max_history_days.into(),
            data_points: DataPoints {
                metrics: plan.metrics,
                prices: plan.prices,
                books: plan.books,
            },
        },
        reset_at: rate.limit.map(|_| rate.reset_at),
    })
}
