//! A consumer that may hand its partitions to another projector inside
//! `poll` (a Kafka consumer-group rebalance) is polled only once every
//! write of what it delivered is durable: the new owner starts from the
//! store's positions, and a write of the old owner landing after the new
//! owner's would set rows and positions back.

mod common;

use common::{Hooked, Hooks};

use async_trait::async_trait;
use hindsight_contracts::{
    AppendBatch, Applied, ConsumerSource, Delivered, EventLog, LogConsumer, Position,
    ProjectionStore, ProjectionWrite, Result,
};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Counts the writes under way; each takes a while, so a poll issued
/// while one is in flight sees it.
struct Slow {
    in_flight: Arc<AtomicUsize>,
}

#[async_trait]
impl Hooks for Slow {
    async fn apply(&self, inner: &SqliteStore, write: ProjectionWrite) -> Result<Applied> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let applied = inner.apply(write).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        applied
    }
}

/// The embedded log's consumer, declaring that its polls may reassign
/// partitions, and noting every poll made while a write was in flight.
struct Reassigning {
    inner: Box<dyn LogConsumer>,
    in_flight: Arc<AtomicUsize>,
    polled_during_a_write: Arc<AtomicUsize>,
}

#[async_trait]
impl LogConsumer for Reassigning {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivered>> {
        // On the test's one-thread runtime, a write just spawned starts
        // (and counts itself) before this poll looks.
        tokio::task::yield_now().await;
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            self.polled_during_a_write.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.poll(max, wait).await
    }

    async fn commit(&mut self, upto: &[Position]) -> Result<()> {
        self.inner.commit(upto).await
    }

    async fn lag(&mut self) -> Result<Vec<(u32, u64)>> {
        self.inner.lag().await
    }

    fn assignment_changed(&mut self) -> bool {
        self.inner.assignment_changed()
    }

    fn reassigns(&self) -> bool {
        true
    }
}

struct Source {
    inner: EmbeddedSource,
    in_flight: Arc<AtomicUsize>,
    polled_during_a_write: Arc<AtomicUsize>,
}

#[async_trait]
impl ConsumerSource for Source {
    async fn open(&self) -> Result<Box<dyn LogConsumer>> {
        Ok(Box::new(Reassigning {
            inner: self.inner.open().await?,
            in_flight: self.in_flight.clone(),
            polled_during_a_write: self.polled_during_a_write.clone(),
        }))
    }
}

#[tokio::test]
async fn a_reassigning_consumer_is_polled_only_with_no_write_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SqliteLog::open(dir.path()).unwrap());
    let events = common::ticks(0, 1_000, 7);
    log.append(AppendBatch {
        events: events.into(),
        idempotency: None,
    })
    .await
    .unwrap();
    let sqlite = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let in_flight = Arc::new(AtomicUsize::new(0));
    let polled_during_a_write = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(Hooked {
        inner: sqlite.clone(),
        hooks: Slow {
            in_flight: in_flight.clone(),
        },
    });
    let source = Arc::new(Source {
        inner: EmbeddedSource {
            log,
            store: sqlite.clone(),
        },
        in_flight: in_flight.clone(),
        polled_during_a_write: polled_during_a_write.clone(),
    });
    let config = ProjectorConfig {
        batch_max: 100,
        backlog_batch_max: 100,
        idle_wait: Duration::from_millis(5),
        ..ProjectorConfig::default()
    };
    let projected = Projector::new(source, store, config)
        .catch_up()
        .await
        .unwrap();
    assert_eq!(projected, 1_000);
    assert_eq!(
        polled_during_a_write.load(Ordering::SeqCst),
        0,
        "polls made while a write was in flight"
    );
    let committed = sqlite.committed().await.unwrap();
    assert_eq!(
        committed,
        [Position {
            partition: 0,
            offset: 1_000
        }]
    );
}
