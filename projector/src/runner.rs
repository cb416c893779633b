//! The projector loop: log → rollup → read store, one durable step at a time.
//!
//! A step: poll up to `batch_max` events, load the rows they touch that are
//! not in memory, fold, then write rows, catalog upserts and the consumed
//! position in one [`ProjectionWrite`], and only then commit to the log.
//! A crash anywhere re-delivers events whose effects are either all durable
//! (and then skipped row by row) or not durable at all.
//!
//! The store writes one segment while the projector polls and folds the
//! next (see `InFlight`): writes stay in log order, one at a time, and the
//! log is committed only after them. Until the write in flight is durable,
//! the projector keeps folding what the log gains into the next step
//! (`Projector::top_up`), which the store then takes whole.
//!
//! The catalog rule (`hindsight_schemas::claims`): a price tick or book
//! snapshot whose token the catalog lists under another market is not
//! folded, and the store refuses a market version taking another market's
//! token or slug. Both are decided against the catalog as it stands at the
//! event's log position: a step is cut before a tick that a market record
//! earlier in the step may decide otherwise (see `segment_end`), each piece
//! written before the next is folded, so a tick after a market record in
//! the log sees that record's effect. With one
//! log partition (the embedded log) every decision is a function of the log,
//! the same on every replay and rebuild.

use crate::owners::{Judged, Owners};
use crate::rollup::{ApplyStats, Rollup};
use crate::ticks::tick_of;
use hindsight_contracts::{
    Applied, ConsumerSource, Delivered, LogConsumer, Position, ProjectionStore, ProjectionWrite,
    Result, TickKind,
};
use hindsight_schemas::wire::RejectKind;
use hindsight_schemas::Event;
use hindsight_telemetry as tm;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct ProjectorConfig {
    /// Most events folded in one durable step while the projector keeps up
    /// with the log: small steps keep the time from an event's append to
    /// its buckets short.
    pub batch_max: usize,
    /// Most events in one step while the log is behind. A poll that comes
    /// back full (`batch_max` or more) doubles the next one, up to this;
    /// one that finds fewer events than it asked for sizes the next to
    /// what it found, never below `batch_max` (see `Projector::poll_max`).
    /// A step writes every row it changed, so a coarse bucket open across
    /// many steps is rewritten once per step: on a long tail, a backlog
    /// drained in 20 000-event steps writes several rows per event (see
    /// `rebuild`).
    /// And a step dirties a page per token and table it touches, whatever
    /// its events: over 20 000 tokens, 640 000-event steps drained a
    /// backlog about twice as fast as 160 000 (`hindsight-bench live`).
    /// Memory grows with the step: its events and the rows they touch.
    pub backlog_batch_max: usize,
    /// Rows a grown step may touch: a full poll doubles the next only as
    /// far as the last step's rows per event say this many rows allow.
    /// Over 20 000 tokens a 640 000-event step touches ~290 000 rows; over
    /// 100 000 it touched ~700 000, and the step's rows (in the rollup, in
    /// the write, in the store's sort) were most of the process's memory.
    /// Steps never shrink below `batch_max` for it.
    pub step_rows_max: usize,
    /// How long an idle poll waits for new events.
    pub idle_wait: Duration,
    /// Rows kept in memory between steps before they are dropped.
    pub max_cached_rows: usize,
    /// Called by [`Projector::run`] when it finds the log caught up, its
    /// last write durable, after a backlog grew its steps: their buffers
    /// are free then, and the binary hands them back to the system
    /// (`hindsight::allocator::release_free_memory`), so a projector that
    /// drained a backlog does not keep its peak memory while idle.
    pub release_memory: Option<fn()>,
}

impl Default for ProjectorConfig {
    fn default() -> Self {
        ProjectorConfig {
            batch_max: 20_000,
            backlog_batch_max: 640_000,
            step_rows_max: 300_000,
            idle_wait: Duration::from_millis(100),
            max_cached_rows: 500_000,
            release_memory: None,
        }
    }
}

impl ProjectorConfig {
    /// For replaying a whole log (`hindsight rebuild`): steps of 250 000
    /// events. A step writes every row it changed, so a coarse bucket (an
    /// hour, a day) open across many steps is rewritten once per step: on
    /// a long tail of rarely trading tokens, 20 000-event steps rewrite
    /// each token's six coarse rows a hundred times a day of log. Memory
    /// stays bounded: the step's events (a few hundred bytes each) plus
    /// the rows they touch, and `max_cached_rows` between steps.
    pub fn rebuild() -> Self {
        ProjectorConfig {
            batch_max: 250_000,
            backlog_batch_max: 250_000,
            ..Default::default()
        }
    }
}

pub struct Projector {
    source: Arc<dyn ConsumerSource>,
    store: Arc<dyn ProjectionStore>,
    config: ProjectorConfig,
    rollup: Rollup,
    owners: Owners,
    /// The last segment's write, handed to the store and not yet awaited.
    in_flight: Option<InFlight>,
    /// Most events the next poll takes: doubled after each full poll (up to
    /// `backlog_batch_max`, within `step_rows_max`), and after one that
    /// came back short, what it found (at least `batch_max`).
    ///
    /// Why not back to `batch_max` after a short poll: under a steady
    /// load the projector catches up at the end of large steps, and
    /// restarting from 20 000 events climbed back through steps that cost
    /// more per event (a step rewrites a block per token and resolution it
    /// touches however few its events). Over 20 000 tokens at 500 000
    /// events/s (`hindsight-bench live`) steps went 20 000 → ~600 000 →
    /// 20 000 every few seconds. What a short poll found is what arrived
    /// during the last step, so the next step is about as long, and the
    /// sizes settle where a step takes as long as its events took to
    /// arrive; an idle log (an empty poll) still returns to `batch_max`.
    poll_max: usize,
    /// A backlog grew the steps since the log was last found caught up.
    grown: bool,
    /// Events a top-up polled and left for the next step: a catalog record
    /// and what followed it (see [`Projector::top_up`]).
    carried: Vec<Delivered>,
}

/// A segment's write running on the store while the projector polls and
/// folds the next one. The store's writes are most of a step's time and the
/// fold most of the rest; overlapped, each keeps one core of a small machine
/// busy. What keeps it correct:
///
/// - a consumer that may hand partitions to another projector inside
///   `poll` (Kafka's, [`LogConsumer::reassigns`]) is polled only once the
///   write is durable: the new owner starts from the store's positions, and
///   a write landing after its writes would set rows and positions back.
///   With Kafka only the segments of one poll overlap;
/// - at most one write is in flight, so writes reach the store in log
///   order, and a step's log positions are committed only after its last
///   write is durable;
/// - a row the next segment loads from the store is never in the write in
///   flight: every row written stays in the rollup until it is forgotten,
///   and forgetting keeps the rows of the last drain, the write in flight's;
/// - the token owners the next segment looks up are read after the write
///   in flight is durable when that write holds catalog records;
/// - a failed write fails the segment that awaits it: the projector then
///   forgets everything and resumes from the durable position, as it does
///   for any failed step;
/// - what a top-up folds into the next step while this write runs
///   ([`Projector::top_up`]) is the log's next events in order, as a later
///   poll would have taken them: catalog records and what follows them
///   wait for the step after (`carried`), and its positions are committed
///   with that step's, after its write.
struct InFlight {
    /// What the store answered, and the time from the segment's fold to
    /// its durable write.
    task: tokio::task::JoinHandle<Result<(Applied, Duration)>>,
    /// It holds catalog records, which change what `lookup_tokens` reads.
    catalog: bool,
    /// Log positions to commit once it is durable: set on a step's last
    /// write.
    commit: Option<Vec<Position>>,
    report: Written,
}

/// What one step did.
#[derive(Debug, Default, Clone, Copy)]
pub struct StepStats {
    /// Events consumed, folded or not.
    pub events: usize,
    /// Rows written.
    pub rows: usize,
}

impl std::ops::AddAssign for StepStats {
    fn add_assign(&mut self, other: StepStats) {
        self.events += other.events;
        self.rows += other.rows;
    }
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
            rollup: Rollup::new(),
            owners: Owners::default(),
            in_flight: None,
            poll_max: config.batch_max,
            grown: false,
            carried: Vec::new(),
            config,
        }
    }

    /// Forgets every cached row and token owner, after waiting for the
    /// write in flight (whose outcome no longer matters: the caller resumes
    /// from the durable position). Rows are reloaded when next needed.
    pub async fn abandon(&mut self) {
        if let Some(w) = self.in_flight.take() {
            let _ = w.task.await;
        }
        self.rollup.clear();
        self.owners.clear();
        // Delivered again from the durable position.
        self.carried.clear();
    }

    /// Empties the store's derived tables ([`ProjectionStore::reset`]) to
    /// replay the whole log into them (`hindsight rebuild`). Until the
    /// projector forgets what it knows of the store (a failed step, a
    /// consumer-group rebalance), every row the store holds is one it
    /// wrote, so a bucket past the last one it wrote for a series is known
    /// absent and not loaded: on a log in time order, nearly every bucket.
    pub async fn reset_store(&mut self) -> Result<()> {
        self.abandon().await;
        self.store.reset().await?;
        self.rollup.store_emptied();
        Ok(())
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
                    // The last write becomes durable and committed.
                    if let Err(e) = self.settle(consumer.as_mut()).await {
                        tracing::error!(error = %e, "projector's last write failed");
                    }
                    return;
                }
                // An empty poll settles the write in flight once it is
                // done: an idle log's last events are committed without
                // waiting for more. While it runs, the projector polls
                // again (see `Projector::writing`).
                let result = match self.advance(consumer.as_mut()).await {
                    Ok(stats) if stats.events == 0 && self.writing() => Ok(()),
                    Ok(stats) if stats.events == 0 => {
                        let settled = self.settle(consumer.as_mut()).await;
                        if settled.is_ok() {
                            self.caught_up();
                        }
                        settled
                    }
                    other => other.map(|_| ()),
                };
                match result {
                    Ok(()) => {
                        backoff = Duration::from_millis(100);
                        report_lag(consumer.as_mut()).await;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "projector step failed; resuming from the durable position");
                        self.abandon().await;
                        sleep_or_shutdown(backoff, &mut shutdown).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                        break;
                    }
                }
            }
        }
    }

    /// Projects until the consumer has nothing more — every partition it
    /// holds at zero lag (for `rebuild` and tests) — and every write is
    /// durable.
    ///
    /// The lag is asked after every step, not only after an empty poll: a
    /// poll at the log's end waits out `idle_wait` for events that will not
    /// come, a tenth of a second at the end of every `rebuild`.
    pub async fn catch_up(&mut self) -> Result<u64> {
        let mut consumer = self.source.open().await?;
        let mut total = 0;
        loop {
            let caught_up = match self.advance(consumer.as_mut()).await {
                Ok(stats) => {
                    total += stats.events as u64;
                    // Empty before a consumer group assigns partitions:
                    // keep going.
                    consumer
                        .lag()
                        .await
                        .map(|lag| !lag.is_empty() && lag.iter().all(|(_, behind)| *behind == 0))
                }
                Err(e) => Err(e),
            };
            let done = match caught_up {
                Ok(true) => self.settle(consumer.as_mut()).await.map(|_| true),
                other => other,
            };
            match done {
                Ok(true) => return Ok(total),
                Ok(false) => {}
                Err(e) => {
                    self.abandon().await;
                    return Err(e);
                }
            }
        }
    }

    /// One durable step: [`Projector::advance`], then every write awaited
    /// and the step's positions committed to the log.
    pub async fn step(&mut self, consumer: &mut dyn LogConsumer) -> Result<StepStats> {
        let stats = match self.advance(consumer).await {
            Ok(stats) => self.settle(consumer).await.map(|_| stats),
            failed => failed,
        };
        if stats.is_err() {
            self.abandon().await;
        }
        stats
    }

    /// The batch of one poll, folded and handed to the store segment by
    /// segment (see the module's doc); the last segment's write may still
    /// be in flight when this returns ([`Projector::settle`] awaits it).
    /// After an error the caller must [`Projector::abandon`] the rows in
    /// memory, which may hold events that are not durable.
    pub async fn advance(&mut self, consumer: &mut dyn LogConsumer) -> Result<StepStats> {
        if consumer.reassigns() {
            // This poll may give a partition to another projector, which
            // starts from the store's positions: the write in flight must
            // be durable first, or it could land after the new owner's
            // writes and set rows and positions back.
            self.settle(consumer).await?;
        }
        let polled = Instant::now();
        // Beside a write, a poll that finds nothing looks at the write again
        // soon: it is settled as soon as it is done.
        let wait = match self.writing() {
            true => TOP_UP_WAIT,
            false => self.config.idle_wait,
        };
        let batch = match self.carried.is_empty() {
            true => consumer.poll(self.poll_max, wait).await?,
            false => std::mem::take(&mut self.carried),
        };
        if !batch.is_empty() {
            stage_took("poll", polled);
        }
        let full = batch.len() >= self.poll_max;
        if !full {
            self.poll_max = batch.len().max(self.config.batch_max);
            self.grown |= self.poll_max > self.config.batch_max;
        }
        // Partitions moved (a consumer-group rebalance): cached rows of a
        // partition this projector lost may since have been written by
        // another projector, so every row is loaded afresh.
        if consumer.assignment_changed() {
            // The write in flight is awaited, its positions not committed
            // to the log: the group has moved to a new generation, which
            // refuses an older one's commit. Nothing is lost: they are in
            // the store, where assigned partitions start, and at worst the
            // events are delivered again, which is replay-safe.
            self.finish(None).await?;
            self.rollup.clear();
            self.owners.clear();
            self.carried.clear();
        }
        if batch.is_empty() {
            return Ok(StepStats::default());
        }
        let consumed = last_positions(&batch);
        let mut stats = StepStats::default();
        let mut rest = batch;
        while !rest.is_empty() {
            stats += self.next_segment(consumer, &mut rest, &consumed).await?;
        }
        if full {
            self.poll_max = self.grow(stats);
            self.grown |= self.poll_max > self.config.batch_max;
        }
        if self.rollup.len() > self.config.max_cached_rows {
            // Without waiting for the write in flight: its rows stay (see
            // `InFlight`). The token owners stay too: they are bounded on
            // their own (`Owners::missing`), and the next segment would
            // look up nearly every one of them again.
            self.rollup.forget_rows(self.config.max_cached_rows);
        }
        Ok(stats)
    }

    /// The next poll's size after a full one, whose `step.events` events
    /// touched `step.rows` rows: doubled, within `backlog_batch_max`, and
    /// within the events that `step_rows_max` rows allow at the step's rows
    /// per event. A larger step touches fewer rows per event (a token's
    /// open rows take more of its events), so from below this converges on
    /// the step that touches `step_rows_max` rows, without overshooting it.
    fn grow(&self, step: StepStats) -> usize {
        let c = &self.config;
        let by_rows = match step.rows {
            0 => usize::MAX,
            rows => (step.events as u128 * c.step_rows_max as u128 / rows as u128) as usize,
        };
        (self.poll_max * 2)
            .min(c.backlog_batch_max)
            .min(by_rows)
            .max(c.batch_max)
    }

    /// How many more events a step of `events` events may take within
    /// `step_rows_max` rows, at the rows per event it has touched so far:
    /// a step's rows are most of its memory. As in [`Projector::grow`], a
    /// larger step usually touches fewer rows per event (a token's open
    /// rows take more of its events), so this errs low; events of series
    /// the step has not met can pass it by what one top-up poll touches
    /// beyond the estimate, and the next poll then finds no room.
    fn rows_allow(&self, events: usize) -> usize {
        let rows = self.rollup.dirty_rows();
        let left = self.config.step_rows_max.saturating_sub(rows);
        match rows {
            0 => usize::MAX,
            rows => (events as u128 * left as u128 / rows as u128) as usize,
        }
    }

    /// The log is caught up and nothing is in flight: after a backlog,
    /// what its large steps held is free, and goes back to the system with
    /// the rollup's spare capacity ([`Rollup::shrink`]).
    fn caught_up(&mut self) {
        if !std::mem::take(&mut self.grown) {
            return;
        }
        self.rollup.shrink();
        if let Some(release) = self.config.release_memory {
            let started = Instant::now();
            release();
            tracing::debug!(took = ?started.elapsed(), "backlog drained; free memory released");
        }
    }

    /// Whether a write is in flight and still running.
    ///
    /// Why the loop does not wait for it on an empty poll: the last top-up
    /// had drained the log, so the poll after handing a step to the store
    /// often found nothing. Waiting for the write then, the projector
    /// folded nothing while it ran, and next polled one poll's worth
    /// (`batch_max`) of what had arrived: a step of 20 000 events that
    /// took most of a large step's write, the rest waiting another write.
    /// On the live benchmark (20 000 tokens, 500 000 events/s offered, 20 s)
    /// 23 of 108 steps were such steps, and the events behind them had the
    /// run's slowest ack → visible times.
    fn writing(&self) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|w| !w.task.is_finished())
    }

    /// Awaits the write in flight, reports it and commits its step's
    /// positions to the log.
    pub async fn settle(&mut self, consumer: &mut dyn LogConsumer) -> Result<()> {
        self.finish(Some(consumer)).await
    }

    /// Awaits the write in flight and reports it; commits its step's
    /// positions to `consumer` if given.
    async fn finish(&mut self, consumer: Option<&mut dyn LogConsumer>) -> Result<()> {
        let Some(w) = self.in_flight.take() else {
            return Ok(());
        };
        let (applied, took) = w
            .task
            .await
            .map_err(|e| hindsight_contracts::Error::backend("projector", e))??;
        w.report.record(&applied, took);
        if let (Some(positions), Some(consumer)) = (w.commit, consumer) {
            consumer.commit(&positions).await?;
            for p in &positions {
                metrics::gauge!(tm::PROJECTOR_POSITION, "partition" => p.partition.to_string())
                    .set((p.offset + 1) as f64);
            }
        }
        Ok(())
    }

    /// Takes the next segment off `rest`, folds it and hands its write to
    /// the store: the longest run whose ticks no catalog record of the run
    /// can decide otherwise. The last segment records every position of
    /// the batch (`consumed`).
    async fn next_segment(
        &mut self,
        consumer: &mut dyn LogConsumer,
        rest: &mut Vec<Delivered>,
        consumed: &[Position],
    ) -> Result<StepStats> {
        let mut judged = self.judge_ticks(consumer, rest).await?;
        let tail = rest.split_off(segment_end(rest, &self.owners));
        let segment = std::mem::replace(rest, tail);
        // The tail's are judged again with its segment: the records
        // folded before it may change its owners.
        judged.mismatched.retain(|(i, _)| *i < segment.len());
        let (mut upto, mut commit) = if rest.is_empty() {
            (consumed.to_vec(), Some(consumed.to_vec()))
        } else {
            (last_positions(&segment), None)
        };
        let mut folded = self.fold_segment(segment, judged).await?;
        stage_took("fold", folded.report.started);
        let waited = Instant::now();
        let last = rest.is_empty() && folded.catalog.is_empty();
        if last && !consumer.reassigns() && self.top_up(consumer, &mut folded, &mut upto).await? {
            commit = Some(upto.clone());
        }
        let (write, report) = self.take_write(folded, upto);
        let stats = StepStats {
            events: report.events,
            rows: write.rows.len(),
        };
        self.settle(consumer).await?;
        stage_took("wait", waited);
        let store = self.store.clone();
        let catalog = !write.catalog.is_empty();
        let started = report.started;
        self.in_flight = Some(InFlight {
            task: tokio::spawn(async move {
                let applied = store.apply(write).await?;
                Ok((applied, started.elapsed()))
            }),
            catalog,
            commit,
            report,
        });
        // Lets the write start now, not when this task next waits: a task
        // spawned on a runtime worker waits in that worker's LIFO slot,
        // which the other workers do not steal from (tokio#4941), and the
        // next poll usually finds events at once, so the next step's fold
        // ran first. On a long-tail `backfill --project` the store sat idle
        // ~240 ms of its ~1.7 s that way, against ~110–150 ms with this.
        tokio::task::yield_now().await;
        Ok(stats)
    }

    /// Judges the price ticks, snapshots and trades of `batch` against
    /// their tokens' owners (`Owners::judge`), looking up those not yet known. When the
    /// write in flight holds catalog records, which may change them, it
    /// waits for that write before looking any up.
    async fn judge_ticks(
        &mut self,
        consumer: &mut dyn LogConsumer,
        batch: &[Delivered],
    ) -> Result<Judged> {
        let mut judged = self.owners.judge(batch);
        let missing = judged.missing(batch);
        if missing.is_empty() {
            return Ok(judged);
        }
        if self.in_flight.as_ref().is_some_and(|w| w.catalog) {
            self.settle(consumer).await?;
        }
        let found = self.store.lookup_tokens(missing.clone()).await?;
        self.owners.fill(missing, found);
        self.owners.judge_unknown(batch, &mut judged);
        Ok(judged)
    }

    /// While the write in flight runs, folds into the step being made
    /// (`folded`, the last segment of its poll, with no catalog record)
    /// the events appended since its poll, up to a grown step's size
    /// (`backlog_batch_max`, and `step_rows_max` rows), and
    /// moves the step's last positions (`upto`) past them; returns whether
    /// it took any.
    ///
    /// Why: the projector folds a step faster than the store writes the
    /// one before (a live long tail: folds of 60–250 ms beside writes of
    /// 170–570 ms), and an event appended while it waited went out a whole
    /// step later. Taken into the waiting step, it is visible one write
    /// sooner; the step is what one poll taken later would have been.
    ///
    /// What keeps it correct: every event taken is one the step's poll
    /// would have taken had it come later; a catalog record ends the
    /// top-up, and it and what followed it are the next step's
    /// (`carried`), since a step holding catalog records is cut where they
    /// may decide a tick (`segment_end`). Owners are looked up only when
    /// the write in flight holds no catalog records. Only a consumer that
    /// never hands partitions away inside `poll` is polled beside a write.
    async fn top_up(
        &mut self,
        consumer: &mut dyn LogConsumer,
        folded: &mut Folded,
        upto: &mut Vec<Position>,
    ) -> Result<bool> {
        let mut took = false;
        loop {
            let writing = self
                .in_flight
                .as_ref()
                .is_some_and(|w| !w.catalog && !w.task.is_finished());
            // As large as a step grown by a backlog may be: the write's
            // pace, not the last poll's size, sets how much arrives.
            let most = self.config.backlog_batch_max.max(self.poll_max);
            let room = most
                .saturating_sub(folded.report.events)
                .min(self.rows_allow(folded.report.events))
                // A poll's worth at a time, so the rows are counted again
                // before the step grows much.
                .min(self.poll_max);
            if !writing || room == 0 || !self.carried.is_empty() {
                return Ok(took);
            }
            let mut batch = consumer.poll(room, TOP_UP_WAIT).await?;
            if let Some(at) = batch.iter().position(|d| is_catalog(&d.event)) {
                self.carried = batch.split_off(at);
            }
            if batch.is_empty() {
                continue;
            }
            for p in last_positions(&batch) {
                match upto.iter_mut().find(|q| q.partition == p.partition) {
                    Some(q) => q.offset = q.offset.max(p.offset),
                    None => upto.push(p),
                }
            }
            took = true;
            let judged = self.judge_ticks(consumer, &batch).await?;
            let more = self.fold_segment(batch, judged).await?;
            folded.absorb(more, most);
        }
    }

    /// Folds one segment into the rollup: its ticks and catalog records,
    /// its rows left dirty for [`Projector::take_write`]. Its ticks were
    /// judged against their tokens' owners (`judged`, by index in `data`):
    /// the mismatched are left out.
    async fn fold_segment(&mut self, mut data: Vec<Delivered>, judged: Judged) -> Result<Folded> {
        let started = Instant::now();
        let events = data.len();
        // In place: a step's events are most of its memory. Catalog records
        // are few, and copied out.
        let mut catalog: Vec<(Position, Event)> = Vec::new();
        let mut mismatched = Mismatched::default();
        let mut left_out = judged.mismatched.into_iter().peekable();
        let mut i = 0;
        data.retain(|d| {
            let at = i;
            i += 1;
            if is_catalog(&d.event) {
                catalog.push((d.position, d.event.clone()));
                return false;
            }
            match left_out.next_if(|(j, _)| *j == at) {
                Some((_, reason)) => {
                    mismatched.add(d.position, reason);
                    false
                }
                None => true,
            }
        });
        mismatched.report();
        let new_series = self.rollup.series_of(&data);
        if !new_series.is_empty() {
            let bounds = self.store.frontiers(new_series).await?;
            self.rollup.learn_frontiers(bounds);
        }
        let missing = self.rollup.missing(&data);
        if !missing.is_empty() {
            let rows = self.store.load(missing).await?;
            self.rollup.fill(rows);
        }
        let folded = self.rollup.apply(&data);
        // The events become their ticks, which take their strings, and
        // their token's id from the rows (`Tick`).
        let rollup = &self.rollup;
        let ticks: Vec<_> = data
            .into_iter()
            .enumerate()
            .filter_map(|(i, d)| tick_of(d, rollup.batch_id(i)))
            .collect();
        let trades = ticks.iter().filter(|t| t.kind() == TickKind::Trade).count() as u64;
        self.owners.forget_markets(&catalog);
        let report = Written {
            started,
            events,
            folded,
            trades,
            catalog: catalog.len() as u64,
            per_table: [0; 3],
        };
        Ok(Folded {
            ticks,
            catalog,
            report,
        })
    }

    /// The write of a step folded so far: the rows it changed, its ticks
    /// and catalog records, to be durable with the positions `upto`.
    fn take_write(&mut self, folded: Folded, upto: Vec<Position>) -> (ProjectionWrite, Written) {
        let Folded {
            ticks,
            catalog,
            mut report,
        } = folded;
        let rows = self.rollup.drain_dirty();
        rows.iter()
            .for_each(|r| report.per_table[r.key.table as usize] += 1);
        let write = ProjectionWrite {
            rows,
            ticks,
            catalog,
            consumed: upto,
        };
        (write, report)
    }
}

/// How long a poll beside a write in flight waits for an append before
/// the projector looks at the write again ([`Projector::top_up`],
/// [`Projector::writing`]).
const TOP_UP_WAIT: Duration = Duration::from_millis(5);

fn is_catalog(event: &Event) -> bool {
    matches!(event, Event::Series(_) | Event::Event(_) | Event::Market(_))
}

/// A step folded and not yet handed to the store: its rows are the
/// rollup's dirty ones.
struct Folded {
    ticks: Vec<hindsight_contracts::Tick>,
    catalog: Vec<(Position, Event)>,
    report: Written,
}

impl Folded {
    /// Takes in a later segment folded into the same step, which may grow
    /// to `most` events.
    ///
    /// Why room for `most` at once: a step topped up segment by segment
    /// (`Projector::top_up`) grew its ticks by doubling, each time copied
    /// into memory the system had to fault in and zero (freed memory goes
    /// back to it 10 ms later, `src/allocator.rs`): in a `perf` profile of
    /// `live` at 350 000 events/s, 1.8 % of all CPU was those faults alone.
    /// Reserved, the ticks are copied once, and only the pages written are
    /// faulted in.
    fn absorb(&mut self, later: Folded, most: usize) {
        if self.ticks.capacity() - self.ticks.len() < later.ticks.len() {
            let wanted = most.max(self.ticks.len() + later.ticks.len());
            self.ticks.reserve_exact(wanted - self.ticks.len());
        }
        self.ticks.extend(later.ticks);
        self.catalog.extend(later.catalog);
        let (r, l) = (&mut self.report, later.report);
        r.events += l.events;
        r.folded += l.folded;
        r.trades += l.trades;
        r.catalog += l.catalog;
    }
}

/// The stages of a step the projector times itself
/// (`hindsight_projector_step_stage_duration_seconds`): `poll`, `fold` (of
/// what the poll took), and `wait`, from the fold's end until the write
/// before it is durable, which includes folding what arrived meanwhile
/// (`Projector::top_up`). A `wait` near the store's `apply` means the
/// writes are the chain, and the fold keeps up with them.
pub const STAGES: [&str; 3] = ["poll", "fold", "wait"];

fn stage_took(stage: &'static str, since: Instant) {
    debug_assert!(STAGES.contains(&stage));
    metrics::histogram!(tm::PROJECTOR_STEP_SECONDS, "stage" => stage)
        .record(since.elapsed().as_secs_f64());
}

/// A segment's figures, recorded once its write is durable.
struct Written {
    /// When its fold began: the flush histogram covers fold and write.
    started: Instant,
    events: usize,
    folded: ApplyStats,
    trades: u64,
    catalog: u64,
    per_table: [u64; 3],
}

impl Written {
    fn record(self, applied: &Applied, took: Duration) {
        let Applied { refused } = applied;
        let folded = self.folded;
        metrics::histogram!(tm::PROJECTOR_FLUSH_SECONDS).record(took.as_secs_f64());
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "price").increment(folded.prices);
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "book").increment(folded.books);
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "metrics")
            .increment(folded.metrics);
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "trade").increment(self.trades);
        metrics::counter!(tm::PROJECTOR_EVENTS_APPLIED, "kind" => "catalog")
            .increment(self.catalog - refused.len() as u64);
        metrics::counter!(tm::PROJECTOR_REPLAYS_SKIPPED).increment(folded.replays_skipped);
        for table in hindsight_contracts::Table::ALL {
            metrics::counter!(tm::PROJECTOR_ROWS_WRITTEN, "table" => table.as_str())
                .increment(self.per_table[table as usize]);
        }
        for r in refused {
            metrics::counter!(tm::PROJECTOR_NOT_FOLDED, "reason" => r.reason.kind().label())
                .increment(1);
            tracing::warn!(
                partition = r.position.partition,
                offset = r.position.offset,
                market = %r.id,
                "catalog record not stored: {}",
                r.reason
            );
        }
    }
}

/// Where the first segment of `batch` ends: before the first tick or
/// snapshot whose fold a market record before it in the segment may decide
/// otherwise than the catalog as stored now (`owners`). A tick of market A
/// for token t is folded iff t is listed under no market or under A. A
/// pending record of market M can list t under M — which changes the
/// decision only when M is not A — or drop t from M, its listing market —
/// which changes it only when M is not A. Records of A itself for its own
/// ticks never need a cut, so the usual log (a market's record, then its
/// ticks) is written in one piece.
///
/// Before the first market record nothing is pending, and the ticks are
/// passed over without a lookup: a batch usually holds no record, and a
/// lookup per tick in `owners` (a cache miss or two) was ~1 % of a live
/// run's CPU.
fn segment_end(batch: &[Delivered], owners: &Owners) -> usize {
    let Some(first) = batch
        .iter()
        .position(|d| matches!(d.event, Event::Market(_)))
    else {
        return batch.len();
    };
    let mut listed: FxHashMap<&str, Vec<&str>> = FxHashMap::default();
    let mut pending: FxHashSet<&str> = FxHashSet::default();
    for (i, d) in batch.iter().enumerate().skip(first) {
        let (market, token) = match &d.event {
            Event::Market(m) => {
                pending.insert(&m.id);
                for t in &m.tokens {
                    listed.entry(&t.id).or_default().push(&m.id);
                }
                continue;
            }
            other => match other.token_data() {
                Some(tick) => tick,
                None => continue,
            },
        };
        let listed_elsewhere = listed
            .get(token)
            .is_some_and(|markets| markets.iter().any(|m| *m != market));
        let owner_pending = owners
            .get(token)
            .is_some_and(|owner| owner != market && pending.contains(owner));
        if listed_elsewhere || owner_pending {
            return i;
        }
    }
    batch.len()
}

/// Ticks and snapshots of one segment left unfolded: counted, and logged
/// once per token and market they were sent under, with the first position.
#[derive(Default)]
struct Mismatched {
    count: usize,
    /// `(first position, how many, reason)` per distinct reason text.
    seen: Vec<(Position, usize, hindsight_schemas::wire::Reject)>,
}

impl Mismatched {
    fn add(&mut self, position: Position, reason: hindsight_schemas::wire::Reject) {
        self.count += 1;
        match self.seen.iter_mut().find(|(_, _, r)| *r == reason) {
            Some((_, n, _)) => *n += 1,
            None => self.seen.push((position, 1, reason)),
        }
    }

    fn report(self) {
        if self.count == 0 {
            return;
        }
        metrics::counter!(tm::PROJECTOR_NOT_FOLDED, "reason" => RejectKind::MarketMismatch.label())
            .increment(self.count as u64);
        for (first, n, reason) in self.seen {
            tracing::warn!(
                partition = first.partition,
                offset = first.offset,
                events = n,
                "ticks or snapshots not folded (the first at this position): {reason}"
            );
        }
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
