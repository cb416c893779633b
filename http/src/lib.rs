//! The HTTP edge every service shares, whoever produced the response:
//! oversized request lines and headers refused with a JSON 414/431, error
//! bodies that axum writes as plain text or leaves empty (405, extractor
//! rejections) rewritten as `{"detail": …}`, `X-Content-Type-Options:
//! nosniff` everywhere, and `Cache-Control: no-store` on answers that carry
//! a caller's secrets, unless the handler chose a caching policy of its own.
//!
//! One layer for ingest and the API rather than one each: a client sees
//! the same error shape from every Hindsight address.

use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};

/// Largest request target accepted, in bytes; longer gets a JSON 414.
/// (hyper answers URIs over 64 KiB itself, with an empty body.)
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Most request headers, and their largest total size (names and values);
/// beyond either a JSON 431. (hyper refuses more than 100 headers itself.)
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Which answers no shared cache may keep.
#[derive(Clone)]
pub enum NoStore {
    /// Every answer (ingest: every request carries the ingest token).
    Always,
    /// Answers to requests carrying this header (the API key): the caller's
    /// own plan, usage and rate headers. Keyless answers stay cacheable,
    /// and so does an answer whose handler set `Cache-Control` itself (the
    /// API's history pages, which also say `Vary` on the key): the default
    /// is safe, and an explicit policy is a decision made with the content
    /// in view.
    WhenHeader(HeaderName),
}

/// Wraps `router` in the shared edge.
pub fn edge<S: Clone + Send + Sync + 'static>(router: Router<S>, no_store: NoStore) -> Router<S> {
    router.layer(middleware::from_fn_with_state(no_store, hygiene))
}

async fn hygiene(State(no_store): State<NoStore>, request: Request, next: Next) -> Response {
    let keyed = match &no_store {
        NoStore::Always => None,
        NoStore::WhenHeader(name) => Some(request.headers().contains_key(name)),
    };
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
    let private = match keyed {
        None => true,
        Some(keyed) => keyed && !h.contains_key(header::CACHE_CONTROL),
    };
    if private {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

fn detail(status: StatusCode, detail: String) -> Response {
    (status, Json(serde_json::json!({ "detail": detail }))).into_response()
}

fn oversized(request: &Request) -> Option<Response> {
    let uri_len = request.uri().to_string().len();
    let headers = request.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if uri_len > MAX_URI_BYTES {
        Some(detail(
            StatusCode::URI_TOO_LONG,
            format!("request URI is {uri_len} bytes; at most {MAX_URI_BYTES} are allowed"),
        ))
    } else if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        Some(detail(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "{} headers of {header_bytes} bytes; at most {MAX_HEADERS} headers of {MAX_HEADER_BYTES} bytes are allowed",
                headers.len()
            ),
        ))
    } else {
        None
    }
}

/// An error response whose body is not JSON, rewritten as
/// `{"detail": …}`: the text axum gave, the status's reason, or for a 405
/// which methods the path allows.
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
    let text = if status == StatusCode::METHOD_NOT_ALLOWED {
        match parts
            .headers
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
        {
            Some(allowed) if !allowed.is_empty() => {
                format!("method {method} is not allowed here; allowed: {allowed}")
            }
            _ => format!("method {method} is not allowed here"),
        }
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
    let body = serde_json::to_vec(&serde_json::json!({ "detail": text })).expect("json");
    Response::from_parts(parts, axum::body::Body::from(body))
}
