//! Every way a `/v1` request is refused, and how it looks on the wire
//! (docs/SPEC.md §7): a JSON body with a `detail` string, or for validation
//! errors (422) a list of `{loc, msg, type}` in FastAPI's style.
//!
//! A 500 keeps its cause ([`Internal`]) instead of logging where it is
//! built: `into_response` puts the cause in the response's extensions and
//! [`report_internal_errors`], one layer around the whole router, logs and
//! counts it once — however deep the `?` that produced it, and whether a
//! handler or the auth middleware failed.

use crate::rate::{rate_headers, RateState};
use axum::extract::{MatchedPath, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hindsight_schemas::api::{ErrorResponse, ValidationErrorResponse, ValidationIssue};
use hindsight_telemetry as tm;
use std::fmt;
use std::sync::Arc;

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
    /// 409: the request needs derived data this store does not hold yet
    /// (a candle of a bucket projected before candles were stored); the
    /// detail says what the operator runs to fill it.
    NotDerived(String),
    /// 409: what was asked for is not ready yet (an export job's file
    /// before the job is done).
    NotReady(String),
    /// 413: the request asks for more than one response carries (an export
    /// over the replica's row limit); the detail says what to do instead.
    TooLarge(String),
    /// 429: the caller's window is full; `Retry-After` says when one more fits.
    RateLimited(RateState),
    /// 503: this replica has no room for the request now; `Retry-After`
    /// says when to try again (a request elsewhere may succeed at once).
    Unavailable { detail: String, retry_after: u32 },
    /// 500: the cause is logged (by [`report_internal_errors`]), never sent.
    Internal(Internal),
}

/// Why a request failed on our side. Cloneable (response extensions need
/// it) and cheap: the cause is shared, not copied.
#[derive(Debug, Clone)]
pub enum Internal {
    /// A store the API reads (buckets, catalog, keys, rate windows) failed.
    Store(Arc<hindsight_contracts::Error>),
    /// Something the API relies on did not hold (a key whose plan is not
    /// configured, stored book levels that are not JSON).
    Invariant(Arc<str>),
}

impl Internal {
    /// The `cause` label of the internal-errors metric.
    pub fn label(&self) -> &'static str {
        match self {
            Internal::Store(_) => "store",
            Internal::Invariant(_) => "invariant",
        }
    }
}

impl fmt::Display for Internal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Internal::Store(e) => write!(f, "read store failed: {e}"),
            Internal::Invariant(what) => f.write_str(what),
        }
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingKey | ApiError::InvalidKey => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::NotDerived(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotReady(_) => StatusCode::CONFLICT,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// 400 for a `cursor` this API did not issue for the request: `bound`
    /// says what it must match (docs/SPEC.md §7 knows the text's start).
    pub fn invalid_cursor(bound: &str) -> Self {
        ApiError::BadRequest(format!(
            "{INVALID_CURSOR}: the `cursor` parameter must be a `metadata.next_cursor` \
             returned for {bound}, passed back unchanged"
        ))
    }

    /// What the client reads of it, as one line: the `detail`, or each
    /// validation issue's place and message (an export job records this
    /// when it fails).
    pub fn detail(&self) -> String {
        match self {
            ApiError::Validation(issues) => issues
                .iter()
                .map(|i| format!("{}: {}", i.loc.join("."), i.msg))
                .collect::<Vec<_>>()
                .join("; "),
            ApiError::MissingKey => MISSING_KEY.into(),
            ApiError::InvalidKey => INVALID_KEY.into(),
            ApiError::RateLimited(_) => RATE_LIMITED.into(),
            ApiError::Internal(_) => INTERNAL.into(),
            ApiError::Forbidden { detail, .. } | ApiError::Unavailable { detail, .. } => {
                detail.clone()
            }
            ApiError::NotFound(m)
            | ApiError::BadRequest(m)
            | ApiError::NotDerived(m)
            | ApiError::TooLarge(m)
            | ApiError::NotReady(m) => m.clone(),
        }
    }

    /// A 500 for a broken assumption, described for the log.
    pub fn invariant(what: impl Into<Arc<str>>) -> Self {
        ApiError::Internal(Internal::Invariant(what.into()))
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

/// Pure: `?` on a store call keeps the cause; nothing is logged here.
impl From<hindsight_contracts::Error> for ApiError {
    fn from(e: hindsight_contracts::Error) -> Self {
        ApiError::Internal(Internal::Store(Arc::new(e)))
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
            ApiError::NotFound(m)
            | ApiError::BadRequest(m)
            | ApiError::NotDerived(m)
            | ApiError::TooLarge(m)
            | ApiError::NotReady(m) => m,
            ApiError::RateLimited(rate) => {
                let mut r = (
                    status,
                    Json(ErrorResponse {
                        detail: RATE_LIMITED.into(),
                    }),
                )
                    .into_response();
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(rate.retry_after));
                rate_headers(&mut r, &rate);
                return r;
            }
            ApiError::Unavailable {
                detail,
                retry_after,
            } => {
                let mut r = (status, Json(ErrorResponse { detail })).into_response();
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
                return r;
            }
            ApiError::Internal(cause) => {
                let mut r = (
                    status,
                    Json(ErrorResponse {
                        detail: INTERNAL.into(),
                    }),
                )
                    .into_response();
                r.extensions_mut().insert(cause);
                return r;
            }
        };
        (status, Json(ErrorResponse { detail })).into_response()
    }
}

/// Logs and counts the cause of every 500 once, by route. The client sees
/// only `{"detail": "failed to fetch data"}`; the cause is taken out of the
/// response here so it travels no further.
pub async fn report_internal_errors(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let request_id = request.headers().get("x-request-id").cloned();
    let mut response = next.run(request).await;
    if let Some(cause) = response.extensions_mut().remove::<Internal>() {
        let request_id = request_id.as_ref().and_then(|v| v.to_str().ok());
        tracing::error!(%route, request_id, error = %cause, "request failed");
        metrics::counter!(tm::API_INTERNAL_ERRORS, "route" => route, "cause" => cause.label())
            .increment(1);
    }
    response
}
