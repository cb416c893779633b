//! The store's stamp ([`ReadStore::version`], [`AuthStore::version`]): a
//! number that changes whenever anything is committed to `store.db`, by
//! this process or another, read before the reads it vouches for (the
//! API's caches, `hindsight-api`'s `cache.rs`).
//!
//! SQLite's `PRAGMA data_version` changes when any *other* connection
//! commits, but its values are the connection's own: two connections'
//! counts cannot be compared. The stamp was one connection's count behind
//! one mutex, read twice a request (the key's and the page's), each read a
//! read transaction with its file locks (four `fcntl` a request), so the
//! API's runtime workers took turns at it. Now each of a few connections
//! keeps the count it last read, and a change seen by any of them advances
//! one shared epoch, which is the stamp (docs/DESIGN.md, "Page and key
//! caches", has what it measured).
//!
//! Why it is exact: a commit changes every connection's count, so the first
//! read of any connection after a commit sees a change, advances the epoch
//! and only then loads it; a connection that read since has advanced it
//! already. So every stamp read that begins after a commit returns an epoch
//! the commit preceded, and what is read after that stamp sees the commit:
//! a value kept under a stamp is never served under it once a commit it
//! lacks has ended. A connection that sees a commit another saw first
//! advances the epoch once more, which only empties a cache once more.
//!
//! [`ReadStore::version`]: hindsight_contracts::ReadStore::version
//! [`AuthStore::version`]: hindsight_contracts::AuthStore::version

use crate::db::{open, Durability};
use crate::Result;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

pub(crate) struct Stamps {
    path: PathBuf,
    /// The first opened with the store, the others by the first read that
    /// finds the ones before them busy: commands that never read a stamp
    /// (`backfill`, `rebuild`) open one connection, as before, and the API
    /// one per worker that reads at once.
    counters: Box<[Mutex<Option<Counter>>]>,
    epoch: AtomicU64,
    /// Which counter a read waits for when every one is busy.
    next: AtomicUsize,
}

/// A connection that only reads `PRAGMA data_version`, and what it last
/// read.
struct Counter {
    conn: Connection,
    last: Option<i64>,
}

impl Counter {
    fn open(path: &Path) -> Result<Self> {
        Ok(Counter {
            conn: open(path, Durability::Normal)?,
            last: None,
        })
    }
}

impl Stamps {
    /// Connections to `path`: one per core (the API's runtime workers, which
    /// read stamps at once), at most four.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
        Self::with(path, n)
    }

    fn with(path: &Path, n: usize) -> Result<Self> {
        let first = Counter::open(path)?;
        let counters = std::iter::once(Some(first))
            .chain(std::iter::repeat_with(|| None))
            .take(n.max(1))
            .map(Mutex::new)
            .collect();
        Ok(Stamps {
            path: path.to_path_buf(),
            counters,
            epoch: AtomicU64::new(0),
            next: AtomicUsize::new(0),
        })
    }

    /// The stamp now: read on the first idle connection, or, when all are
    /// busy, on one taken in turn.
    pub(crate) fn read(&self) -> Result<u64> {
        let mut counter = match self.counters.iter().find_map(|c| c.try_lock().ok()) {
            Some(idle) => idle,
            None => {
                let i = self.next.fetch_add(1, Ordering::Relaxed) % self.counters.len();
                self.counters[i].lock().unwrap_or_else(|e| e.into_inner())
            }
        };
        self.read_on(&mut counter)
    }

    fn read_on(&self, slot: &mut Option<Counter>) -> Result<u64> {
        let counter = match slot {
            Some(counter) => counter,
            None => slot.insert(Counter::open(&self.path)?),
        };
        let count = counter
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get::<_, i64>(0))?;
        if counter.last != Some(count) {
            counter.last = Some(count);
            self.epoch.fetch_add(1, Ordering::SeqCst);
        }
        Ok(self.epoch.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whichever connection answers, a stamp read after a commit is larger
    /// than every stamp read before it, and without a commit it stays; also
    /// once the connections' own counts have parted ways.
    #[test]
    fn a_commit_advances_the_stamp_whichever_connection_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = open(&path, Durability::Normal).unwrap();
        writer.execute_batch("CREATE TABLE t (k INTEGER)").unwrap();
        let commit = || writer.execute("INSERT INTO t VALUES (1)", []).unwrap();
        let stamps = Stamps::with(&path, 3).unwrap();
        let on = |i: usize| {
            let mut counter = stamps.counters[i].lock().unwrap();
            stamps.read_on(&mut counter).unwrap()
        };
        let mut highest = (0..3).map(on).max().unwrap();
        for i in 0..3 {
            assert_eq!(
                on(i),
                highest,
                "no commit, yet connection {i} moved the stamp"
            );
        }
        // Connection 0 alone sees three commits, one at a time: its count
        // runs ahead of the others'.
        for _ in 0..3 {
            commit();
            let stamp = on(0);
            assert!(
                stamp > highest,
                "{stamp} after a commit, {highest} before it"
            );
            highest = stamp;
        }
        for order in [[1, 0, 2], [2, 1, 0]] {
            let before = highest;
            commit();
            for i in order {
                let stamp = on(i);
                assert!(
                    stamp > before,
                    "connection {i} read {stamp} after a commit, {before} before it"
                );
                highest = highest.max(stamp);
            }
            assert_eq!(stamps.read().unwrap(), highest, "no commit since");
        }
    }
}
