//! The projector loop: log → rollup → read store, one durable step at a time.
//!
//! A step: poll up to `batch_max` events, load the rows they touch that are
//! not in memory, fold, then write rows, catalog upserts and the consumed
//! position in one [`ProjectionWrite`], and only then commit to the log.
//! A crash anywhere re-delivers events whose effects are either all durable
//! (and then skipped row by row) or not durable at all.

use crate::rollup::Rollup;
use hindsight_contracts::{
    ConsumerSource, Delivered, LogConsumer, Position, ProjectionStore, ProjectionWrite, Result,
};
use hindsight_schemas::Event;
use hindsight_telemetry as tm;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct ProjectorConfig {
    /// Most events folded in one durable step.
    pub batch_max: usize,
    /// How long an idle poll waits for new events.
    pub idle_wait: Duration,
    /// Rows kept in memory between steps before they are dropped.
    pub max_cached_rows: usize,
}

impl Default for ProjectorConfig {
    fn default() -> Self {
        ProjectorConfig {
            batch_max: 20_000,
            idle_wait: Duration::from_millis(100),
            max_cached_rows: 500_000,
        }
    }
}

pub struct Projector {
    source: Arc<dyn ConsumerSource>,
    store: Arc<dyn ProjectionStore>,
    config: ProjectorConfig,
    rollup: Rollup,
}

/// What one step did.
#[derive(Debug, Default, Clone, Copy)]
pub struct StepStats {
    pub events: usize,
    pub rows_written: usize,
}

impl Projector {
    pub fn new(
        source: Arc<dyn ConsumerSource>,
        store: Arc<dyn ProjectionStore>,
        config: ProjectorConfig,
    ) -> Self {
        Projector {
            source,
            store,
            config,
            rollup: Rollup::new(),
        }
    }

    /// Runs until `shutdown` turns true. A failed step drops the in-memory
    /// rows, reopens the consumer at the durable position and retries with
    /// backoff: nothing is skipped, nothing applied twice.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = Duration::from_millis(100);
        while !*shutdown.borrow() {
            let mut consumer = match self.source.open().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "projector cannot open the log; retrying");
                    sleep_or_shutdown(backoff, &mut shutdown).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            loop {
                if *shutdown.borrow() {
                    return;
                }
                match self.step(consumer.as_mut()).await {
                    Ok(_) => {
                        backoff = Duration::from_millis(100);
                        report_lag(consumer.as_mut()).await;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "projector step failed; resuming from the durable position");
                        self.rollup.clear();
                        sleep_or_shutdown(backoff, &mut shutdown).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                        break;
                    }
                }
            }
        }
    }

    /// Projects until the consumer has nothing more — an empty poll with
    /// every partition it holds at zero lag (for `rebuild` and tests).
    pub async fn catch_up(&mut self) -> Result<u64> {
        let mut consumer = self.source.open().await?;
        let mut total = 0;
        loop {
            let stats = self.step(consumer.as_mut()).await?;
            total += stats.events as u64;
            if stats.events == 0 {
                let lag = consumer.lag().await?;
                // Empty before a consumer group assigns partitions: keep going.
                if !lag.is_empty() && lag.iter().all(|(_, behind)| *behind == 0) {
                    return Ok(total);
                }
            }
        }
    }

    /// One durable step.
    pub async fn step(&mut self, consumer: &mut dyn LogConsumer) -> Result<StepStats> {
        let batch = consumer
            .poll(self.config.batch_max, self.config.idle_wait)
            .await?;
        // Partitions moved (a consumer-group rebalance): cached rows of a
        // partition this projector lost may since have been written by
        // another projector, so every row is loaded afresh.
        if consumer.assignment_changed() {
            self.rollup.clear();
        }
        if batch.is_empty() {
            return Ok(StepStats::default());
        }
        let started = Instant::now();
        let missing = self.rollup.prepare(&batch);
        if !missing.is_empty() {
            let rows = match self.store.load(missing).await {
                Ok(rows) => rows,
                Err(e) => {
                    self.rollup.clear();
                    return Err(e);
                }
            };
            self.rollup.fill(rows);
        }
        let stats = self.rollup.apply(&batch);
        let rows = self.rollup.drain_dirty();
        let consumed = last_positions(&batch);
        let catalog: Vec<(Position, Event)> = batch
            .into_iter()
            .filter(|d| {
                matches!(
                    d.event,
                    Event::Series(_) | Event::Event(_) | Event::Market(_)
                )
            })
            .map(|d| (d.position, d.event))
            .collect();
        let events = stats.prices + stats.books + stats.metrics + catalog.len() as u64;
        let rows_written = rows.len();
        let mut per_table = [0u64; 3];
        rows.iter()
            .for_each(|r| per_table[r.key.table as usize] += 1);
        let write = ProjectionWrite {
            rows,
            catalog,
            consumed: consumed.clone(),
        };
        if let Err(e) = self.store.apply(write).await {
            // The in-memory rows now hold events that are not durable.
            self.rollup.clear();
            return Err(e);
        }
        consumer.commit(&consumed).await?;
        if self.rollup.len() > self.config.max_cached_rows {
            self.rollup.clear();
        }

        metrics::histogram!(tm::PROJECTOR_FLUSH_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "price").increment(stats.prices);
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "book").increment(stats.books);
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "metrics")
            .increment(stats.metrics);
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "catalog")
            .increment(events - stats.prices - stats.books - stats.metrics);
        metrics::counter!(tm::PROJECTOR_REPLAYS_SKIPPED).increment(stats.replays_skipped);
        for table in hindsight_contracts::Table::ALL {
            metrics::counter!(tm::PROJECTOR_ROWS_WRITTEN, "table" => table.as_str())
                .increment(per_table[table as usize]);
        }
        for p in &consumed {
            metrics::gauge!(tm::PROJECTOR_POSITION, "partition" => p.partition.to_string())
                .set((p.offset + 1) as f64);
        }
        Ok(StepStats {
            events: events as usize,
            rows_written,
        })
    }
}

fn last_positions(batch: &[Delivered]) -> Vec<Position> {
    let mut out: Vec<Position> = Vec::new();
    for d in batch {
        match out.iter_mut().find(|p| p.partition == d.position.partition) {
            Some(p) => p.offset = p.offset.max(d.position.offset),
            None => out.push(d.position),
        }
    }
    out
}

async fn report_lag(consumer: &mut dyn LogConsumer) {
    if let Ok(lag) = consumer.lag().await {
        for (partition, events) in lag {
            metrics::gauge!(tm::PROJECTOR_LAG, "partition" => partition.to_string())
                .set(events as f64);
        }
    }
}

async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) {
    let _ = tokio::time::timeout(d, shutdown.changed()).await;
}
