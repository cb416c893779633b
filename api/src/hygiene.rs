//! What every response of the API gets, whoever produced it: oversized
//! request lines and headers refused with a JSON 414/431, error bodies that
//! axum writes as plain text or leaves empty (405, extractor rejections)
//! rewritten as `{"detail": …}`, `X-Content-Type-Options: nosniff`, and
//! `Cache-Control: no-store` on answers to requests that carry an API key.
//!
//! (Ingest has the same layer over its own router: the two services share
//! no HTTP crate.)

use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hindsight_schemas::api::ErrorResponse;

/// Largest request target accepted, in bytes; longer gets a JSON 414.
/// (hyper answers URIs over 64 KiB itself, with an empty body.)
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Most request headers, and their largest total size (names and values);
/// beyond either a JSON 431. (hyper refuses more than 100 headers itself.)
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

pub async fn hygiene(request: Request, next: Next) -> Response {
    // A key-bearing answer is the caller's own (their plan, their usage,
    // their rate headers): no shared cache may keep it. Letting CDNs cache
    // public history is another issue's business (it needs a keyless,
    // plan-independent response first).
    let key_bearing = request.headers().contains_key("x-api-key");
    let mut response = match oversized(&request) {
        Some(refusal) => refusal,
        None => {
            let method = request.method().clone();
            json_error_body(next.run(request).await, &method).await
        }
    };
    let h = response.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if key_bearing {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

fn oversized(request: &Request) -> Option<Response> {
    let uri_len = request.uri().to_string().len();
    let headers = request.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    let (status, detail) = if uri_len > MAX_URI_BYTES {
        (
            StatusCode::URI_TOO_LONG,
            format!("request URI is {uri_len} bytes; at most {MAX_URI_BYTES} are allowed"),
        )
    } else if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "{} headers of {header_bytes} bytes; at most {MAX_HEADERS} headers of {MAX_HEADER_BYTES} bytes are allowed",
                headers.len()
            ),
        )
    } else {
        return None;
    };
    Some((status, Json(ErrorResponse { detail })).into_response())
}

/// An error response whose body is not JSON, rewritten as
/// `{"detail": …}`: the text axum gave, or the status's reason.
async fn json_error_body(response: Response, method: &Method) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let status = response.status();
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let detail = if status == StatusCode::METHOD_NOT_ALLOWED {
        format!("method {method} is not allowed here; the API answers GET")
    } else if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let body = serde_json::to_vec(&ErrorResponse { detail }).expect("detail serializes");
    Response::from_parts(parts, axum::body::Body::from(body))
}
