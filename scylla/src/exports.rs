//! [`ExportJobStore`] on CQL: export jobs and their files, shared by every
//! API replica (they share no disk).
//!
//! - `export_jobs`: one row per job. Its `lease` column is the claim's
//!   deadline in ms while the job is queued (0) or running, and -1 once it
//!   finished; every change of a job's state is a lightweight transaction
//!   conditioned on what the writer saw: a claim on `attempt` and `lease`
//!   (so of concurrent claims one applies, and a renewed lease is not
//!   taken), progress, finish and fail on `attempt` and `status` (so a
//!   holder that lost its lease is fenced out).
//! - `export_job_queue`: the jobs not finished, oldest first, in one
//!   partition (it holds only the jobs waiting or running): where a claim
//!   looks.
//! - `export_jobs_by_owner`: each owner's job ids.
//! - `export_chunks`: chunk `n` of an attempt, a partition each (1 MB), and
//!   `export_chunk_index`, the chunks each job's attempts wrote: what
//!   expiry deletes.

use crate::accounts::stmt;
use crate::idempotency::Lwt;
use crate::statements::Stmt;
use crate::store::{corrupt, ts, ScyllaStore};
use async_trait::async_trait;
use hindsight_contracts::{ExportJob, ExportJobStore, JobStatus, Result};
use hindsight_schemas::Timestamp;
use scylla::value::CqlTimestamp;

/// The one partition of `export_job_queue`.
const QUEUE: i32 = 0;
/// `lease` of a finished job: matches no claim.
const FINISHED: i64 = -1;

const JOB_COLUMNS: &str = "id, owner, request, status, total_rows, rows, bytes, chunks, \
                           attempt, lease, error, created_at, finished_at";

type JobRow = (
    String,
    String,
    String,
    String,
    i64,
    i64,
    i64,
    i32,
    i32,
    i64,
    Option<String>,
    CqlTimestamp,
    Option<CqlTimestamp>,
);

/// The statements of this module, appended to [`crate::statements::all`].
pub fn statements(ks: &str) -> Vec<Stmt> {
    vec![
        stmt(
            "insert_export_job",
            format!("INSERT INTO {ks}.export_jobs ({JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            &["text", "text", "text", "text", "bigint", "bigint", "bigint", "int", "int", "bigint", "text", "timestamp", "timestamp"],
        ),
        stmt(
            "insert_export_job_by_owner",
            format!("INSERT INTO {ks}.export_jobs_by_owner (owner, id) VALUES (?, ?)"),
            &["text", "text"],
        ),
        stmt(
            "enqueue_export_job",
            format!("INSERT INTO {ks}.export_job_queue (shard, created_at, id) VALUES (?, ?, ?)"),
            &["int", "timestamp", "text"],
        ),
        stmt(
            "select_export_job",
            format!("SELECT {JOB_COLUMNS} FROM {ks}.export_jobs WHERE id = ?"),
            &["text"],
        ),
        stmt(
            "select_export_jobs_by_owner",
            format!("SELECT id FROM {ks}.export_jobs_by_owner WHERE owner = ?"),
            &["text"],
        ),
        stmt(
            "select_export_job_queue",
            format!("SELECT created_at, id FROM {ks}.export_job_queue WHERE shard = ?"),
            &["int"],
        ),
        stmt(
            "claim_export_job",
            format!("UPDATE {ks}.export_jobs SET status = 'running', attempt = ?, lease = ? WHERE id = ? IF attempt = ? AND lease = ?"),
            &["int", "bigint", "text", "int", "bigint"],
        ),
        stmt(
            "export_job_progress",
            format!("UPDATE {ks}.export_jobs SET rows = ?, bytes = ?, lease = ? WHERE id = ? IF attempt = ? AND status = 'running'"),
            &["bigint", "bigint", "bigint", "text", "int"],
        ),
        stmt(
            "finish_export_job",
            format!("UPDATE {ks}.export_jobs SET status = 'done', rows = ?, bytes = ?, chunks = ?, lease = -1, finished_at = ? WHERE id = ? IF attempt = ? AND status = 'running'"),
            &["bigint", "bigint", "int", "timestamp", "text", "int"],
        ),
        stmt(
            "fail_export_job",
            format!("UPDATE {ks}.export_jobs SET status = 'failed', error = ?, lease = -1, finished_at = ? WHERE id = ? IF attempt = ? AND status = 'running'"),
            &["text", "timestamp", "text", "int"],
        ),
        stmt(
            "dequeue_export_job",
            format!("DELETE FROM {ks}.export_job_queue WHERE shard = ? AND created_at = ? AND id = ?"),
            &["int", "timestamp", "text"],
        ),
        stmt(
            "insert_export_chunk",
            format!("INSERT INTO {ks}.export_chunks (job_id, attempt, n, data) VALUES (?, ?, ?, ?)"),
            &["text", "int", "int", "blob"],
        ),
        stmt(
            "index_export_chunk",
            format!("INSERT INTO {ks}.export_chunk_index (job_id, attempt, n) VALUES (?, ?, ?)"),
            &["text", "int", "int"],
        ),
        stmt(
            "select_export_chunk",
            format!("SELECT data FROM {ks}.export_chunks WHERE job_id = ? AND attempt = ? AND n = ?"),
            &["text", "int", "int"],
        ),
        stmt(
            "select_export_chunk_index",
            format!("SELECT attempt, n FROM {ks}.export_chunk_index WHERE job_id = ?"),
            &["text"],
        ),
        stmt(
            "delete_export_chunk",
            format!("DELETE FROM {ks}.export_chunks WHERE job_id = ? AND attempt = ? AND n = ?"),
            &["text", "int", "int"],
        ),
        stmt(
            "unindex_export_chunk",
            format!("DELETE FROM {ks}.export_chunk_index WHERE job_id = ? AND attempt = ? AND n = ?"),
            &["text", "int", "int"],
        ),
        stmt(
            "all_export_jobs",
            format!("SELECT id, owner, attempt, finished_at FROM {ks}.export_jobs"),
            &[],
        ),
        stmt(
            "delete_export_job",
            format!("DELETE FROM {ks}.export_jobs WHERE id = ?"),
            &["text"],
        ),
        stmt(
            "delete_export_job_by_owner",
            format!("DELETE FROM {ks}.export_jobs_by_owner WHERE owner = ? AND id = ?"),
            &["text", "text"],
        ),
    ]
}

fn job_from(row: JobRow) -> Result<ExportJob> {
    let (
        id,
        owner,
        request,
        status,
        total,
        rows,
        bytes,
        chunks,
        attempt,
        lease,
        error,
        created,
        finished,
    ) = row;
    let status = JobStatus::parse(&status)
        .ok_or_else(|| corrupt(format!("export job {id}: status {status:?}")))?;
    Ok(ExportJob {
        id,
        owner,
        request,
        status,
        total_rows: total.max(0) as u64,
        rows: rows.max(0) as u64,
        bytes: bytes.max(0) as u64,
        chunks: chunks.max(0) as u32,
        attempt: attempt.max(0) as u32,
        lease_until: (status == JobStatus::Running).then_some(Timestamp(lease)),
        error,
        created_at: Timestamp(created.0),
        finished_at: finished.map(|t| Timestamp(t.0)),
    })
}

impl ScyllaStore {
    async fn job_row(&self, id: &str) -> Result<Option<(ExportJob, i64)>> {
        let rows: Vec<JobRow> = self
            .rows("read_export_job", "select_export_job", (id,))
            .await?;
        rows.into_iter()
            .next()
            .map(|row| {
                let lease = row.9;
                job_from(row).map(|job| (job, lease))
            })
            .transpose()
    }

    async fn fenced(
        &self,
        name: &str,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<bool> {
        Ok(Lwt::read(self.exec("export_job_update", name, values).await?)?.applied)
    }

    async fn dequeue(&self, job: &ExportJob) -> Result<()> {
        self.exec(
            "export_job_update",
            "dequeue_export_job",
            (QUEUE, ts(job.created_at.0), job.id.as_str()),
        )
        .await
        .map(|_| ())
    }

    /// Deletes the chunks of `id` for which `doomed(attempt)` holds.
    async fn delete_chunks(&self, id: &str, doomed: impl Fn(i32) -> bool) -> Result<()> {
        let written: Vec<(i32, i32)> = self
            .rows("expire_export_jobs", "select_export_chunk_index", (id,))
            .await?;
        for (attempt, n) in written.into_iter().filter(|(a, _)| doomed(*a)) {
            self.exec(
                "expire_export_jobs",
                "delete_export_chunk",
                (id, attempt, n),
            )
            .await?;
            self.exec(
                "expire_export_jobs",
                "unindex_export_chunk",
                (id, attempt, n),
            )
            .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl ExportJobStore for ScyllaStore {
    /// The job's row, then its owner's and the queue's entries (a job
    /// whose entries failed is still read by id; the create can be
    /// retried).
    async fn create_job(&self, job: ExportJob) -> Result<()> {
        let lease = match job.status {
            JobStatus::Done | JobStatus::Failed => FINISHED,
            _ => job.lease_until.map_or(0, |t| t.0),
        };
        self.exec(
            "create_export_job",
            "insert_export_job",
            (
                job.id.as_str(),
                job.owner.as_str(),
                job.request.as_str(),
                job.status.as_str(),
                job.total_rows as i64,
                job.rows as i64,
                job.bytes as i64,
                job.chunks as i32,
                job.attempt as i32,
                lease,
                job.error.as_deref(),
                ts(job.created_at.0),
                job.finished_at.map(|t| ts(t.0)),
            ),
        )
        .await?;
        self.exec(
            "create_export_job",
            "insert_export_job_by_owner",
            (job.owner.as_str(), job.id.as_str()),
        )
        .await?;
        if lease != FINISHED {
            self.exec(
                "create_export_job",
                "enqueue_export_job",
                (QUEUE, ts(job.created_at.0), job.id.as_str()),
            )
            .await?;
        }
        Ok(())
    }

    async fn job(&self, id: &str) -> Result<Option<ExportJob>> {
        Ok(self.job_row(id).await?.map(|(job, _)| job))
    }

    async fn jobs(&self, owner: &str) -> Result<Vec<ExportJob>> {
        let ids: Vec<(String,)> = self
            .rows("read_export_jobs", "select_export_jobs_by_owner", (owner,))
            .await?;
        let mut out = Vec::new();
        for (id,) in ids {
            if let Some(job) = self.job(&id).await? {
                out.push(job);
            }
        }
        out.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        Ok(out)
    }

    /// Oldest first through the queue: a job that is claimable as read is
    /// claimed by a transaction on the attempt and lease read, which
    /// applies for exactly one of the claims that read them.
    async fn claim_job(&self, now: Timestamp, until: Timestamp) -> Result<Option<ExportJob>> {
        let queued: Vec<(CqlTimestamp, String)> = self
            .rows("claim_export_job", "select_export_job_queue", (QUEUE,))
            .await?;
        for (_, id) in queued {
            let Some((job, lease)) = self.job_row(&id).await? else {
                continue;
            };
            let claimable = match job.status {
                JobStatus::Queued => true,
                JobStatus::Running => lease <= now.0,
                JobStatus::Done | JobStatus::Failed => false,
            };
            if !claimable {
                continue;
            }
            let attempt = job.attempt as i32 + 1;
            let applied = self
                .fenced(
                    "claim_export_job",
                    (attempt, until.0, id.as_str(), job.attempt as i32, lease),
                )
                .await?;
            if applied {
                self.delete_chunks(&id, |a| a < attempt).await?;
                return Ok(Some(ExportJob {
                    status: JobStatus::Running,
                    attempt: attempt as u32,
                    lease_until: Some(until),
                    ..job
                }));
            }
        }
        Ok(None)
    }

    async fn job_progress(
        &self,
        id: &str,
        attempt: u32,
        rows: u64,
        bytes: u64,
        until: Timestamp,
    ) -> Result<bool> {
        self.fenced(
            "export_job_progress",
            (rows as i64, bytes as i64, until.0, id, attempt as i32),
        )
        .await
    }

    /// Indexed first, then stored: every chunk stored is one expiry finds.
    async fn put_chunk(&self, id: &str, attempt: u32, n: u32, data: Vec<u8>) -> Result<()> {
        let (attempt, n) = (attempt as i32, n as i32);
        self.exec("put_export_chunk", "index_export_chunk", (id, attempt, n))
            .await?;
        self.exec(
            "put_export_chunk",
            "insert_export_chunk",
            (id, attempt, n, data),
        )
        .await
        .map(|_| ())
    }

    async fn finish_job(
        &self,
        id: &str,
        attempt: u32,
        rows: u64,
        bytes: u64,
        chunks: u32,
        at: Timestamp,
    ) -> Result<bool> {
        let done = self
            .fenced(
                "finish_export_job",
                (
                    rows as i64,
                    bytes as i64,
                    chunks as i32,
                    ts(at.0),
                    id,
                    attempt as i32,
                ),
            )
            .await?;
        if done {
            if let Some(job) = self.job(id).await? {
                self.dequeue(&job).await?;
            }
        }
        Ok(done)
    }

    async fn fail_job(&self, id: &str, attempt: u32, error: String, at: Timestamp) -> Result<bool> {
        let failed = self
            .fenced(
                "fail_export_job",
                (error.as_str(), ts(at.0), id, attempt as i32),
            )
            .await?;
        if failed {
            if let Some(job) = self.job(id).await? {
                self.dequeue(&job).await?;
            }
        }
        Ok(failed)
    }

    async fn chunk(&self, id: &str, attempt: u32, n: u32) -> Result<Option<Vec<u8>>> {
        let rows: Vec<(Vec<u8>,)> = self
            .rows(
                "read_export_chunk",
                "select_export_chunk",
                (id, attempt as i32, n as i32),
            )
            .await?;
        Ok(rows.into_iter().next().map(|(data,)| data))
    }

    /// A scan of the jobs (kept for the retention only, so few): each one
    /// finished before `before` goes with every chunk; the others lose the
    /// chunks of attempts other than their current one.
    async fn expire_jobs(&self, before: Timestamp) -> Result<u64> {
        let mut jobs: Vec<(String, String, i32, Option<CqlTimestamp>)> = Vec::new();
        self.scan("all_export_jobs", |rows| {
            for row in rows
                .rows::<(String, String, i32, Option<CqlTimestamp>)>()
                .map_err(corrupt)?
            {
                jobs.push(row.map_err(corrupt)?);
            }
            Ok(())
        })
        .await?;
        let mut deleted = 0;
        for (id, owner, attempt, finished) in jobs {
            if finished.is_some_and(|t| t.0 < before.0) {
                self.delete_chunks(&id, |_| true).await?;
                self.exec(
                    "expire_export_jobs",
                    "delete_export_job_by_owner",
                    (owner.as_str(), id.as_str()),
                )
                .await?;
                self.exec("expire_export_jobs", "delete_export_job", (id.as_str(),))
                    .await?;
                deleted += 1;
            } else {
                self.delete_chunks(&id, |a| a != attempt).await?;
            }
        }
        Ok(deleted)
    }
}
