//! `POST /ingest/v1/events`: NDJSON (optionally gzip) from pipelines.
//!
//! Every line is validated; the valid ones are appended to the log and the
//! response — accepted count and each rejected line with its number and
//! reason — is sent only after the log durably holds them. A retry carrying
//! the same `Idempotency-Key` and the same body gets the first response and
//! appends nothing; the key with another body (within 24 h) is 409, and
//! while another request is appending under the key, 503 with
//! `Retry-After` (retry the same body later).
//!
//! Every answer, whoever produced it (a handler, axum's method router, the
//! body limit), is JSON with a `detail` on error: see `hindsight_http`.

use crate::batch::{self, Rejected};
use crate::catalog::{BatchClaims, CatalogView};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use hindsight_contracts::{append_body, AppendBatch, AppendOutcome, EventLog, Idempotency};
use hindsight_schemas::wire::Limits;
use hindsight_schemas::Timestamp;
use hindsight_telemetry as tm;
use serde::Serialize;
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

#[derive(Clone)]
pub struct IngestState {
    pub log: Arc<dyn EventLog>,
    /// The bearer token pipelines must send.
    pub token: Arc<str>,
    /// Largest accepted body, compressed or not, and largest decompressed.
    pub max_body_bytes: usize,
    /// Validation bounds and the cap on listed rejects.
    pub limits: IngestLimits,
    /// The read store's catalog, which lines are checked against.
    pub catalog: Arc<CatalogView>,
}

/// Default of [`IngestLimits::max_listed_rejects`].
pub const DEFAULT_MAX_LISTED_REJECTS: usize = 1_000;

/// Default of [`IngestLimits::catalog_max_age`]: the API's catalog refresh.
pub const DEFAULT_CATALOG_MAX_AGE: Duration = Duration::from_millis(250);

/// What an operator may tune about validation (`Default` is the shipped
/// configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestLimits {
    /// Future-timestamp skew and book depth, applied to every line.
    pub wire: Limits,
    /// Most rejects listed in one response; the rest are only counted
    /// (`rejected_count`), so a huge all-invalid batch cannot produce a
    /// response as large as itself.
    pub max_listed_rejects: usize,
    /// How old the catalog view lines are checked against may grow before
    /// a batch reads the store's changes (zero: every batch does).
    pub catalog_max_age: Duration,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits {
            wire: Limits::default(),
            max_listed_rejects: DEFAULT_MAX_LISTED_REJECTS,
            catalog_max_age: DEFAULT_CATALOG_MAX_AGE,
        }
    }
}

pub fn router(state: IngestState) -> Router {
    let limit = state.max_body_bytes;
    let router = Router::new()
        .route("/ingest/v1/events", post(ingest_events))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state);
    hindsight_http::edge(router, hindsight_http::NoStore::Always)
}

#[derive(Serialize)]
pub struct IngestResponse {
    pub accepted: usize,
    /// Every refused line, listed or not.
    pub rejected_count: usize,
    /// The first [`IngestLimits::max_listed_rejects`] refused lines.
    pub rejected: Vec<Rejected>,
    /// True when `rejected` lists fewer lines than `rejected_count`.
    pub rejected_truncated: bool,
    /// Says how many were listed when the list is truncated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Why a batch was refused as a whole.
#[derive(Debug)]
enum IngestError {
    Unauthorized,
    TooLarge(usize),
    BadEncoding(String),
    /// A `Content-Encoding` other than `gzip` or `identity`.
    UnsupportedEncoding(String),
    BadIdempotencyKey,
    /// The key was used for another body within 24 h: nothing appended.
    KeyReused(String),
    /// Another request is appending under the key: nothing appended by this
    /// one; retry after the given seconds.
    KeyBusy(String, u64),
    /// The log could not durably accept the batch: nothing was acknowledged.
    LogUnavailable,
}

impl IntoResponse for IngestError {
    fn into_response(self) -> Response {
        let (status, detail) = match &self {
            IngestError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "ingest token is missing or wrong: send `Authorization: Bearer <HINDSIGHT_INGEST_TOKEN>`".to_string(),
            ),
            IngestError::TooLarge(max) => {
                (StatusCode::PAYLOAD_TOO_LARGE, format!("body exceeds {max} bytes; split the batch"))
            }
            IngestError::BadEncoding(e) => (StatusCode::BAD_REQUEST, format!("cannot decode gzip body: {e}")),
            IngestError::UnsupportedEncoding(e) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Encoding `{e}` is not supported: send the body as is (identity) or gzip"),
            ),
            IngestError::BadIdempotencyKey => {
                (StatusCode::BAD_REQUEST, "Idempotency-Key must be 1..200 visible ASCII characters".to_string())
            }
            IngestError::KeyReused(key) => (
                StatusCode::CONFLICT,
                format!("Idempotency-Key {key} was used for a different body in the last 24 h; nothing from this batch was appended (send a new key for a new batch)"),
            ),
            IngestError::KeyBusy(key, secs) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("Idempotency-Key {key} is being appended by another request; nothing from this one was appended, retry it after {secs} s"),
            ),
            IngestError::LogUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "event log unavailable; nothing from this batch was acknowledged, retry it".to_string(),
            ),
        };
        metrics::counter!(tm::INGEST_RESPONSES, "status" => status.as_str().to_string())
            .increment(1);
        let mut response = (status, Json(serde_json::json!({ "detail": detail }))).into_response();
        let retry_after = match self {
            IngestError::LogUnavailable => Some(1),
            IngestError::KeyBusy(_, secs) => Some(secs),
            _ => None,
        };
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

async fn ingest_events(
    State(state): State<IngestState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, IngestError> {
    let started = Instant::now();
    authorize(&headers, &state.token)?;
    let idempotency_key = idempotency_key(&headers)?;
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => IngestError::TooLarge(state.max_body_bytes),
        _ => IngestError::BadEncoding(rejection.body_text()),
    })?;
    let body = decode_body(&headers, body, state.max_body_bytes)?;

    let limits = &state.limits;
    state.catalog.refresh().await;
    let validated = batch::validate(
        &body,
        1,
        Timestamp::now(),
        &limits.wire,
        limits.max_listed_rejects,
        &*state.catalog.read(),
        &mut BatchClaims::default(),
    );
    metrics::histogram!(tm::INGEST_BATCH_LINES)
        .record((validated.events.len() + validated.rejected_count) as f64);
    let truncated = validated.rejected.len() < validated.rejected_count;
    let response = IngestResponse {
        accepted: validated.events.len(),
        rejected_count: validated.rejected_count,
        note: truncated.then(|| {
            format!(
                "only the first {} of {} rejected lines are listed",
                validated.rejected.len(),
                validated.rejected_count
            )
        }),
        rejected_truncated: truncated,
        rejected: validated.rejected,
    };
    let response_bytes = serde_json::to_vec(&response).expect("response serializes");
    let status = if response.accepted == 0 && response.rejected_count > 0 {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };

    let mut replayed = false;
    if response.accepted > 0 {
        let counts = batch::kind_counts(&validated.events);
        let append = AppendBatch {
            idempotency: idempotency_key
                .clone()
                .map(|key| Idempotency::for_body(key, &body, response_bytes.clone())),
            events: validated.events.into(),
        };
        let key = || idempotency_key.clone().unwrap_or_default();
        match append_body(&*state.log, append, &body).await {
            Ok(AppendOutcome::Appended { .. }) => batch::count_accepted(counts),
            Ok(AppendOutcome::Duplicate { response }) => {
                metrics::counter!(tm::INGEST_IDEMPOTENT_REPLAYS).increment(1);
                replayed = true;
                return Ok(json_response(StatusCode::OK, response, replayed));
            }
            Ok(AppendOutcome::Conflict) => return Err(IngestError::KeyReused(key())),
            Ok(AppendOutcome::Busy { retry_after }) => {
                let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
                return Err(IngestError::KeyBusy(key(), secs));
            }
            Err(e) => {
                tracing::error!(error = %e, "event log append failed");
                return Err(IngestError::LogUnavailable);
            }
        }
    }
    metrics::histogram!(tm::INGEST_BATCH_SECONDS).record(started.elapsed().as_secs_f64());
    Ok(json_response(status, response_bytes, replayed))
}

fn json_response(status: StatusCode, body: Vec<u8>, replayed: bool) -> Response {
    metrics::counter!(tm::INGEST_RESPONSES, "status" => status.as_str().to_string()).increment(1);
    let mut r = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if replayed {
        r.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    r
}

fn authorize(headers: &HeaderMap, token: &str) -> Result<(), IngestError> {
    let sent = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(IngestError::Unauthorized)?;
    // Constant time: the comparison must not reveal how much of a guess matched.
    if bool::from(sent.as_bytes().ct_eq(token.as_bytes())) {
        Ok(())
    } else {
        Err(IngestError::Unauthorized)
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, IngestError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().map_err(|_| IngestError::BadIdempotencyKey)?;
    if key.is_empty() || key.len() > 200 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(IngestError::BadIdempotencyKey);
    }
    Ok(Some(key.to_string()))
}

/// The body with its `Content-Encoding` undone. Only `gzip` (or `x-gzip`)
/// and `identity` are understood; anything else is refused (415) rather
/// than read as plain text. Codings listed in order of application
/// (`gzip, gzip`: gzipped twice) are undone in reverse, each one bounded:
/// the decompressed size may not exceed `max` either (a small gzip can
/// expand enormously).
fn decode_body(headers: &HeaderMap, body: Bytes, max: usize) -> Result<Bytes, IngestError> {
    let mut gzip_layers = 0usize;
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let value = value.to_str().map_err(|_| {
            IngestError::UnsupportedEncoding(String::from_utf8_lossy(value.as_bytes()).into())
        })?;
        for coding in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                gzip_layers += 1;
            } else if !coding.eq_ignore_ascii_case("identity") {
                return Err(IngestError::UnsupportedEncoding(
                    coding.chars().take(40).collect(),
                ));
            }
        }
    }
    // Each layer may expand to `max`: a long list of stored (uncompressed)
    // gzip wrappers would cost `max` bytes of copying per layer.
    if gzip_layers > MAX_GZIP_LAYERS {
        return Err(IngestError::UnsupportedEncoding(format!(
            "gzip applied {gzip_layers} times (at most {MAX_GZIP_LAYERS})"
        )));
    }
    let mut body = body;
    for _ in 0..gzip_layers {
        body = gunzip(&body, max)?;
    }
    Ok(body)
}

/// Most `gzip` codings undone on one body.
pub const MAX_GZIP_LAYERS: usize = 2;

fn gunzip(body: &[u8], max: usize) -> Result<Bytes, IngestError> {
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(max));
    let mut decoder = flate2::read::MultiGzDecoder::new(body).take(max as u64 + 1);
    decoder
        .read_to_end(&mut out)
        .map_err(|e| IngestError::BadEncoding(e.to_string()))?;
    if out.len() > max {
        return Err(IngestError::TooLarge(max));
    }
    Ok(out.into())
}
