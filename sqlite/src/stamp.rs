//! The store's stamp ([`ReadStore::version`], [`AuthStore::version`]): a
//! number that changes whenever anything is committed to `store.db`, by
//! this process or another, read before the reads it vouches for (the
//! API's caches, `hindsight-api`'s `cache.rs`).
//!
//! What it reads: the header of SQLite's WAL index, the first bytes of
//! `store.db-shm`, where SQLite maps it for a connection kept for this.
//! Every commit in WAL mode
//! writes a new header there (it counts transactions, `iChange`, and names
//! the last valid frame), and a read transaction starts from that header:
//! SQLite itself decides whether anything changed by comparing it whole.
//! The format is SQLite's documented WAL-index format (version 3007000,
//! unchanged since 3.7.0); the header is written twice, the second copy
//! first, and read as SQLite reads it (first copy, barrier, second copy;
//! equal, initialised and with a valid checksum, or read again).
//!
//! Why not `PRAGMA data_version`, as before: each read of it is a read
//! transaction, with the shared-memory locks SQLite takes for one (`fcntl`
//! calls under a mutex every connection of the process shares). Under the
//! API's page load (`hindsight-bench api`) those reads, two a request,
//! were 17 % of the API process's CPU, and a worker that found the mutex
//! taken slept: 441 times in 3.5 s (docs/DESIGN.md, "Page, key and token caches").
//! Reading the header is a few loads. `PRAGMA data_version` is still what
//! answers when the header cannot be read (a VFS without shared memory, a
//! header being written on every retry, an unknown version).
//!
//! Why it is exact: the epoch is advanced, under one mutex, by the first
//! read that sees the header (or the count) differ from what the read
//! before it saw, and only then loaded. A commit changes the header before
//! it ends, so every stamp read that begins after a commit returns an
//! epoch advanced after the commit became visible, and what is read after
//! that stamp sees the commit: a value kept under a stamp is never served
//! under it once a commit it lacks has ended. A header rewritten with
//! nothing committed (a checkpoint restarting the WAL) only advances the
//! epoch once more, which empties a cache once more.
//!
//! Why SQLite's own mapping, not one of the file's: a process that closes
//! any descriptor of a file loses every POSIX lock it holds on it, and
//! SQLite's locks on `-shm` (among them the one telling other processes
//! that this one uses the index) are such locks. The first version of this
//! opened `-shm`, mapped it and closed it: another process then found the
//! index unused, rebuilt it under the first, and the SIGKILL crash test's
//! projector stopped seeing the log's appends. The words read here are
//! those SQLite mapped for the kept connection (its VFS's `xShmMap`),
//! valid while it is open, and it is closed with them.
//!
//! [`ReadStore::version`]: hindsight_contracts::ReadStore::version
//! [`AuthStore::version`]: hindsight_contracts::AuthStore::version

use crate::db::{open, Durability};
use crate::Result;
use rusqlite::{ffi, Connection};
use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Mutex;

pub(crate) struct Stamps {
    /// SQLite's mapping of the WAL index, when its VFS has one.
    index: Option<WalIndex>,
    seen: Mutex<Seen>,
}

/// What the last stamp read saw, and the epoch it returned.
struct Seen {
    epoch: u64,
    header: Option<Header>,
    /// Keeps the WAL index open (see the module's doc); its
    /// `data_version` answers when the header cannot be read.
    conn: Connection,
    count: i64,
}

/// One copy of the WAL index header, as native-endian words.
type Header = [u32; HEADER_WORDS];

/// `WalIndexHdr`: 48 bytes, twice, at the start of the `-shm` file.
const HEADER_WORDS: usize = 12;
/// `WALINDEX_MAX_VERSION`, the header's first word.
const INDEX_VERSION: u32 = 3_007_000;
/// Reads of a header caught being written before `data_version` answers.
const RETRIES: usize = 16;

impl Stamps {
    /// The stamp of the database at `path`, which is in WAL mode.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let conn = open(path, Durability::Normal)?;
        // A first read transaction creates and initialises the index.
        let count = data_version(&conn)?;
        let index = WalIndex::of(&conn);
        if let Err(why) = index {
            tracing::warn!(path = %path.display(), why,
                "the WAL index header cannot be read: the store's stamp reads data_version");
        }
        Ok(Stamps {
            index: index.ok(),
            seen: Mutex::new(Seen {
                epoch: 1,
                header: None,
                conn,
                count,
            }),
        })
    }

    /// The stamp now.
    pub(crate) fn read(&self) -> Result<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let moved = match self.index.as_ref().and_then(WalIndex::header) {
            Some(header) => seen.header.replace(header) != Some(header),
            None => {
                let count = data_version(&seen.conn)?;
                std::mem::replace(&mut seen.count, count) != count
            }
        };
        if moved {
            seen.epoch += 1;
        }
        Ok(seen.epoch)
    }
}

fn data_version(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get::<_, i64>(0))?)
}

/// The WAL index's first words, where the connection that keeps it open
/// has it mapped.
struct WalIndex {
    words: std::ptr::NonNull<AtomicU32>,
}

// SAFETY: the words are read only through atomics, from any thread.
unsafe impl Send for WalIndex {}
unsafe impl Sync for WalIndex {}

/// `WALINDEX_PGSZ`: the size of each region SQLite maps.
const REGION_BYTES: c_int = 32_768;

impl WalIndex {
    /// Region 0 of `conn`'s WAL index, as SQLite mapped it for `conn`
    /// (its VFS's `xShmMap`, which hands back the existing mapping), valid
    /// until `conn` is closed. Never by opening `-shm` here: closing any
    /// descriptor of a file drops every POSIX lock the process holds on
    /// it, SQLite's included, and another process could then take this
    /// one for gone and reset the index under it.
    fn of(conn: &Connection) -> std::result::Result<Self, &'static str> {
        let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
        // SAFETY: the handle is `conn`'s, borrowed; the out-pointer is valid.
        let rc = unsafe {
            ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_FILE_POINTER,
                (&raw mut file).cast(),
            )
        };
        if rc != ffi::SQLITE_OK || file.is_null() {
            return Err("no database file");
        }
        // SAFETY: `file` is the open main database file of `conn`; its
        // methods outlive it.
        let methods = unsafe { (*file).pMethods };
        if methods.is_null() || unsafe { (*methods).iVersion } < 2 {
            return Err("a VFS without shared memory");
        }
        let Some(shm_map) = (unsafe { (*methods).xShmMap }) else {
            return Err("a VFS without shared memory");
        };
        let mut region: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: as above; region 0 exists once a read transaction has
        // run (`bExtend` 0 maps nothing new), and `conn` is not in use
        // on another thread while `Stamps::open` holds it.
        let rc = unsafe { shm_map(file, 0, REGION_BYTES, 0, &raw mut region) };
        let words = std::ptr::NonNull::new(region.cast::<AtomicU32>());
        match (rc, words) {
            (ffi::SQLITE_OK, Some(words)) => Ok(WalIndex { words }),
            _ => Err("the WAL index is not mapped"),
        }
    }

    /// Word `i` of the header's two copies, loaded once.
    fn word(&self, i: usize) -> u32 {
        debug_assert!(i < 2 * HEADER_WORDS);
        // SAFETY: in region 0 (32 KiB, page-aligned), valid while the
        // connection that mapped it is open, which `Stamps` keeps; other
        // threads and processes write it, hence an atomic load.
        unsafe { (*self.words.as_ptr().add(i)).load(Ordering::Relaxed) }
    }

    /// The header, if a read of both copies agrees and it is whole.
    fn header(&self) -> Option<Header> {
        for _ in 0..RETRIES {
            let first: Header = std::array::from_fn(|i| self.word(i));
            fence(Ordering::Acquire);
            let second: Header = std::array::from_fn(|i| self.word(HEADER_WORDS + i));
            fence(Ordering::Acquire);
            if first == second && valid(&first) {
                return Some(first);
            }
            std::hint::spin_loop();
        }
        None
    }
}

/// An initialised header of the known version whose checksum (SQLite's
/// `walChecksumBytes` over its first 40 bytes, native order) holds.
fn valid(h: &Header) -> bool {
    let is_init = h[3].to_ne_bytes()[0] != 0;
    let (mut s1, mut s2) = (0u32, 0u32);
    for pair in h[..10].chunks_exact(2) {
        s1 = s1.wrapping_add(pair[0]).wrapping_add(s2);
        s2 = s2.wrapping_add(pair[1]).wrapping_add(s1);
    }
    h[0] == INDEX_VERSION && is_init && [s1, s2] == [h[10], h[11]]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database in WAL mode with a table, its writer, and its stamps.
    fn store() -> (tempfile::TempDir, Connection, Stamps) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = open(&path, Durability::Normal).unwrap();
        writer.execute_batch("CREATE TABLE t (k INTEGER)").unwrap();
        let stamps = Stamps::open(&path).unwrap();
        (dir, writer, stamps)
    }

    fn commit(writer: &Connection) {
        writer.execute("INSERT INTO t VALUES (1)", []).unwrap();
    }

    /// Each commit moves the stamp, reads without one leave it; `step`
    /// runs before each commit.
    fn moves_on_each_commit(
        writer: &Connection,
        stamps: &mut Stamps,
        mut step: impl FnMut(usize, &mut Stamps),
    ) {
        let mut before = stamps.read().unwrap();
        for n in 0..6 {
            assert_eq!(stamps.read().unwrap(), before, "no commit, yet it moved");
            step(n, stamps);
            commit(writer);
            let after = stamps.read().unwrap();
            assert!(after > before, "{after} after a commit, {before} before it");
            before = after;
        }
    }

    #[test]
    fn the_header_is_read_and_a_commit_moves_the_stamp() {
        let (_dir, writer, mut stamps) = store();
        let header = stamps
            .index
            .as_ref()
            .expect("the WAL index is mapped")
            .header();
        let header = header.expect("a whole header");
        assert_eq!(header[0], INDEX_VERSION);
        moves_on_each_commit(&writer, &mut stamps, |_, _| {});
        let index = stamps.index.as_ref().unwrap();
        assert_ne!(index.header(), Some(header), "commits rewrote it");
    }

    #[test]
    fn without_the_header_data_version_moves_it() {
        let (_dir, writer, mut stamps) = store();
        stamps.index = None;
        moves_on_each_commit(&writer, &mut stamps, |_, _| {});
    }

    /// A read answered by `data_version` between two answered by the
    /// header (or the other way round) misses no commit.
    #[test]
    fn the_two_answers_interleaved_miss_no_commit() {
        let (_dir, writer, mut stamps) = store();
        let mut spare = None;
        moves_on_each_commit(&writer, &mut stamps, |n, stamps| {
            if n != 1 && n != 4 {
                // Header to data_version, or back.
                std::mem::swap(&mut stamps.index, &mut spare);
            }
        });
    }

    /// A checkpoint that truncates the WAL rewrites the header: a commit
    /// after it still moves the stamp.
    #[test]
    fn a_commit_after_the_wal_is_truncated_moves_it() {
        let (_dir, writer, stamps) = store();
        commit(&writer);
        let before = stamps.read().unwrap();
        writer
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let checkpointed = stamps.read().unwrap();
        assert!(checkpointed >= before);
        commit(&writer);
        assert!(stamps.read().unwrap() > checkpointed);
        assert!(stamps.index.as_ref().unwrap().header().is_some());
    }

    #[test]
    fn a_torn_or_foreign_header_is_not_taken() {
        let (_dir, _writer, stamps) = store();
        let header = stamps.index.as_ref().unwrap().header().unwrap();
        assert!(valid(&header));
        for (word, flip) in [(2, 1), (4, 1 << 7), (10, 1), (0, 1)] {
            let mut bad = header;
            bad[word] ^= flip;
            assert!(!valid(&bad), "word {word} changed, still valid");
        }
        let mut uninit = header;
        uninit[3] &= !u32::from_ne_bytes([0xff, 0, 0, 0]);
        assert!(!valid(&uninit), "not initialised, still valid");
    }
}
