//! Every way a `/v1` request is refused, and how it looks on the wire
//! (SPEC.md §7): a JSON body with a `detail` string, or for validation
//! errors (422) a list of `{loc, msg, type}` in FastAPI's style.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// One failed parameter of a 422.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FieldError {
    pub loc: Vec<String>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl FieldError {
    pub fn query(name: &str, msg: impl Into<String>, kind: &'static str) -> Self {
        FieldError {
            loc: vec!["query".into(), name.into()],
            msg: msg.into(),
            kind,
        }
    }

    pub fn path(name: &str, msg: impl Into<String>, kind: &'static str) -> Self {
        FieldError {
            loc: vec!["path".into(), name.into()],
            msg: msg.into(),
            kind,
        }
    }
}

#[derive(Debug)]
pub enum ApiError {
    /// 401: no `X-API-Key` header.
    MissingKey,
    /// 401: unknown, revoked or expired key.
    InvalidKey,
    /// 403: the plan does not allow this.
    Forbidden(String),
    /// 404.
    NotFound(String),
    /// 400: bad timestamp, range, limit or cursor.
    BadRequest(String),
    /// 422: parameters failed schema validation.
    Validation(Vec<FieldError>),
    /// 429, with seconds until the window resets.
    RateLimited { retry_after: u64 },
    /// 500: details are logged, never sent.
    Internal,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingKey | ApiError::InvalidKey => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<hindsight_store::StoreError> for ApiError {
    fn from(e: hindsight_store::StoreError) -> Self {
        tracing::error!(error = %e, "read store failed");
        ApiError::Internal
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let detail = match &self {
            ApiError::MissingKey => {
                "API key required. Include the X-API-Key header with your API key.".to_string()
            }
            ApiError::InvalidKey => "Invalid or expired API key.".to_string(),
            ApiError::Forbidden(m) | ApiError::NotFound(m) | ApiError::BadRequest(m) => m.clone(),
            ApiError::Validation(errors) => {
                return (status, Json(serde_json::json!({ "detail": errors }))).into_response();
            }
            ApiError::RateLimited { .. } => "Rate limit exceeded. Try again later.".to_string(),
            ApiError::Internal => "Failed to fetch data.".to_string(),
        };
        let mut response = (status, Json(serde_json::json!({ "detail": detail }))).into_response();
        if let ApiError::RateLimited { retry_after } = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        }
        response
    }
}
