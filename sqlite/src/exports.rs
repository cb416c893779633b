//! Export jobs and their files in `exports.db` ([`ExportJobStore`]).
//!
//! A file of its own: a job writes megabytes of chunks, which must not
//! queue behind the projector's transactions on `store.db` nor the API's
//! usage counts in `accounts.db`. `synchronous=FULL`: a job answered with
//! `202` is on disk, and so is every chunk a finished job names. Every API
//! process on the data directory opens it; a claim is one `UPDATE …
//! RETURNING`, which SQLite's write lock makes atomic across them.

use crate::db::{blocking, Durability, SideFile};
use crate::store::SqliteStore;
use crate::{CResult, Error, Result};
use async_trait::async_trait;
use hindsight_contracts::{ExportJob, ExportJobStore, JobStatus};
use hindsight_schemas::Timestamp;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::Arc;

pub(crate) const EXPORTS_FILE: &str = "exports.db";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS export_jobs (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, request TEXT NOT NULL,
    status TEXT NOT NULL, total_rows INTEGER NOT NULL, rows INTEGER NOT NULL,
    bytes INTEGER NOT NULL, chunks INTEGER NOT NULL, attempt INTEGER NOT NULL,
    lease_until INTEGER, error TEXT, created_at INTEGER NOT NULL,
    finished_at INTEGER);
CREATE INDEX IF NOT EXISTS export_jobs_by_owner ON export_jobs (owner, created_at);
CREATE INDEX IF NOT EXISTS export_jobs_by_status ON export_jobs (status, created_at);
CREATE TABLE IF NOT EXISTS export_chunks (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, n INTEGER NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (job_id, attempt, n));
";

const COLUMNS: &str = "id, owner, request, status, total_rows, rows, bytes, chunks, attempt, \
                       lease_until, error, created_at, finished_at";

pub(crate) struct ExportJobs {
    file: Arc<SideFile>,
}

impl ExportJobs {
    pub(crate) fn new(dir: &Path) -> Self {
        ExportJobs {
            file: Arc::new(SideFile::new(dir, EXPORTS_FILE, Durability::Full, SCHEMA)),
        }
    }

    async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R> + Send + 'static,
    ) -> CResult<R> {
        let file = self.file.clone();
        blocking(move || file.with(|c| f(c))).await
    }
}

fn job_from(r: &rusqlite::Row) -> rusqlite::Result<(ExportJob, String)> {
    let status: String = r.get(3)?;
    Ok((
        ExportJob {
            id: r.get(0)?,
            owner: r.get(1)?,
            request: r.get(2)?,
            status: JobStatus::Queued,
            total_rows: r.get::<_, i64>(4)? as u64,
            rows: r.get::<_, i64>(5)? as u64,
            bytes: r.get::<_, i64>(6)? as u64,
            chunks: r.get(7)?,
            attempt: r.get(8)?,
            lease_until: r.get::<_, Option<i64>>(9)?.map(Timestamp),
            error: r.get(10)?,
            created_at: Timestamp(r.get(11)?),
            finished_at: r.get::<_, Option<i64>>(12)?.map(Timestamp),
        },
        status,
    ))
}

/// A row as a job, its status checked.
fn checked((mut job, status): (ExportJob, String)) -> Result<ExportJob> {
    job.status = JobStatus::parse(&status)
        .ok_or_else(|| Error::Corrupt(format!("export job {}: status {status:?}", job.id)))?;
    Ok(job)
}

fn one(c: &Connection, sql: &str, p: impl rusqlite::Params) -> Result<Option<ExportJob>> {
    c.query_row(sql, p, job_from)
        .optional()?
        .map(checked)
        .transpose()
}

#[async_trait]
impl ExportJobStore for SqliteStore {
    async fn create_job(&self, job: ExportJob) -> CResult<()> {
        self.exports
            .run(move |c| {
                c.execute(
                    &format!(
                        "INSERT INTO export_jobs ({COLUMNS}) VALUES \
                         (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
                    ),
                    params![
                        job.id,
                        job.owner,
                        job.request,
                        job.status.as_str(),
                        job.total_rows as i64,
                        job.rows as i64,
                        job.bytes as i64,
                        job.chunks,
                        job.attempt,
                        job.lease_until.map(|t| t.millis()),
                        job.error,
                        job.created_at.millis(),
                        job.finished_at.map(|t| t.millis()),
                    ],
                )?;
                Ok(())
            })
            .await
    }

    async fn job(&self, id: &str) -> CResult<Option<ExportJob>> {
        let id = id.to_string();
        self.exports
            .run(move |c| {
                one(
                    c,
                    &format!("SELECT {COLUMNS} FROM export_jobs WHERE id = ?1"),
                    params![id],
                )
            })
            .await
    }

    async fn jobs(&self, owner: &str) -> CResult<Vec<ExportJob>> {
        let owner = owner.to_string();
        self.exports
            .run(move |c| {
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM export_jobs WHERE owner = ?1 \
                     ORDER BY created_at DESC, id DESC"
                ))?;
                let rows = stmt
                    .query_map(params![owner], job_from)?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                rows.into_iter().map(checked).collect()
            })
            .await
    }

    /// One `UPDATE … RETURNING`: the process whose statement changes the
    /// row is the one that claimed it. The chunks earlier attempts left are
    /// deleted after: nothing reads them.
    async fn claim_job(&self, now: Timestamp, until: Timestamp) -> CResult<Option<ExportJob>> {
        self.exports
            .run(move |c| {
                let job = one(
                    c,
                    &format!(
                        "UPDATE export_jobs SET status = 'running', attempt = attempt + 1, \
                         lease_until = ?2 WHERE id = (SELECT id FROM export_jobs \
                         WHERE status = 'queued' OR (status = 'running' AND lease_until <= ?1) \
                         ORDER BY created_at, id LIMIT 1) RETURNING {COLUMNS}"
                    ),
                    params![now.millis(), until.millis()],
                )?;
                if let Some(job) = &job {
                    c.execute(
                        "DELETE FROM export_chunks WHERE job_id = ?1 AND attempt < ?2",
                        params![job.id, job.attempt],
                    )?;
                }
                Ok(job)
            })
            .await
    }

    async fn job_progress(
        &self,
        id: &str,
        attempt: u32,
        rows: u64,
        bytes: u64,
        until: Timestamp,
    ) -> CResult<bool> {
        let id = id.to_string();
        self.exports
            .run(move |c| {
                let n = c.execute(
                    "UPDATE export_jobs SET rows = ?3, bytes = ?4, lease_until = ?5 \
                     WHERE id = ?1 AND attempt = ?2 AND status = 'running'",
                    params![id, attempt, rows as i64, bytes as i64, until.millis()],
                )?;
                Ok(n == 1)
            })
            .await
    }

    async fn put_chunk(&self, id: &str, attempt: u32, n: u32, data: Vec<u8>) -> CResult<()> {
        let id = id.to_string();
        self.exports
            .run(move |c| {
                c.execute(
                    "INSERT OR REPLACE INTO export_chunks (job_id, attempt, n, data) \
                     VALUES (?1, ?2, ?3, ?4)",
                    params![id, attempt, n, data],
                )?;
                Ok(())
            })
            .await
    }

    async fn finish_job(
        &self,
        id: &str,
        attempt: u32,
        rows: u64,
        bytes: u64,
        chunks: u32,
        at: Timestamp,
    ) -> CResult<bool> {
        let id = id.to_string();
        self.exports
            .run(move |c| {
                let n = c.execute(
                    "UPDATE export_jobs SET status = 'done', rows = ?3, bytes = ?4, chunks = ?5, \
                     lease_until = NULL, finished_at = ?6 \
                     WHERE id = ?1 AND attempt = ?2 AND status = 'running'",
                    params![id, attempt, rows as i64, bytes as i64, chunks, at.millis()],
                )?;
                Ok(n == 1)
            })
            .await
    }

    async fn fail_job(
        &self,
        id: &str,
        attempt: u32,
        error: String,
        at: Timestamp,
    ) -> CResult<bool> {
        let id = id.to_string();
        self.exports
            .run(move |c| {
                let n = c.execute(
                    "UPDATE export_jobs SET status = 'failed', error = ?3, lease_until = NULL, \
                     finished_at = ?4 WHERE id = ?1 AND attempt = ?2 AND status = 'running'",
                    params![id, attempt, error, at.millis()],
                )?;
                Ok(n == 1)
            })
            .await
    }

    async fn chunk(&self, id: &str, attempt: u32, n: u32) -> CResult<Option<Vec<u8>>> {
        let id = id.to_string();
        self.exports
            .run(move |c| {
                Ok(c.query_row(
                    "SELECT data FROM export_chunks WHERE job_id = ?1 AND attempt = ?2 AND n = ?3",
                    params![id, attempt, n],
                    |r| r.get(0),
                )
                .optional()?)
            })
            .await
    }

    async fn expire_jobs(&self, before: Timestamp) -> CResult<u64> {
        self.exports
            .run(move |c| {
                let tx = c.unchecked_transaction()?;
                let n = tx.execute(
                    "DELETE FROM export_jobs WHERE finished_at IS NOT NULL AND finished_at < ?1",
                    params![before.millis()],
                )?;
                tx.execute(
                    "DELETE FROM export_chunks WHERE NOT EXISTS (SELECT 1 FROM export_jobs j \
                     WHERE j.id = export_chunks.job_id AND j.attempt = export_chunks.attempt)",
                    [],
                )?;
                tx.commit()?;
                Ok(n as u64)
            })
            .await
    }
}
