//! Export jobs: exports too large for one response (`POST /v1/exports`),
//! run in the background by whichever API replica claims them, stored in
//! chunks, downloaded when done ([`crate::routes::exports`]).
//!
//! Every replica runs one worker ([`work`]): it claims a queued
//! job (or one whose holder stopped renewing its lease: the replica died
//! or hung), runs the streamed export's own producer ([`export::Job`])
//! into [`Chunks`] of [`CHUNK_BYTES`] (1 MB), renewing its lease with each
//! chunk, and records the file when it is whole. A claimed job starts over from its first chunk
//! in a new attempt, so a restarted job's file is the same bytes as an
//! uninterrupted one's (and as the streamed route's); an attempt that lost
//! its lease can no longer touch the job ([`ExportJobStore`]'s contract).
//! A job whose store reads fail is claimed again when its lease runs out,
//! at most [`MAX_ATTEMPTS`] times; an export that cannot be produced (its
//! market is gone, the encoder fails) fails at once. Finished jobs and
//! their files are deleted after [`JobConfig::retention`].

use crate::auth::Caller;
use crate::error::ApiError;
use crate::query::ExportJobQuery;
use crate::routes::export::{self, Job, Kind, Pieces, Stop};
use crate::ApiState;
use hindsight_contracts::{ExportJob, ExportJobStore, JobStatus};
use hindsight_schemas::api::ExportJobResponse;
use hindsight_schemas::Timestamp;
use hindsight_telemetry as tm;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Bytes of one stored chunk of a job's file, by default (the last may be
/// shorter): small enough for one CQL cell, large enough that a file is
/// few rows.
pub const CHUNK_BYTES: usize = 1 << 20;
/// Claims of one job before it fails for good.
pub const MAX_ATTEMPTS: u32 = 3;
/// How often a worker deletes expired jobs.
const EXPIRE_EVERY: Duration = Duration::from_secs(60);

/// How export jobs run.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Largest export (rows, as the store counts them) the streamed routes
    /// answer; larger ones are refused with 413 and made jobs.
    pub max_sync_rows: u64,
    /// How long a finished job and its file are kept.
    pub retention: Duration,
    /// How long a claim stands without renewal: a job whose replica died
    /// is claimed again this long after its last chunk.
    pub lease: Duration,
    /// How often an idle worker looks for a job.
    pub poll: Duration,
    /// Bytes of each stored chunk ([`CHUNK_BYTES`]; tests make files of
    /// many chunks with less).
    pub chunk_bytes: usize,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            max_sync_rows: 50_000_000,
            retention: Duration::from_secs(7 * 86_400),
            lease: Duration::from_secs(30),
            poll: Duration::from_secs(1),
            chunk_bytes: CHUNK_BYTES,
        }
    }
}

/// The API's export jobs: where they are stored and how they run.
#[derive(Clone)]
pub struct Jobs {
    pub store: Arc<dyn ExportJobStore>,
    pub config: JobConfig,
}

impl Jobs {
    pub fn new(store: Arc<dyn ExportJobStore>, config: JobConfig) -> Self {
        Jobs { store, config }
    }
}

/// What a job stores to run its export again: its query as given, and the
/// name of its file.
#[derive(Serialize, Deserialize)]
pub(crate) struct Request {
    pub params: BTreeMap<String, String>,
    pub filename: String,
}

impl Request {
    pub(crate) fn parse(job: &ExportJob) -> Result<Request, String> {
        serde_json::from_str(&job.request)
            .map_err(|e| format!("export job {}: stored request: {e}", job.id))
    }

    fn param(&self, name: &str) -> &str {
        self.params.get(name).map_or("", String::as_str)
    }
}

/// Whose a job is: the key's organization, or the key when it has none.
pub(crate) fn owner(caller: &Caller) -> String {
    if caller.key.organization.is_empty() {
        format!("key:{}", caller.key.key_id)
    } else {
        format!("org:{}", caller.key.organization)
    }
}

fn later(t: Timestamp, by: Duration) -> Timestamp {
    Timestamp(t.0.saturating_add(by.as_millis() as i64))
}

/// A job as the API shows it.
pub(crate) fn response(job: &ExportJob, config: &JobConfig) -> Result<ExportJobResponse, ApiError> {
    let request = Request::parse(job).map_err(ApiError::invariant)?;
    let done = job.status == JobStatus::Done;
    let progress = if done {
        1.0
    } else if job.total_rows == 0 {
        0.0
    } else {
        (job.rows as f64 / job.total_rows as f64).min(1.0)
    };
    Ok(ExportJobResponse {
        id: job.id.clone(),
        kind: request.param("kind").to_string(),
        format: match request.param("format") {
            "" => "csv".to_string(),
            format => format.to_string(),
        },
        status: job.status.as_str().into(),
        rows: job.rows,
        bytes: job.bytes,
        total_rows: job.total_rows,
        progress,
        created_at: job.created_at.to_rfc3339(),
        finished_at: job.finished_at.map(Timestamp::to_rfc3339),
        expires_at: job
            .finished_at
            .map(|t| later(t, config.retention).to_rfc3339()),
        error: job.error.clone(),
        filename: request.filename,
        download_url: done.then(|| format!("/v1/exports/{}/download", job.id)),
    })
}

/// Runs jobs on this replica until `stop` turns true (or its sender is
/// dropped), so that a stopped service lets go of its stores.
///
/// A job running then is dropped as a crash would drop it: it is claimed
/// again, from its first chunk, once its lease runs out, and that counts
/// as one of its [`MAX_ATTEMPTS`]. Waiting for it instead would hold the
/// shutdown for as long as the largest export takes.
pub async fn work(state: ApiState, mut stop: watch::Receiver<bool>) {
    let store = state.jobs.store.clone();
    let worker = async {
        let mut expired_at: Option<Instant> = None;
        loop {
            match run_next(&state, &store).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "export job worker: the job store failed"),
            }
            if expired_at.is_none_or(|t| t.elapsed() >= EXPIRE_EVERY) {
                expire(&state, &store).await;
                expired_at = Some(Instant::now());
            }
            tokio::time::sleep(state.jobs.config.poll).await;
        }
    };
    tokio::select! {
        () = worker => {}
        _ = stop.wait_for(|stopped| *stopped) => {}
    }
}

async fn expire(state: &ApiState, store: &Arc<dyn ExportJobStore>) {
    let cutoff = Timestamp(
        state
            .clock
            .now()
            .0
            .saturating_sub(state.jobs.config.retention.as_millis() as i64),
    );
    match store.expire_jobs(cutoff).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(jobs = n, "expired export jobs deleted");
            metrics::counter!(tm::API_EXPORT_JOBS, "state" => "expired").increment(n);
        }
        Err(e) => tracing::error!(error = %e, "export jobs: expiry failed"),
    }
}

/// Claims one job and runs it to its end; `false` when none was waiting.
pub async fn run_next(
    state: &ApiState,
    store: &Arc<dyn ExportJobStore>,
) -> hindsight_contracts::Result<bool> {
    let now = state.clock.now();
    let Some(job) = store
        .claim_job(now, later(now, state.jobs.config.lease))
        .await?
    else {
        return Ok(false);
    };
    metrics::counter!(tm::API_EXPORT_JOBS, "state" => "running").increment(1);
    if job.attempt > MAX_ATTEMPTS {
        let error = format!(
            "gave up after {MAX_ATTEMPTS} attempts (each stopped without finishing; see the \
             API's logs for export job {})",
            job.id
        );
        fail(state, store, &job, error).await?;
        return Ok(true);
    }
    tracing::info!(job = %job.id, attempt = job.attempt, "export job claimed");
    run(state, store, job).await?;
    Ok(true)
}

async fn fail(
    state: &ApiState,
    store: &Arc<dyn ExportJobStore>,
    job: &ExportJob,
    error: String,
) -> hindsight_contracts::Result<()> {
    tracing::warn!(job = %job.id, attempt = job.attempt, %error, "export job failed");
    if store
        .fail_job(&job.id, job.attempt, error, state.clock.now())
        .await?
    {
        metrics::counter!(tm::API_EXPORT_JOBS, "state" => "failed").increment(1);
    }
    Ok(())
}

/// The export a job's stored request names, resolved again.
async fn resolve(state: &ApiState, job: &ExportJob) -> Result<export::Export, ApiError> {
    let request = Request::parse(job).map_err(ApiError::invariant)?;
    let query = ExportJobQuery::from_params(request.params);
    let kind = query.kind().ok().and_then(Kind::parse).ok_or_else(|| {
        ApiError::invariant(format!("export job {}: no export kind stored", job.id))
    })?;
    let q = query.export(kind.by_token(), kind.by_resolution())?;
    export::resolve(state, &q, kind).await
}

async fn run(
    state: &ApiState,
    store: &Arc<dyn ExportJobStore>,
    job: ExportJob,
) -> hindsight_contracts::Result<()> {
    let export = match resolve(state, &job).await {
        Ok(export) => export,
        Err(ApiError::Internal(cause)) if job.attempt < MAX_ATTEMPTS => {
            tracing::warn!(job = %job.id, attempt = job.attempt, error = %cause, "export job stopped: it runs again when its lease expires");
            return Ok(());
        }
        Err(e) => return fail(state, store, &job, e.detail()).await,
    };
    let encoder = match export.encoder() {
        Ok(encoder) => encoder,
        Err(e) => return fail(state, store, &job, e.detail()).await,
    };
    let (kind, format) = (export.kind.as_str(), export.format.as_str());
    let sink = Chunks {
        state: state.clone(),
        store: store.clone(),
        id: job.id.clone(),
        attempt: job.attempt,
        buf: Vec::new(),
        next: 0,
        rows: 0,
        bytes: 0,
        renewed: Instant::now(),
    };
    let (mut producer, series) = Job::new(state.clone(), export, sink);
    let mut outcome = producer.produce(&series, encoder).await;
    if outcome.is_ok() {
        outcome = producer.sink.flush().await;
    }
    let sink = producer.sink;
    match outcome {
        Ok(()) => {
            let finished = store
                .finish_job(
                    &job.id,
                    job.attempt,
                    sink.rows,
                    sink.bytes,
                    sink.next,
                    state.clock.now(),
                )
                .await?;
            if finished {
                tracing::info!(job = %job.id, rows = sink.rows, bytes = sink.bytes, "export job done");
                metrics::counter!(tm::API_EXPORT_JOBS, "state" => "done").increment(1);
                metrics::counter!(tm::API_EXPORT_JOB_BYTES, "kind" => kind, "format" => format)
                    .increment(sink.bytes);
            }
            Ok(())
        }
        Err(Stop::Gone) => {
            tracing::warn!(job = %job.id, attempt = job.attempt, "export job lost its lease to another claim");
            Ok(())
        }
        Err(Stop::Store(e)) if job.attempt < MAX_ATTEMPTS => {
            // Claimed again when the lease runs out: a store that failed
            // now may answer then.
            tracing::warn!(job = %job.id, attempt = job.attempt, error = %e, "export job stopped: a store failed; it runs again when its lease expires");
            Ok(())
        }
        Err(Stop::Store(e)) => fail(state, store, &job, format!("a store failed: {e}")).await,
        Err(Stop::Encode(e)) => fail(state, store, &job, format!("encoding failed: {e}")).await,
        Err(Stop::Stalled) => {
            fail(state, store, &job, "the file could not be written".into()).await
        }
    }
}

/// A job's file as stored chunks of [`JobConfig::chunk_bytes`], the lease renewed
/// with each chunk and at least every third of the lease.
struct Chunks {
    state: ApiState,
    store: Arc<dyn ExportJobStore>,
    id: String,
    attempt: u32,
    buf: Vec<u8>,
    /// Chunks written: the next one's number.
    next: u32,
    rows: u64,
    /// Bytes written in chunks.
    bytes: u64,
    renewed: Instant,
}

impl Chunks {
    async fn write(&mut self) -> Result<(), Stop> {
        let data = std::mem::take(&mut self.buf);
        let len = data.len() as u64;
        self.store
            .put_chunk(&self.id, self.attempt, self.next, data)
            .await?;
        self.next += 1;
        self.bytes += len;
        self.renew().await
    }

    async fn renew(&mut self) -> Result<(), Stop> {
        let until = later(self.state.clock.now(), self.state.jobs.config.lease);
        let held = self
            .store
            .job_progress(&self.id, self.attempt, self.rows, self.bytes, until)
            .await?;
        self.renewed = Instant::now();
        if held {
            Ok(())
        } else {
            Err(Stop::Gone)
        }
    }

    /// Writes what is left as the last chunk.
    async fn flush(&mut self) -> Result<(), Stop> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.write().await
    }
}

impl Pieces for Chunks {
    async fn send(&mut self, piece: Vec<u8>, rows: u64) -> Result<(), Stop> {
        self.rows = rows;
        let size = self.state.jobs.config.chunk_bytes.max(1);
        let mut rest = &piece[..];
        while !rest.is_empty() {
            let take = (size - self.buf.len()).min(rest.len());
            self.buf.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.buf.len() == size {
                self.write().await?;
            }
        }
        if self.renewed.elapsed() >= self.state.jobs.config.lease / 3 {
            self.renew().await?;
        }
        Ok(())
    }
}
