//! Connections: opening in WAL mode, a small read pool, and the hop off the
//! async runtime.

use crate::{Error, Result};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

pub(crate) const LOG_FILE: &str = "log.db";
pub(crate) const STORE_FILE: &str = "store.db";
pub(crate) const LIMITS_FILE: &str = "limits.db";

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Durability {
    /// fsync on every commit.
    Full,
    /// fsync at checkpoints; transactions stay atomic.
    Normal,
}

/// Page cache of writer connections; readers get a quarter (the OS page
/// cache holds the rest, and the API may open a dozen readers).
pub(crate) const WRITER_CACHE_KB: i64 = 16_000;

/// Opens (creating if needed) in WAL mode, with SQLite's default page
/// size for a new file. Another process opening the same new file at the
/// same moment can hold the lock that switching to WAL needs, which SQLite
/// reports at once rather than waiting: retry a while.
pub(crate) fn open(path: &Path, durability: Durability) -> Result<Connection> {
    open_paged(path, durability, None)
}

/// As [`open`], and a file this creates gets `page_size` bytes per page.
/// An existing file keeps its own: SQLite fixes the size when it first
/// writes the file's header (which switching to WAL does, hence before
/// it), and changes it only by a `VACUUM` outside WAL mode.
pub(crate) fn open_paged(
    path: &Path,
    durability: Durability,
    page_size: Option<u32>,
) -> Result<Connection> {
    let mut delay = Duration::from_millis(10);
    loop {
        match try_open(path, durability, page_size) {
            Err(Error::Sql(rusqlite::Error::SqliteFailure(e, _)))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && delay < Duration::from_secs(5) =>
            {
                std::thread::sleep(delay);
                delay *= 2;
            }
            other => return other,
        }
    }
}

fn try_open(path: &Path, durability: Durability, page_size: Option<u32>) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    if let Some(bytes) = page_size {
        conn.pragma_update(None, "page_size", bytes)?;
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KB)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// A few reusable read connections: SQLite connections are not `Sync`, and
/// opening one per request costs more than the query.
pub(crate) struct Pool {
    path: PathBuf,
    durability: Durability,
    idle: Mutex<Vec<Connection>>,
}

impl Pool {
    pub(crate) fn new(path: PathBuf, durability: Durability) -> Self {
        Pool {
            path,
            durability,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on an idle connection, opening one if none is idle.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&Connection) -> Result<R>) -> Result<R> {
        let conn = match self.take_idle() {
            Some(c) => c,
            None => {
                let c = open(&self.path, self.durability)?;
                c.pragma_update(None, "cache_size", -WRITER_CACHE_KB / 4)?;
                c
            }
        };
        let out = f(&conn);
        self.put_back(conn);
        out
    }

    pub(crate) fn take_idle(&self) -> Option<Connection> {
        self.idle.lock().unwrap().pop()
    }

    pub(crate) fn put_back(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap();
        if idle.len() < 16 {
            idle.push(conn);
        }
    }
}

/// A file of its own beside the store (`accounts.db`, `exports.db`,
/// `limits.db`), opened and given its schema when first used.
///
/// Why on first use: every command that reads or writes the store opens
/// it, but only the API's requests touch these files. Opened with the
/// store, `backfill`, `rebuild` and the projector created three files they
/// never use and ran their schemas, a transaction each, at every start.
pub(crate) struct SideFile {
    path: PathBuf,
    durability: Durability,
    /// Idempotent (`IF NOT EXISTS`): run by every connection that opens
    /// the file.
    schema: &'static str,
    conn: OnceLock<Mutex<Connection>>,
}

impl SideFile {
    pub(crate) fn new(
        dir: &Path,
        file: &str,
        durability: Durability,
        schema: &'static str,
    ) -> Self {
        SideFile {
            path: dir.join(file),
            durability,
            schema,
            conn: OnceLock::new(),
        }
    }

    /// Runs `f` on the file's connection, opening the file first on the
    /// first use. An open that fails is the use's error, and the next use
    /// tries again. Blocking: call it off the async runtime ([`blocking`]).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Connection) -> Result<R>) -> Result<R> {
        let conn = match self.conn.get() {
            Some(conn) => conn,
            None => {
                let conn = open(&self.path, self.durability)?;
                conn.execute_batch(self.schema)?;
                // Two first uses at once may both open the file: one
                // connection is kept and the other closed, harmlessly.
                self.conn.get_or_init(|| Mutex::new(conn))
            }
        };
        f(&mut conn.lock().unwrap())
    }
}

/// Runs blocking SQLite work off the async runtime.
pub(crate) async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R> + Send + 'static,
) -> crate::CResult<R> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io(format!("blocking task failed: {e}")))?
        .map_err(Into::into)
}

/// A read transaction: one snapshot for the statements run through it,
/// rolled back when dropped.
///
/// Why not rusqlite's `unchecked_transaction`: it runs `BEGIN DEFERRED`
/// and `ROLLBACK` as SQL text, parsed and prepared on every call, which
/// was ~3 % of a history page read from the store (`perf`, the `api`
/// benchmark's cache-missed page). Here both are the connection's cached
/// statements.
pub(crate) struct ReadTx<'c>(&'c Connection);

impl<'c> ReadTx<'c> {
    pub(crate) fn begin(conn: &'c Connection) -> Result<Self> {
        // A read transaction whose rollback failed (see `drop`) is ended
        // here, so that a pooled connection does not stay in it for good.
        if !conn.is_autocommit() {
            conn.prepare_cached("ROLLBACK")?.execute([])?;
        }
        conn.prepare_cached("BEGIN DEFERRED")?.execute([])?;
        Ok(ReadTx(conn))
    }
}

impl std::ops::Deref for ReadTx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.0
    }
}

impl Drop for ReadTx<'_> {
    fn drop(&mut self) {
        // A read changed nothing, so the rollback only ends the snapshot.
        // Should it fail, the next `begin` on the connection ends it.
        let rolled_back = self
            .0
            .prepare_cached("ROLLBACK")
            .and_then(|mut s| s.execute([]));
        if let Err(e) = rolled_back {
            tracing::warn!(error = %e, "ending a read transaction failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::ffi;

    /// Bytes of page cache `conn` holds (`SQLITE_DBSTATUS_CACHE_USED`).
    fn cache_used(conn: &Connection) -> i32 {
        let (mut current, mut highest) = (0, 0);
        // SAFETY: the handle lives as long as `conn`, which is borrowed,
        // and both out-pointers are valid.
        let rc = unsafe {
            ffi::sqlite3_db_status(
                conn.handle(),
                ffi::SQLITE_DBSTATUS_CACHE_USED,
                &mut current,
                &mut highest,
                0,
            )
        };
        assert_eq!(rc, ffi::SQLITE_OK);
        current
    }

    /// A connection's `cache_size` bounds its own pages: one reading a file
    /// far larger than its cache does not take what another was given, as
    /// it does when SQLite is compiled with SQLITE_ENABLE_MEMORY_MANAGEMENT
    /// (one cache for the process, bounded by the sum), which
    /// `.cargo/config.toml` leaves out of rusqlite's bundled build.
    #[test]
    fn each_connection_keeps_its_own_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let large = open(&path, Durability::Normal).unwrap();
        large.pragma_update(None, "cache_size", -64_000).unwrap();
        large
            .execute_batch(
                "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);
                 WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < 4000)
                 INSERT INTO t SELECT k, randomblob(4000) FROM n;",
            )
            .unwrap();
        let small = open(&path, Durability::Normal).unwrap();
        small.pragma_update(None, "cache_size", -1_000).unwrap();
        let read: i64 = small
            .query_row("SELECT sum(length(v)) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(read, 16_000_000);
        let used = cache_used(&small);
        assert!(
            used < 2_000_000,
            "{used} bytes of page cache on a connection given 1 000 KiB (the large one's: {})",
            cache_used(&large)
        );
    }

    /// Statements run through a read transaction see one snapshot, a
    /// commit in between notwithstanding, and once it is dropped the
    /// connection sees the commit and can begin another.
    #[test]
    fn a_read_transaction_is_one_snapshot_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = open(&path, Durability::Normal).unwrap();
        writer
            .execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY); INSERT INTO t VALUES (1);")
            .unwrap();
        let reader = open(&path, Durability::Normal).unwrap();
        let count = |c: &Connection| -> i64 {
            c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap()
        };
        for round in 0..2 {
            let before = count(&reader);
            {
                let tx = ReadTx::begin(&reader).unwrap();
                assert_eq!(count(&tx), before);
                writer.execute("INSERT INTO t DEFAULT VALUES", []).unwrap();
                assert_eq!(
                    count(&tx),
                    before,
                    "round {round}: the commit is after the snapshot"
                );
                assert!(!tx.is_autocommit());
            }
            assert!(reader.is_autocommit(), "round {round}: rolled back");
            assert_eq!(count(&reader), before + 1);
        }
        // A transaction left open (a rollback that failed) is ended by the
        // next one's begin.
        reader
            .execute_batch("BEGIN; SELECT count(*) FROM t;")
            .unwrap();
        let tx = ReadTx::begin(&reader).unwrap();
        assert_eq!(count(&tx), 3);
    }
}
