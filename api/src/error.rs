//! Every way a `/v1` request is refused, and how it looks on the wire
//! (SPEC.md §7): a JSON body with a `detail` string, or for validation
//! errors (422) a list of `{loc, msg, type}` in FastAPI's style.

use crate::auth::{rate_headers, RateState};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hindsight_schemas::api::{ErrorResponse, ValidationErrorResponse, ValidationIssue};
use hindsight_telemetry as tm;

pub const MISSING_KEY: &str = "API key required. Include the X-API-Key header with your API key.";
pub const INVALID_KEY: &str = "Invalid or expired API key.";
pub const RATE_LIMITED: &str = "rate limit exceeded, try again later";
pub const INTERNAL: &str = "failed to fetch data";
pub const INVALID_CURSOR: &str = "Invalid pagination cursor";

#[derive(Debug)]
pub enum ApiError {
    /// 401: no `X-API-Key` header.
    MissingKey,
    /// 401: unknown, revoked or expired key.
    InvalidKey,
    /// 403: the plan does not allow this; `reason` labels the metric.
    Forbidden {
        reason: &'static str,
        detail: String,
    },
    /// 404.
    NotFound(String),
    /// 400: bad timestamp, range, limit or cursor.
    BadRequest(String),
    /// 422: parameters failed schema validation.
    Validation(Vec<ValidationIssue>),
    /// 429, with seconds until the window resets.
    RateLimited { retry_after: u64, rate: RateState },
    /// 500: details are logged, never sent.
    Internal,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingKey | ApiError::InvalidKey => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn invalid_cursor() -> Self {
        ApiError::BadRequest(INVALID_CURSOR.into())
    }
}

/// A 422 issue about a query (or path) parameter.
pub fn issue(location: &str, name: &str, msg: impl Into<String>, kind: &str) -> ValidationIssue {
    ValidationIssue {
        loc: vec![location.into(), name.into()],
        msg: msg.into(),
        kind: kind.into(),
    }
}

impl From<hindsight_contracts::Error> for ApiError {
    fn from(e: hindsight_contracts::Error) -> Self {
        tracing::error!(error = %e, "read store failed");
        ApiError::Internal
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let detail = match self {
            ApiError::Validation(detail) => {
                return (status, Json(ValidationErrorResponse { detail })).into_response();
            }
            ApiError::MissingKey => MISSING_KEY.to_string(),
            ApiError::InvalidKey => INVALID_KEY.to_string(),
            ApiError::Forbidden { reason, detail } => {
                metrics::counter!(tm::API_FORBIDDEN, "reason" => reason).increment(1);
                detail
            }
            ApiError::NotFound(m) | ApiError::BadRequest(m) => m,
            ApiError::RateLimited { retry_after, rate } => {
                let mut r = (
                    status,
                    Json(ErrorResponse {
                        detail: RATE_LIMITED.into(),
                    }),
                )
                    .into_response();
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
                rate_headers(&mut r, &rate);
                return r;
            }
            ApiError::Internal => INTERNAL.to_string(),
        };
        (status, Json(ErrorResponse { detail })).into_response()
    }
}
