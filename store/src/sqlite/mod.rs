//! The embedded backends: SQLite files in WAL mode under the data directory.
//!
//! - `log.db`: the event log ([`SqliteLog`]). `synchronous=FULL`: an append
//!   returns after fsync, so an acknowledged batch survives power loss.
//! - `store.db`: the read store ([`SqliteStore`]). Buckets, catalog and the
//!   projector's consumed position commit in one transaction, so a crash
//!   anywhere neither loses nor double-counts an event. `synchronous=NORMAL`
//!   is enough here: a power loss can only roll back whole transactions, and
//!   the projector then re-reads those events from the log.
//!
//! Two files rather than one so that ingest and the projector never wait on
//! each other's write lock. Several processes (`hindsight ingest`,
//! `projector`, `api`) can share a data directory; SQLite's locking keeps
//! them consistent.

mod log;
mod store;

pub use log::{IdempotencyFile, SqliteConsumer, SqliteLog};
pub use store::SqliteStore;

use crate::Result;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub const LOG_FILE: &str = "log.db";
pub const STORE_FILE: &str = "store.db";
pub const LIMITS_FILE: &str = "limits.db";

#[derive(Clone, Copy, PartialEq)]
enum Durability {
    /// fsync on every commit.
    Full,
    /// fsync at checkpoints; transactions stay atomic.
    Normal,
}

/// Page cache of writer connections; readers get a quarter (the OS page
/// cache holds the rest, and the API may open a dozen readers).
const WRITER_CACHE_KB: i64 = 16_000;

/// Opens (creating if needed) in WAL mode. Another process opening the same
/// new file at the same moment can hold the lock that switching to WAL
/// needs, which SQLite reports at once rather than waiting: retry a while.
fn open(path: &Path, durability: Durability) -> Result<Connection> {
    let mut delay = Duration::from_millis(10);
    loop {
        match try_open(path, durability) {
            Err(crate::StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)))
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

fn try_open(path: &Path, durability: Durability) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
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
struct Pool {
    path: PathBuf,
    durability: Durability,
    idle: Mutex<Vec<Connection>>,
}

impl Pool {
    fn new(path: PathBuf, durability: Durability) -> Self {
        Pool {
            path,
            durability,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&Connection) -> Result<R>) -> Result<R> {
        let conn = self.idle.lock().unwrap().pop();
        let conn = match conn {
            Some(c) => c,
            None => {
                let c = open(&self.path, self.durability)?;
                c.pragma_update(None, "cache_size", -WRITER_CACHE_KB / 4)?;
                c
            }
        };
        let out = f(&conn);
        let mut idle = self.idle.lock().unwrap();
        if idle.len() < 16 {
            idle.push(conn);
        }
        out
    }
}

/// Runs blocking SQLite work off the async runtime.
async fn blocking<R: Send + 'static>(f: impl FnOnce() -> Result<R> + Send + 'static) -> Result<R> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| crate::StoreError::Other(format!("blocking task failed: {e}")))?
}
