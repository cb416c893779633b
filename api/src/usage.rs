//! Every `/v1` request counted in its key's usage (the dashboard's charts),
//! tallied in memory and written in batches.
//!
//! Writing each request's count as it was answered cost two upserts (two
//! WAL commits on the embedded store) and a hop to a blocking thread per
//! request, visible in a profile of the API under the benchmark's page
//! load. A tally per key, hour and status class, written once a second,
//! costs one small write per active key a second whatever the request
//! rate.
//!
//! What is not yet written is at most a second old: readers in this process
//! flush first (the dashboard's usage charts), other processes see it
//! within a second, and a graceful stop writes it before exiting. A crash
//! loses at most that second, and a failed write its tallies (logged with
//! their count): a write that failed may have been applied in part (a CQL
//! counter update whose answer was lost), and usage may lose a count but
//! never adds one, as the store's contract says. Usage is a chart, not a
//! ledger; rate limits, which must hold exactly across replicas, are still
//! taken per request in the shared store (`auth::take`).

use hindsight_contracts::accounts::hour_of;
use hindsight_contracts::{AccountStore, KeyUse, StatusClass};
use hindsight_schemas::Timestamp;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How often tallies are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Requests per key, hour and status class not yet written, with the
/// latest request of each.
type Tallies = HashMap<(String, Timestamp, StatusClass), (u64, Timestamp)>;

pub struct UsageMeter {
    store: Arc<dyn AccountStore>,
    pending: Mutex<Tallies>,
    /// Held through a flush's write: a flush that starts while another's
    /// write is in flight returns after it, so a reader that flushed first
    /// sees every request counted before it asked.
    writing: tokio::sync::Mutex<()>,
}

impl UsageMeter {
    pub fn new(store: Arc<dyn AccountStore>) -> Arc<Self> {
        Arc::new(UsageMeter {
            store,
            pending: Mutex::new(HashMap::new()),
            writing: tokio::sync::Mutex::new(()),
        })
    }

    /// Counts one request of `key_id` answered `at` with `status`.
    pub fn count(&self, key_id: &str, at: Timestamp, status: u16) {
        let mut pending = self.pending.lock().unwrap();
        let tally = pending
            .entry((key_id.to_string(), hour_of(at), StatusClass::of(status)))
            .or_insert((0, at));
        tally.0 += 1;
        tally.1 = tally.1.max(at);
    }

    /// Writes every tally so far; on failure they are dropped and the
    /// requests they held are logged (see the module's doc).
    pub async fn flush(&self) -> hindsight_contracts::Result<()> {
        let _writing = self.writing.lock().await;
        let taken = std::mem::take(&mut *self.pending.lock().unwrap());
        if taken.is_empty() {
            return Ok(());
        }
        let uses: Vec<KeyUse> = taken
            .iter()
            .map(|((key_id, hour, class), (count, last_at))| KeyUse {
                key_id: key_id.clone(),
                hour: *hour,
                class: *class,
                count: *count,
                last_at: *last_at,
            })
            .collect();
        let requests: u64 = uses.iter().map(|u| u.count).sum();
        self.store.record_uses(uses).await.inspect_err(|e| {
            tracing::warn!(requests, error = %e, "writing usage counts failed; these requests are not counted");
        })
    }

    /// Flushes every [`FLUSH_EVERY`] until `stop`. The last flush after a
    /// stop is the service's, once its servers have answered their last
    /// request.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            // A failure is logged by `flush`; the next tallies are written anew.
            let _ = self.flush().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_contracts::accounts::HOUR_MS;

    /// Builds a meter over the embedded store in a temporary directory.
    fn meter() -> (
        tempfile::TempDir,
        Arc<UsageMeter>,
        Arc<hindsight_sqlite::SqliteStore>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(hindsight_sqlite::SqliteStore::open(dir.path()).unwrap());
        (dir, UsageMeter::new(store.clone()), store)
    }

    #[tokio::test]
    async fn requests_are_tallied_per_hour_and_class_and_written_once_flushed() {
        let (_dir, meter, store) = meter();
        let h = 1_756_684_800_000;
        for i in 0..5 {
            meter.count("k1", Timestamp(h + i), 200);
        }
        meter.count("k1", Timestamp(h + 9), 429);
        meter.count("k1", Timestamp(h + HOUR_MS + 1), 404);
        assert_eq!(
            store.key_usage("k1", Timestamp(0)).await.unwrap().counts,
            vec![],
            "nothing is written before a flush"
        );
        meter.flush().await.unwrap();
        let usage = store.key_usage("k1", Timestamp(0)).await.unwrap();
        let got: Vec<(i64, StatusClass, u64)> = usage
            .counts
            .iter()
            .map(|c| (c.hour.0, c.class, c.count))
            .collect();
        assert_eq!(
            got,
            vec![
                (h, StatusClass::Ok, 5),
                (h, StatusClass::Limited, 1),
                (h + HOUR_MS, StatusClass::Error, 1)
            ]
        );
        assert_eq!(usage.last_used, Some(Timestamp(h + HOUR_MS + 1)));
        // A second flush adds only what came since.
        meter.count("k1", Timestamp(h + 20), 200);
        meter.flush().await.unwrap();
        meter.flush().await.unwrap();
        let usage = store.key_usage("k1", Timestamp(0)).await.unwrap();
        assert_eq!(usage.counts[0].count, 6);
    }

    #[tokio::test]
    async fn a_failed_flush_drops_its_tallies_and_the_next_flush_writes_anew() {
        let (dir, meter, store) = meter();
        let h = 1_756_684_800_000;
        meter.count("k1", Timestamp(h), 200);
        // The accounts file made unwritable: the flush fails. (Read once
        // first: the store creates the file on its first use.)
        store.key_usage("k1", Timestamp(0)).await.unwrap();
        let db = dir.path().join("accounts.db");
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch("ALTER TABLE key_usage RENAME TO key_usage_away")
            .unwrap();
        assert!(meter.flush().await.is_err());
        conn.execute_batch("ALTER TABLE key_usage_away RENAME TO key_usage")
            .unwrap();
        meter.count("k1", Timestamp(h + 1), 200);
        meter.count("k1", Timestamp(h + 2), 200);
        meter.flush().await.unwrap();
        let usage = store.key_usage("k1", Timestamp(0)).await.unwrap();
        assert_eq!(usage.counts.len(), 1);
        assert_eq!(usage.counts[0].count, 2, "counted once, never twice");
    }
}
