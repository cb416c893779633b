//! `hindsight backfill FILE…`: NDJSON files (plain or gzip) into the log.
//!
//! Files are read in chunks of lines; each chunk is validated and appended
//! like an HTTP batch, under an idempotency key derived from the file's
//! identity and the chunk number, so re-running an interrupted backfill
//! (within the idempotency window, 24 h) skips what was already appended.
//! The next chunk is read and validated while the log appends the last
//! (see [`backfill_file`]).
//! Rejected lines go to `FILE.rejects.ndjson` next to the input, with their
//! line numbers and reasons: never dropped silently. Lines are checked
//! against the catalog as HTTP batches are, with the claims of every line
//! accepted earlier in the run on top (a backfill's catalog is not projected
//! while it runs).

use crate::batch;
use crate::catalog::{BatchClaims, CatalogView};
use hindsight_contracts::{append_body, AppendBatch, AppendOutcome, EventLog, Idempotency};
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
    let identity = identity(path).map_err(at(path))?;
    let mut reading = Reading {
        target,
        claims,
        path,
        identity,
        lines: open_lines(path).map_err(at(path))?,
        chunk: Vec::with_capacity(CHUNK_LINES * 128),
        spare: Vec::with_capacity(CHUNK_LINES * 128),
        chunk_no: 0,
        report: FileReport {
            path: path.to_path_buf(),
            ..Default::default()
        },
        rejects: None,
    };
    // Two stages on two cores: the log appends one chunk (encoding,
    // compression, the fsync) while the next is read and validated (JSON
    // parsing, the catalog rule). Appends stay in file order, one at a
    // time. `biased`: the append is polled first, so its blocking work has
    // started before validation takes this thread.
    let mut next = reading.next_chunk(progress).await?;
    while let Some(chunk) = next {
        let (appended, following) = tokio::join!(
            biased;
            append_chunk(target.log, path, chunk),
            reading.next_chunk(progress)
        );
        let appended = appended?;
        reading.spare = appended.lines;
        reading.report.accepted += appended.accepted;
        reading.report.already_appended += appended.already_appended;
        progress.events += appended.accepted + appended.already_appended;
        progress.draw(path, false);
        next = following?;
    }
    progress.draw(path, true);
    if progress.enabled {
        eprintln!();
    }
    Ok(reading.report)
}

/// The reading side of a backfill: the file's lines, chunk by chunk,
/// validated, their rejects written out.
struct Reading<'a, 'b> {
    target: &'a Target<'b>,
    claims: &'a mut BatchClaims,
    path: &'a Path,
    identity: String,
    lines: Box<dyn BufRead>,
    /// The lines being read and validated; a chunk takes them with it.
    chunk: Vec<u8>,
    /// The buffer of the chunk appended last, back once it was: two
    /// buffers take turns, so a run reuses the same memory instead of
    /// faulting in a new chunk's.
    spare: Vec<u8>,
    chunk_no: u64,
    report: FileReport,
    rejects: Option<std::fs::File>,
}

/// A validated chunk, ready to append under its idempotency key.
struct Chunk {
    /// Its lines, as read: the body its digest was taken of, which an
    /// append under a key an earlier build recorded digests again
    /// ([`append_body`]). Handed back to `Reading::spare` once appended.
    lines: Vec<u8>,
    events: Arc<Vec<hindsight_schemas::Event>>,
    idempotency: Idempotency,
    counts: batch::KindCounts,
    first_line: u64,
}

/// What became of one chunk's events.
struct Appended {
    accepted: u64,
    already_appended: u64,
    /// The chunk's line buffer, for the next read.
    lines: Vec<u8>,
}

impl Reading<'_, '_> {
    /// The next chunk with events to append; `None` at the end of the file.
    async fn next_chunk(&mut self, progress: &mut Progress) -> Result<Option<Chunk>, String> {
        loop {
            let first_line = self.report.lines + 1;
            if !self.read_lines()? {
                return Ok(None);
            }
            // Every reject goes to the rejects file: none is left unlisted.
            self.target.catalog.refresh().await;
            let validated = batch::validate(
                &self.chunk,
                first_line,
                Timestamp::now(),
                &self.target.limits,
                usize::MAX,
                &*self.target.catalog.read(),
                self.claims,
            );
            self.write_rejects(&validated.rejected)?;
            progress.rejects += validated.rejected.len() as u64;
            let chunk_no = self.chunk_no;
            self.chunk_no += 1;
            let n = validated.events.len();
            if n == 0 {
                continue;
            }
            let key = format!("backfill:{}:{chunk_no}", self.identity);
            return Ok(Some(Chunk {
                idempotency: Idempotency::for_body(&key, &self.chunk, n.to_string().into_bytes()),
                lines: std::mem::take(&mut self.chunk),
                counts: batch::kind_counts(&validated.events),
                events: validated.events.into(),
                first_line,
            }));
        }
    }

    /// Reads up to `CHUNK_LINES` lines into `chunk`; false at the end of
    /// the file.
    fn read_lines(&mut self) -> Result<bool, String> {
        if self.chunk.capacity() == 0 {
            // The last chunk took its buffer: this one reads into the
            // buffer of the chunk appended before it.
            std::mem::swap(&mut self.chunk, &mut self.spare);
        }
        self.chunk.clear();
        let lines =
            read_lines(&mut self.lines, &mut self.chunk, CHUNK_LINES).map_err(at(self.path))?;
        self.report.lines += lines as u64;
        Ok(lines > 0)
    }

    fn write_rejects(&mut self, rejected: &[batch::Rejected]) -> Result<(), String> {
        if rejected.is_empty() {
            return Ok(());
        }
        let file = match &mut self.rejects {
            Some(f) => f,
            None => {
                let p = rejects_path(self.path);
                self.report.rejects_file = Some(p.clone());
                let file = std::fs::File::create(&p).map_err(at(&p))?;
                self.rejects.insert(file)
            }
        };
        for r in rejected {
            let line = serde_json::to_string(r).expect("reject serializes");
            writeln!(file, "{line}").map_err(at(self.path))?;
        }
        self.report.rejected += rejected.len() as u64;
        Ok(())
    }
}

/// Appends up to `max` lines of `reader` to `chunk`, each ending in a
/// newline (a last line without one gets one), and returns how many.
///
/// Whole stretches of the reader's buffer are copied at once, up to the
/// newline that ends the last line taken (a line at a time, `read_until`'s
/// search and copy were ~2 % of a backfill's samples).
fn read_lines(reader: &mut dyn BufRead, chunk: &mut Vec<u8>, max: usize) -> std::io::Result<usize> {
    let mut lines = 0;
    // The chunk ends inside a line (its newline not read yet).
    let mut inside = false;
    while lines < max {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            if inside {
                chunk.push(b'\n');
                lines += 1;
            }
            break;
        }
        let mut take = buf.len();
        for end in memchr::memchr_iter(b'\n', buf) {
            lines += 1;
            if lines == max {
                take = end + 1;
                break;
            }
        }
        inside = buf[take - 1] != b'\n';
        chunk.extend_from_slice(&buf[..take]);
        reader.consume(take);
    }
    Ok(lines)
}

/// An I/O error as the message a backfill fails with: the file, then why.
fn at(path: &Path) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{}: {e}", path.display())
}

/// Appends one chunk, waiting out another backfill of the same file that
/// holds its key.
async fn append_chunk(log: &dyn EventLog, path: &Path, chunk: Chunk) -> Result<Appended, String> {
    let n = chunk.events.len() as u64;
    loop {
        let append = AppendBatch {
            events: chunk.events.clone(),
            idempotency: Some(chunk.idempotency.clone()),
        };
        let (accepted, already_appended) = match append_body(log, append, &chunk.lines)
            .await
            .map_err(|e| format!("event log: {e}"))?
        {
            AppendOutcome::Appended { .. } => {
                batch::count_accepted(chunk.counts);
                (n, 0)
            }
            AppendOutcome::Duplicate { .. } => (0, n),
            AppendOutcome::Conflict => {
                return Err(format!(
                    "{}: lines {}.. were appended before with other content under the same key ({}); nothing of them was appended again",
                    path.display(),
                    chunk.first_line,
                    chunk.idempotency.key
                ))
            }
            // Another backfill of this file holds the chunk (or one that
            // died does, until its lease runs out).
            AppendOutcome::Busy { retry_after } => {
                tokio::time::sleep(retry_after).await;
                continue;
            }
        };
        return Ok(Appended {
            accepted,
            already_appended,
            lines: chunk.lines,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text`'s lines in chunks of up to `max`, read through a buffer of
    /// `capacity` bytes: each chunk's text and line count.
    fn chunks(text: &str, capacity: usize, max: usize) -> Vec<(String, usize)> {
        let mut reader = BufReader::with_capacity(capacity, text.as_bytes());
        let mut out = Vec::new();
        loop {
            let mut chunk = Vec::new();
            let n = read_lines(&mut reader, &mut chunk, max).unwrap();
            if n == 0 {
                assert!(chunk.is_empty());
                return out;
            }
            out.push((String::from_utf8(chunk).unwrap(), n));
        }
    }

    #[test]
    fn chunks_are_whole_lines_whatever_the_buffer_cuts() {
        let texts = [
            "",
            "a\n",
            "a",
            "a\nbb\n\nccc\ndddd\n",
            "a\nbb\n\nccc\ndddd",
            "\n\n\n",
            "one long line of many more bytes than the buffer holds\nx",
        ];
        for text in texts {
            let lines: Vec<&str> = text.split_terminator('\n').collect();
            for capacity in [1, 2, 3, 5, 8, 64] {
                for max in [1, 2, 3, 100] {
                    let got = chunks(text, capacity, max);
                    let want: Vec<(String, usize)> = lines
                        .chunks(max)
                        .map(|c| (c.iter().map(|l| format!("{l}\n")).collect(), c.len()))
                        .collect();
                    assert_eq!(got, want, "{text:?}, capacity {capacity}, max {max}");
                }
            }
        }
    }
}
