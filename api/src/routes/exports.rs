//! Export jobs over HTTP (beyond SPEC.md; issue 13): `POST /v1/exports`
//! checks an export exactly as `GET /v1/export/{kind}` does (the same
//! parser, the same plan check, [`export::prepare`]) and records it as a
//! job ([`crate::jobs`] runs it); `GET /v1/exports` and
//! `/v1/exports/{id}` show the caller's jobs, `/v1/exports/{id}/download`
//! streams a finished job's file from its stored chunks.
//!
//! A job belongs to the key's organization (or the key, without one):
//! every other caller gets 404 for it, as for an id that does not exist.

use super::export::{self, Kind};
use super::path_id;
use crate::auth::Caller;
use crate::error::{issue, ApiError};
use crate::jobs::{owner, response, Request};
use crate::keys::random_hex;
use crate::query::ExportJobQuery;
use crate::ApiState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hindsight_contracts::{ExportJob, JobStatus};
use hindsight_schemas::api::{ErrorResponse, ExportJobList, ExportJobResponse};
use hindsight_telemetry as tm;

/// Creates an export job: the export `/v1/export/{kind}` would stream,
/// written in the background instead, for ranges too large for one
/// response. Validated and gated by the plan like that route; answered at
/// once with the queued job (`Location` is where to poll it).
#[utoipa::path(post, path = "/v1/exports", tag = "export",
    params(ExportJobQuery),
    responses(
        (status = 202, description = "The job, queued", body = ExportJobResponse),
        (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse),
        (status = 422, body = hindsight_schemas::api::ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn create_export_job(
    State(state): State<ApiState>,
    caller: Caller,
    q: ExportJobQuery,
) -> Result<Response, ApiError> {
    let store = &state.jobs.store;
    let kind = Kind::parse(q.kind()?).ok_or_else(|| {
        ApiError::Validation(vec![issue(
            "query",
            "kind",
            "Input should be 'prices', 'books', 'metrics', 'trades' or 'candles'",
            "enum",
        )])
    })?;
    let q_export = q.export(kind.by_token(), kind.by_resolution())?;
    let export = export::prepare(&state, &caller, &q_export, kind).await?;
    let total_rows = export.rows(&state).await?;
    let request = Request {
        params: q.params(),
        filename: export.filename(),
    };
    let request =
        serde_json::to_string(&request).map_err(|e| ApiError::invariant(e.to_string()))?;
    let job = ExportJob::queued(
        random_hex(16),
        owner(&caller),
        request,
        total_rows,
        caller.now,
    );
    store.create_job(job.clone()).await?;
    metrics::counter!(tm::API_EXPORT_JOBS, "state" => "queued").increment(1);
    let mut answer = (
        StatusCode::ACCEPTED,
        Json(response(&job, &state.jobs.config)?),
    )
        .into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/exports/{}", job.id)) {
        answer.headers_mut().insert(header::LOCATION, location);
    }
    Ok(answer)
}

/// The caller's export jobs (its organization's), newest first.
#[utoipa::path(get, path = "/v1/exports", tag = "export",
    responses((status = 200, body = ExportJobList), (status = 401, body = ErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn list_export_jobs(
    State(state): State<ApiState>,
    caller: Caller,
) -> Result<Json<ExportJobList>, ApiError> {
    let jobs = state.jobs.store.jobs(&owner(&caller)).await?;
    let data = jobs
        .iter()
        .map(|job| response(job, &state.jobs.config))
        .collect::<Result<_, _>>()?;
    Ok(Json(ExportJobList { data }))
}

/// One export job: its status and progress, and once `done` its
/// `download_url`.
#[utoipa::path(get, path = "/v1/exports/{id}", tag = "export",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, body = ExportJobResponse), (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse), (status = 422, body = hindsight_schemas::api::ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn get_export_job(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ExportJobResponse>, ApiError> {
    let job = owned(&state, &caller, id).await?;
    Ok(Json(response(&job, &state.jobs.config)?))
}

/// The file of a finished export job, byte for byte what
/// `/v1/export/{kind}` streams for the same parameters.
#[utoipa::path(get, path = "/v1/exports/{id}/download", tag = "export",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, description = "The file (`Content-Length` set). A body cut short is a download that failed part way: retry it.",
            content((String = "text/csv"), (Vec<u8> = "application/vnd.apache.parquet"))),
        (status = 401, body = ErrorResponse), (status = 404, body = ErrorResponse),
        (status = 409, description = "The job is not done (queued, running or failed)", body = ErrorResponse),
        (status = 422, body = hindsight_schemas::api::ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn download_export_job(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, id).await?;
    if job.status != JobStatus::Done {
        return Err(ApiError::NotReady(format!(
            "Export job {} is {}: its file can be downloaded once its status is done.",
            job.id,
            job.status.as_str()
        )));
    }
    let shown = response(&job, &state.jobs.config)?;
    let store = state.jobs.store.clone();
    let (id, attempt, chunks) = (job.id.clone(), job.attempt, job.chunks);
    // One chunk read at a time, as the connection takes them: memory stays
    // one chunk whatever the file's size. A chunk that cannot be read cuts
    // the body short (no final chunk), as a failed streamed export does.
    let pieces = futures_util::stream::unfold(0u32, move |n| {
        let (store, id) = (store.clone(), id.clone());
        async move {
            if n >= chunks {
                return None;
            }
            let piece = match store.chunk(&id, attempt, n).await {
                Ok(Some(data)) => Ok(bytes::Bytes::from(data)),
                Ok(None) => {
                    tracing::error!(job = %id, chunk = n, "export job file: a chunk is missing");
                    Err(std::io::Error::other("export file chunk missing"))
                }
                Err(e) => {
                    tracing::error!(job = %id, chunk = n, error = %e, "export job file: reading a chunk failed");
                    Err(std::io::Error::other("export file chunk unreadable"))
                }
            };
            // After an error, nothing more: the body ends there, cut.
            let next = if piece.is_ok() { n + 1 } else { chunks };
            Some((piece, next))
        }
    });
    let mut answer = (StatusCode::OK, Body::from_stream(pieces)).into_response();
    let headers = answer.headers_mut();
    let content_type = match shown.format.as_str() {
        "parquet" => crate::export::Format::Parquet,
        _ => crate::export::Format::Csv,
    }
    .content_type();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(job.bytes));
    if let Ok(value) =
        HeaderValue::from_str(&format!("attachment; filename=\"{}\"", shown.filename))
    {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    Ok(answer)
}

/// The job `id` if the caller owns it; 404 for any other.
async fn owned(state: &ApiState, caller: &Caller, id: String) -> Result<ExportJob, ApiError> {
    let id = path_id("id", id)?;
    let job = state.jobs.store.job(&id).await?;
    job.filter(|job| job.owner == owner(caller))
        .ok_or_else(|| ApiError::NotFound("Export job not found".into()))
}
