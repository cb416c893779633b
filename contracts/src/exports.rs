//! Export jobs: bulk exports too large for one response, run in the
//! background by whichever API replica claims them, kept with their output
//! until they expire. Shared by every API replica, like [`crate::AuthStore`]:
//! a replica that dies mid-job leaves a lease that runs out, and another
//! replica (or the same one restarted) claims the job again.
//!
//! The file is stored as numbered chunks of one *attempt*. Every claim
//! starts a new attempt, which writes its chunks from 0; the job records,
//! when it finishes, which attempt wrote the file and how many chunks it
//! has. A holder that lost its lease (it stalled past the lease, and the
//! job was claimed again) can still write chunks of its own attempt, but
//! can no longer change the job: nothing ever reads them, and they are
//! deleted when the job expires.

use crate::Result;
use async_trait::async_trait;
use hindsight_schemas::Timestamp;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobStatus {
    /// Created; no replica has claimed it yet.
    Queued,
    /// A replica holds its lease and writes its file.
    Running,
    /// The file is whole: `rows`, `bytes` and `chunks` describe it.
    Done,
    /// Stopped for good; `error` says why.
    Failed,
}

impl JobStatus {
    pub const ALL: [JobStatus; 4] = [
        JobStatus::Queued,
        JobStatus::Running,
        JobStatus::Done,
        JobStatus::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        JobStatus::ALL.into_iter().find(|j| j.as_str() == s)
    }
}

/// One export job.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportJob {
    /// Random, unguessable: it names the job in URLs.
    pub id: String,
    /// Whose job it is (an organization, or a key without one); only its
    /// owner sees it.
    pub owner: String,
    /// What to export, as the API writes it to run it again after a
    /// restart. Opaque to the store.
    pub request: String,
    pub status: JobStatus,
    /// Rows the export was estimated to hold when it was created.
    pub total_rows: u64,
    /// Rows and bytes written so far (of the file, when done).
    pub rows: u64,
    pub bytes: u64,
    /// Chunks of the finished file, numbered from 0.
    pub chunks: u32,
    /// How many times the job was claimed: the attempt whose chunks form
    /// the file.
    pub attempt: u32,
    /// Until when the current holder's claim stands (running jobs).
    pub lease_until: Option<Timestamp>,
    pub error: Option<String>,
    pub created_at: Timestamp,
    /// When it became done or failed.
    pub finished_at: Option<Timestamp>,
}

impl ExportJob {
    /// A new job, queued.
    pub fn queued(
        id: String,
        owner: String,
        request: String,
        total_rows: u64,
        at: Timestamp,
    ) -> Self {
        ExportJob {
            id,
            owner,
            request,
            status: JobStatus::Queued,
            total_rows,
            rows: 0,
            bytes: 0,
            chunks: 0,
            attempt: 0,
            lease_until: None,
            error: None,
            created_at: at,
            finished_at: None,
        }
    }
}

/// Export jobs and their files.
///
/// Contract (every write visible to every process at once, as
/// [`crate::AuthStore`]):
/// - `create_job` stores a job as given (the API creates them queued, in
///   attempt 0); `job` reads it back,
///   `jobs(owner)` lists an owner's jobs, newest first.
/// - `claim_job(now, until)` takes one job that is queued, or running with
///   a lease that ran out (`lease_until <= now`): it becomes running, its
///   attempt goes up by one and its lease lasts until `until`; the claimed
///   job is returned as it now stands. Of any number of concurrent claims,
///   across processes, exactly one gets a given job. Jobs are claimed
///   oldest first.
/// - `job_progress`, `finish_job` and `fail_job` change the job only while
///   it is running in the caller's `attempt`, and say whether they did:
///   `false` means the lease was lost (the job was claimed again) and the
///   caller must stop. `job_progress` records rows and bytes so far and
///   extends the lease; `finish_job` records the file (rows, bytes, chunk
///   count) and `done`; `fail_job` records the error and `failed`.
/// - `put_chunk(id, attempt, n, data)` stores chunk `n` of an attempt
///   (written again, it is replaced); `chunk(id, attempt, n)` reads it back
///   whole. A finished job's file is chunks `0..chunks` of its `attempt`.
/// - `expire_jobs(before)` deletes every job that finished before `before`
///   with all its chunks, and the chunks of attempts other than a job's
///   current one; it returns how many jobs it deleted.
#[async_trait]
pub trait ExportJobStore: Send + Sync {
    async fn create_job(&self, job: ExportJob) -> Result<()>;
    async fn job(&self, id: &str) -> Result<Option<ExportJob>>;
    async fn jobs(&self, owner: &str) -> Result<Vec<ExportJob>>;
    async fn claim_job(&self, now: Timestamp, until: Timestamp) -> Result<Option<ExportJob>>;
    async fn job_progress(
        &self,
        id: &str,
        attempt: u32,
        rows: u64,
        bytes: u64,
        until: Timestamp,
    ) -> Result<bool>;
    async fn put_chunk(&self, id: &str, attempt: u32, n: u32, data: Vec<u8>) -> Result<()>;
    async fn finish_job(
        &self,
        id: &str,
        attempt: u32,
        rows: u64,
        bytes: u64,
        chunks: u32,
        at: Timestamp,
    ) -> Result<bool>;
    async fn fail_job(&self, id: &str, attempt: u32, error: String, at: Timestamp) -> Result<bool>;
    async fn chunk(&self, id: &str, attempt: u32, n: u32) -> Result<Option<Vec<u8>>>;
    async fn expire_jobs(&self, before: Timestamp) -> Result<u64>;
}
