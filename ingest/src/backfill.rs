//! `hindsight backfill FILE…`: NDJSON files (plain or gzip) into the log.
//!
//! Files are read in chunks of lines; each chunk is validated and appended
//! like an HTTP batch, under an idempotency key derived from the file's
//! identity and the chunk number, so re-running an interrupted backfill
//! (within the idempotency window, 24 h) skips what was already appended.
//! Rejected lines go to `FILE.rejects.ndjson` next to the input, with their
//! line numbers and reasons: never dropped silently. Lines are checked
//! against the catalog as HTTP batches are, with the claims of every line
//! accepted earlier in the run on top (a backfill's catalog is not projected
//! while it runs).

use crate::batch;
use crate::catalog::{BatchClaims, CatalogView};
use hindsight_contracts::{AppendBatch, AppendOutcome, EventLog, Idempotency};
use hindsight_schemas::wire::Limits;
use hindsight_schemas::Timestamp;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Lines per append.
const CHUNK_LINES: usize = 20_000;

#[derive(Debug, Default, Clone)]
pub struct FileReport {
    pub path: PathBuf,
    pub lines: u64,
    pub accepted: u64,
    /// Events skipped because an earlier run appended their chunk already.
    pub already_appended: u64,
    pub rejected: u64,
    pub rejects_file: Option<PathBuf>,
}

/// Progress shown on stderr at most twice a second.
pub struct Progress {
    started: Instant,
    last_draw: Instant,
    pub events: u64,
    pub rejects: u64,
    enabled: bool,
}

impl Progress {
    pub fn new(enabled: bool) -> Self {
        let now = Instant::now();
        Progress {
            started: now,
            last_draw: now,
            events: 0,
            rejects: 0,
            enabled,
        }
    }

    fn draw(&mut self, file: &Path, force: bool) {
        if !self.enabled || (!force && self.last_draw.elapsed() < Duration::from_millis(500)) {
            return;
        }
        self.last_draw = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        eprint!(
            "\r\x1b[2K{}: {} events, {:.0} events/s, {} rejects",
            file.display(),
            self.events,
            self.events as f64 / secs,
            self.rejects
        );
        let _ = std::io::stderr().flush();
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

fn open_lines(path: &Path) -> std::io::Result<Box<dyn BufRead>> {
    let mut file = std::fs::File::open(path)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic)?;
    let file = std::fs::File::open(path)?;
    // Gzip by content, whatever the extension says.
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::read::MultiGzDecoder::new(file),
        )))
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 20, file)))
    }
}

fn identity(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let abs = std::fs::canonicalize(path)?;
    Ok(format!("{}:{}:{}", abs.display(), meta.len(), modified))
}

pub fn rejects_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".rejects.ndjson");
    path.with_file_name(name)
}

/// Where a backfill appends, and what its lines are checked against.
pub struct Target<'a> {
    pub log: &'a dyn EventLog,
    /// The read store's catalog.
    pub catalog: &'a Arc<CatalogView>,
    /// Same as HTTP ingest (a backfill is history: nothing in it lies in
    /// the future either).
    pub limits: Limits,
}

/// Backfills one file; errors only for I/O and log failures (bad lines are
/// reported, not errors). `claims` carries what the lines accepted so far in
/// the run claimed (pass the same one for every file of a run).
pub async fn backfill_file(
    target: &Target<'_>,
    claims: &mut BatchClaims,
    path: &Path,
    progress: &mut Progress,
) -> Result<FileReport, String> {
    let (log, limits) = (target.log, &target.limits);
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let identity = identity(path).map_err(fail)?;
    let mut reader = open_lines(path).map_err(fail)?;
    let mut report = FileReport {
        path: path.to_path_buf(),
        ..Default::default()
    };
    let mut rejects: Option<std::fs::File> = None;
    let mut chunk = Vec::with_capacity(CHUNK_LINES * 128);
    let mut chunk_no = 0u64;
    loop {
        chunk.clear();
        let first_line = report.lines + 1;
        let mut lines = 0usize;
        while lines < CHUNK_LINES {
            let n = reader.read_until(b'\n', &mut chunk).map_err(fail)?;
            if n == 0 {
                break;
            }
            if !chunk.ends_with(b"\n") {
                chunk.push(b'\n');
            }
            lines += 1;
        }
        if lines == 0 {
            break;
        }
        report.lines += lines as u64;
        // Every reject goes to the rejects file: none is left unlisted.
        target.catalog.refresh().await;
        let validated = batch::validate(
            &chunk,
            first_line,
            Timestamp::now(),
            limits,
            usize::MAX,
            &*target.catalog.read(),
            claims,
        );
        if !validated.rejected.is_empty() {
            let file = match &mut rejects {
                Some(f) => f,
                None => {
                    let p = rejects_path(path);
                    report.rejects_file = Some(p.clone());
                    rejects.insert(
                        std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?,
                    )
                }
            };
            for r in &validated.rejected {
                let line = serde_json::to_string(r).expect("reject serializes");
                writeln!(file, "{line}").map_err(fail)?;
            }
            report.rejected += validated.rejected.len() as u64;
            progress.rejects += validated.rejected.len() as u64;
        }
        let n = validated.events.len() as u64;
        if n > 0 {
            let counts = batch::kind_counts(&validated.events);
            let key = format!("backfill:{identity}:{chunk_no}");
            let idempotency = Idempotency::for_body(&key, &chunk, n.to_string().into_bytes());
            let events = validated.events;
            loop {
                let append = AppendBatch {
                    events: events.clone(),
                    idempotency: Some(idempotency.clone()),
                };
                match log
                    .append(append)
                    .await
                    .map_err(|e| format!("event log: {e}"))?
                {
                    AppendOutcome::Appended { .. } => {
                        batch::count_accepted(counts);
                        report.accepted += n;
                    }
                    AppendOutcome::Duplicate { .. } => report.already_appended += n,
                    AppendOutcome::Conflict => {
                        return Err(format!(
                            "{}: lines {first_line}.. were appended before with other content under the same key ({key}); nothing of them was appended again",
                            path.display()
                        ))
                    }
                    // Another backfill of this file holds the chunk (or
                    // one that died does, until its lease runs out).
                    AppendOutcome::Busy { retry_after } => {
                        tokio::time::sleep(retry_after).await;
                        continue;
                    }
                }
                break;
            }
            progress.events += n;
        }
        chunk_no += 1;
        progress.draw(path, false);
    }
    progress.draw(path, true);
    if progress.enabled {
        eprintln!();
    }
    Ok(report)
}
