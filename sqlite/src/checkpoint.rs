//! The store's checkpoints, run beside its writer rather than inside it.
//!
//! In WAL mode a commit appends the pages it changed to the WAL, and a
//! checkpoint copies them back into the database file (and, at
//! `synchronous = NORMAL`, fsyncs it). SQLite's automatic checkpoint runs
//! inside the commit that crosses its threshold, so the projector's write
//! waited for it: on a long tail, where a step's rows land all over the
//! bucket tables, that copy was half of every commit. Here a thread with
//! its own connection runs a `PASSIVE` checkpoint after each commit,
//! which SQLite lets run while the writer goes on (it copies only frames
//! every reader is past, and takes no write lock). The writer keeps an
//! automatic checkpoint as a backstop, at [`WRITER_BACKSTOP_BYTES`].
//!
//! A crash during a checkpoint loses nothing: the WAL keeps every frame
//! until a later writer restarts it, which SQLite does only once every
//! frame is in the database file.

use crate::db::{open, Durability};
use crate::Result;
use hindsight_telemetry as tm;
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Instant;

/// Bytes of WAL after which the writer checkpoints inside its own commit:
/// only when the checkpointer has fallen this far behind (or a reader
/// held it back). Above one step's pages (a 250 000-event rebuild step on
/// a long tail dirtied ~16 000 of 4 KiB), so it does not fire while the
/// thread keeps up. SQLite counts it in pages ([`backstop_pages`]): kept
/// in bytes, a file's page size does not change how much WAL it holds.
pub(crate) const WRITER_BACKSTOP_BYTES: i64 = 256 << 20;

/// [`WRITER_BACKSTOP_BYTES`] in pages of `conn`'s file, for its
/// `wal_autocheckpoint`.
pub(crate) fn backstop_pages(conn: &rusqlite::Connection) -> Result<i64> {
    let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
    Ok(WRITER_BACKSTOP_BYTES / page_size)
}

/// Wakes the checkpoint thread; dropping it ends the thread and waits for
/// it, so that its connection is closed with the store's: SQLite deletes
/// the WAL when the last connection to the file closes, and a thread still
/// holding one as the process exits would leave the whole WAL on disk.
pub(crate) struct Checkpointer {
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens the thread's connection to `path` and starts it.
    pub(crate) fn start(path: &Path) -> Result<Self> {
        let conn = open(path, Durability::Normal)?;
        // One pending wake is enough: a checkpoint copies every frame
        // committed before it starts.
        let (wake, woken) = sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || {
                while woken.recv().is_ok() {
                    let started = Instant::now();
                    let done = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                    metrics::histogram!(tm::STORE_QUERY_SECONDS, "op" => "checkpoint")
                        .record(started.elapsed().as_secs_f64());
                    if let Err(e) = done {
                        // The next wake tries again, and the writer's
                        // backstop bounds the WAL meanwhile.
                        metrics::counter!(tm::STORE_ERRORS, "op" => "checkpoint").increment(1);
                        tracing::warn!(error = %e, "store checkpoint failed");
                    }
                }
            })
            .map_err(|e| crate::Error::Io(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Checkpointer {
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// Asks for a checkpoint of everything committed so far; returns at
    /// once.
    pub(crate) fn wake(&self) {
        let Some(wake) = &self.wake else { return };
        match wake.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) => {}
            // The thread is gone (it only ends with this handle, or by a
            // panic): the writer's backstop checkpoints instead.
            Err(TrySendError::Disconnected(())) => {}
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop after the checkpoint
        // it may be running.
        self.wake.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
