//! The live path on a long-tail shape (issue 11): HTTP ingest → durable
//! buckets with ticks generated as they are sent, so the process's memory
//! is the server's, not pre-built bodies'.
//!
//! Phase 1 runs for a fixed time (`HINDSIGHT_BENCH_LIVE_SECS`, 60 s) on
//! 20 000 tokens (`HINDSIGHT_BENCH_LIVE_TOKENS`) and measures sustained
//! events/s (acknowledged and durable), the backlog left when the clients
//! stop and its drain, ack → visible latency sampled during the run, and
//! RSS sampled every 100 ms. The clients offer `HINDSIGHT_BENCH_LIVE_RATE`
//! events/s between them (0, the default: each batch as soon as the last
//! is acknowledged): ack → visible is a latency at a load, and at a rate
//! the projector cannot keep up with the backlog grows for as long as the
//! clients send. Phase 2 streams a fixed number of ticks
//! (`HINDSIGHT_BENCH_LIVE_TICKS`, 100 M by default) over 100 000 tokens and
//! prints RSS at every 10 % of progress, so its flatness is visible. Each
//! phase fails unless the store holds exactly the ticks acknowledged.
//!
//! Event time runs at 1 000 ticks a second unless
//! `HINDSIGHT_BENCH_LIVE_PER_EVENT_SECOND` says otherwise (see
//! `Phase::per_event_second`).
//!
//! Ids are short (`lt123`, `lt123-yes`) unless
//! `HINDSIGHT_BENCH_LIVE_LONG_IDS=1` pads them to Polymarket's lengths (a
//! market's condition id has 66 characters, a token's id ~77 digits): every
//! event holds its market's and its token's id on the heap from its decode
//! to its write, so their length is part of a step's memory.

use crate::pipeline::{quantile, Harness};
use crate::process::memory_mb;
use crate::shape::{market_line, spaced, token_id, LiveFeed, ZipfTokens, DAY};
use hindsight_contracts::{ReadStore, TickKind};
use hindsight_schemas::Timestamp;
use hindsight_telemetry as tm;
use metrics_exporter_prometheus::PrometheusHandle;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The issue's goals the figures are printed against.
const GOAL_EVENTS_PER_S: f64 = 500_000.0;
const GOAL_P99_MS: f64 = 1_000.0;
const GOAL_RSS_MB: f64 = 512.0;

/// Keep-alive client connections, each posting its next batch as soon as
/// the last is acknowledged.
const CONNECTIONS: usize = 4;
const BATCH: u64 = 10_000;

pub fn run(quick: bool) -> anyhow::Result<()> {
    let ticks = setting(
        "HINDSIGHT_BENCH_LIVE_TICKS",
        if quick { 2_000_000 } else { 100_000_000 },
    )?;
    // Phase 1's shape can be changed, to compare builds on a shorter run.
    let sustained = Phase {
        tokens: setting(
            "HINDSIGHT_BENCH_LIVE_TOKENS",
            if quick { 2_000 } else { 20_000 },
        )? as usize,
        end: End::After(Duration::from_secs(setting(
            "HINDSIGHT_BENCH_LIVE_SECS",
            if quick { 10 } else { 60 },
        )?)),
        rate: setting("HINDSIGHT_BENCH_LIVE_RATE", 0)?,
        prefix: match setting("HINDSIGHT_BENCH_LIVE_LONG_IDS", 0)? {
            0 => "lt".to_string(),
            _ => LONG_PREFIX.to_string(),
        },
        per_event_second: setting("HINDSIGHT_BENCH_LIVE_PER_EVENT_SECOND", 1_000)?.max(1),
    };
    let stream = Phase {
        tokens: 100_000,
        end: End::Ticks(ticks),
        rate: sustained.rate,
        prefix: sustained.prefix.clone(),
        per_event_second: sustained.per_event_second,
    };
    // As `hindsight dev` runs: with its metrics recorded, which the
    // phases read back to say where the projector's steps went.
    let metrics = tm::install();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            sustained.run(&metrics).await?;
            // What phase 1 leaves in the process once its server is
            // stopped: phase 2's RSS starts from here.
            println!(
                "   RSS between the phases, phase 1's server stopped: {:.0} MB",
                memory_mb("self", "VmRSS:")
            );
            stream.run(&metrics).await
        })
}

/// A number from the environment (`_` allowed between digits), or `default`.
fn setting(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .replace('_', "")
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={v:?}: {e}")),
        Err(_) => Ok(default),
    }
}

/// When a phase's clients stop sending.
enum End {
    After(Duration),
    Ticks(u64),
}

struct Phase {
    tokens: usize,
    end: End,
    /// Events/s the clients offer between them; 0: unpaced.
    rate: u64,
    /// Market `n`'s id is `{prefix}{n}`, its tokens' `{prefix}{n}-yes` and
    /// `-no`.
    prefix: String,
    /// Feed ticks per second of event time (`HINDSIGHT_BENCH_LIVE_PER_EVENT_SECOND`,
    /// 1 000 by default): at 1 000, minutes and hours of buckets close
    /// while the feed runs, far more often than live (at 500 000 events/s,
    /// 500 s of event time pass in a second); at the offered rate, event
    /// time keeps the wall clock's pace, as a live feed's does.
    per_event_second: u64,
}

/// With `HINDSIGHT_BENCH_LIVE_LONG_IDS`: market ids of 65–69 characters
/// and token ids of 68–73, where Polymarket's are 66 and ~77.
const LONG_PREFIX: &str = "0x5eed0f1d5c0ffee5eed0f1d5c0ffee5eed0f1d5c0ffee5eed0f1d5c0ffee5e";

/// What the clients share: the next tick number to claim (the feed's clock
/// and budget), ticks acknowledged, and the stop signal.
#[derive(Default)]
struct Progress {
    claimed: AtomicU64,
    acked: AtomicU64,
    stop: AtomicBool,
}

/// The figures at the moment every client has stopped.
#[derive(Clone, Copy)]
struct Stopped {
    at: Instant,
    acked: u64,
    /// Events durable in buckets (feed ticks and probes).
    durable: u64,
    /// Events in the log not yet durable.
    backlog: u64,
}

/// RSS of this process (server and clients) over a phase, in MB.
struct Rss {
    start: f64,
    min: f64,
    max: f64,
}

impl Phase {
    async fn run(&self, metrics: &PrometheusHandle) -> anyhow::Result<()> {
        let h = Arc::new(Harness::start("live").await?);
        let prefix = self.prefix.as_str();
        let markets = self.tokens / 2;
        // Each batch of market lines is made as it is sent, like the ticks:
        // the whole catalog of phase 2's 50 000 markets, held through the
        // phase, was 18 MB of the RSS measured (`heaptrack`).
        for first in (0..markets).step_by(BATCH as usize) {
            let body: String = (first..markets.min(first + BATCH as usize))
                .map(|m| market_line(&format!("{prefix}{m}")) + "\n")
                .collect();
            h.post(body).await?;
        }
        h.drain().await?;
        let base = h.durable().await?;
        let end = match self.end {
            End::After(d) => format!("{} s", d.as_secs()),
            End::Ticks(n) => format!("{} ticks", spaced(n as usize)),
        };
        let offered = match self.rate {
            0 => "each batch sent once the last is acknowledged".to_string(),
            r => format!("{} events/s offered", spaced(r as usize)),
        };
        println!(
            "== live long tail: {} tokens (Zipf activity, {} ticks per second of event time), {end}, {CONNECTIONS} connections, {} -line batches generated as sent, {offered}, token ids like {}",
            spaced(self.tokens),
            spaced(self.per_event_second as usize),
            spaced(BATCH as usize),
            token_id(prefix, 0),
        );
        println!("   load average before: {}", load_average());

        let progress = Arc::new(Progress::default());
        let steps = Steps::read(metrics);
        let started = Instant::now();
        let law = ZipfTokens::new(self.tokens, ZipfTokens::SEED);
        let clients: Vec<_> = (0..CONNECTIONS as u64)
            .map(|c| {
                let feed = LiveFeed::new(
                    prefix,
                    law.reseeded(ZipfTokens::SEED ^ (c + 1)),
                    self.per_event_second,
                );
                let pace = Pace {
                    started,
                    rate: self.rate,
                };
                tokio::spawn(client(
                    h.clone(),
                    progress.clone(),
                    feed,
                    self.budget(),
                    pace,
                ))
            })
            .collect();
        let delays = Arc::new(Mutex::new(Vec::new()));
        let prober = tokio::spawn(probe(h.clone(), progress.clone(), delays.clone()));

        let (stopped, rss) = self
            .watch(&h, &progress, &clients, &prober, started, base)
            .await?;
        for c in clients {
            c.await??;
        }
        prober.await??;
        let mut delays = std::mem::take(&mut *delays.lock().unwrap());
        delays.sort_by(f64::total_cmp);
        anyhow::ensure!(!delays.is_empty(), "no probe was visible during the run");
        report(started, stopped, &delays, rss);
        Steps::read(metrics).since(steps).report(stopped.acked);

        let stored = stored_ticks(&h, prefix, self.tokens).await?;
        anyhow::ensure!(
            stored == stopped.acked,
            "{} ticks acknowledged but {} in the store after the drain",
            spaced(stopped.acked as usize),
            spaced(stored as usize)
        );
        println!(
            "   every acknowledged tick is in the store ({} counted)",
            spaced(stored as usize)
        );
        // What the process keeps once idle: a projector caught up after a
        // backlog hands back what its large steps grew.
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!(
            "   RSS idle, 2 s after the count: {:.0} MB",
            memory_mb("self", "VmRSS:")
        );
        Arc::into_inner(h)
            .expect("clients and prober are done")
            .stop()
            .await;
        Ok(())
    }

    /// Samples every 100 ms from the start until the backlog is drained:
    /// RSS, and a line at every tenth of the run and every 10 s of the
    /// drain; stops the clients when the phase ends.
    async fn watch(
        &self,
        h: &Harness,
        progress: &Progress,
        clients: &[tokio::task::JoinHandle<anyhow::Result<()>>],
        prober: &tokio::task::JoinHandle<anyhow::Result<()>>,
        started: Instant,
        base: u64,
    ) -> anyhow::Result<(Stopped, Rss)> {
        let start = memory_mb("self", "VmRSS:");
        let mut rss = Rss {
            start,
            min: start,
            max: start,
        };
        let mut stopped = None;
        let (mut next_tenth, mut next_drain_line) = (1, 10);
        let mut sampler = tokio::time::interval(Duration::from_millis(100));
        loop {
            sampler.tick().await;
            let now = memory_mb("self", "VmRSS:");
            rss.min = rss.min.min(now);
            rss.max = rss.max.max(now);
            let durable = h.durable().await?;
            let Some(Stopped { at, .. }) = stopped else {
                let done = match self.end {
                    End::After(d) => started.elapsed().as_secs_f64() / d.as_secs_f64(),
                    End::Ticks(n) => progress.acked.load(Relaxed) as f64 / n as f64,
                };
                if done >= 1.0 {
                    progress.stop.store(true, Relaxed);
                }
                let finished = clients.iter().all(|c| c.is_finished());
                if next_tenth <= 10 && (done >= next_tenth as f64 / 10.0 || finished) {
                    next_tenth = (done * 10.0).floor() as usize + 1;
                    println!(
                        "   {:>3.0} %  {:>6.1} s  acknowledged {:>11}  durable {:>11}  RSS {now:.0} MB",
                        (done * 100.0).min(100.0),
                        started.elapsed().as_secs_f64(),
                        spaced(progress.acked.load(Relaxed) as usize),
                        spaced((durable - base) as usize),
                    );
                }
                if finished {
                    progress.stop.store(true, Relaxed);
                    stopped = Some(Stopped {
                        at: Instant::now(),
                        acked: progress.acked.load(Relaxed),
                        durable: durable - base,
                        backlog: h.app.log.head().await?.saturating_sub(durable),
                    });
                }
                continue;
            };
            // Probes stop with the clients: the log's head is final once
            // the prober is done.
            if prober.is_finished() && durable >= h.app.log.head().await? {
                return Ok((stopped.expect("set before the drain"), rss));
            }
            if at.elapsed().as_secs() >= next_drain_line {
                next_drain_line += 10;
                println!(
                    "   drain +{:>3} s   durable {:>11}  RSS {now:.0} MB",
                    at.elapsed().as_secs(),
                    spaced((durable - base) as usize),
                );
            }
        }
    }

    /// The most ticks the clients may claim.
    fn budget(&self) -> u64 {
        match self.end {
            End::After(_) => u64::MAX,
            End::Ticks(n) => n,
        }
    }
}

/// Prints a phase's figures against the goals; `delays` sorted.
fn report(started: Instant, stopped: Stopped, delays: &[f64], rss: Rss) {
    let Stopped {
        at,
        acked,
        durable: durable_at_stop,
        backlog,
    } = stopped;
    let fed = at.duration_since(started).as_secs_f64();
    let drained = at.elapsed().as_secs_f64();
    let rss_end = memory_mb("self", "VmRSS:");
    let (p50, p99) = (quantile(delays, 0.5), quantile(delays, 0.99));
    let acked_rate = acked as f64 / fed;
    let durable_rate = durable_at_stop as f64 / fed;
    let end_to_end = acked as f64 / (fed + drained);
    println!(
            "   {} ticks acknowledged in {fed:.1} s: {acked_rate:.0} events/s ({:.2}× the {GOAL_EVENTS_PER_S:.0}/s goal)",
            spaced(acked as usize),
            acked_rate / GOAL_EVENTS_PER_S
        );
    println!(
            "   durable in buckets while sending: {durable_rate:.0} events/s ({:.2}× goal); backlog at stop {} events, drained in {drained:.1} s; end to end {end_to_end:.0} events/s ({:.2}× goal)",
            durable_rate / GOAL_EVENTS_PER_S,
            spaced(backlog as usize),
            end_to_end / GOAL_EVENTS_PER_S
        );
    println!(
            "   ack -> visible in /v1 ({} probes during the run): p50 {p50:.1} ms, p99 {p99:.1} ms ({:.2}× the 1 s goal), max {:.1} ms",
            delays.len(),
            p99 / GOAL_P99_MS,
            delays[delays.len() - 1]
        );
    println!(
            "   RSS of this process (server and clients), every 100 ms through the drain: at start {:.0} MB, min {:.0} MB, max {:.0} MB ({:.2}× the 512 MB goal), after the drain {rss_end:.0} MB",
            rss.start,
            rss.min,
            rss.max,
            rss.max / GOAL_RSS_MB
        );
}

/// The projector's steps as its own metrics count them: per stage, the
/// seconds summed and the number of records. Under a steady load a tick
/// waits about two or three steps to be visible, so where a step's time
/// goes is where ack → visible goes.
#[derive(Clone, Copy)]
struct Steps([(f64, f64); 4]);

impl Steps {
    const STAGES: [&str; 4] = ["poll", "fold", "wait", "write"];

    fn read(metrics: &PrometheusHandle) -> Steps {
        let text = metrics.render();
        let histogram = |family: &str, label: &str| {
            let value = |part: &str| {
                let prefix = format!("{family}_{part}{{");
                text.lines()
                    .find(|l| l.starts_with(&prefix) && l.contains(label))
                    .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                    .unwrap_or(0.0)
            };
            (value("sum"), value("count"))
        };
        Steps(Self::STAGES.map(|stage| match stage {
            // The write is the store's: its `apply`.
            "write" => histogram(tm::STORE_QUERY_SECONDS, r#"op="apply""#),
            stage => histogram(tm::PROJECTOR_STEP_SECONDS, &format!(r#"stage="{stage}""#)),
        }))
    }

    fn since(self, before: Steps) -> Steps {
        Steps(std::array::from_fn(|i| {
            (self.0[i].0 - before.0[i].0, self.0[i].1 - before.0[i].1)
        }))
    }

    /// Prints the mean of each stage over the phase's `events`.
    fn report(self, events: u64) {
        let mean = |(sum, count): (f64, f64)| {
            if count > 0.0 {
                sum / count * 1000.0
            } else {
                0.0
            }
        };
        let writes = self.0[3].1;
        println!(
            "   projector steps (its metrics): {writes:.0} writes, {} events each on average; per step poll {:.0} ms, fold {:.0} ms, wait for the write in flight {:.0} ms, write {:.0} ms",
            spaced((events as f64 / writes.max(1.0)) as usize),
            mean(self.0[0]),
            mean(self.0[1]),
            mean(self.0[2]),
            mean(self.0[3]),
        );
    }
}

/// When the clients may send: tick `n` not before `started + n / rate`.
#[derive(Clone, Copy)]
struct Pace {
    started: Instant,
    /// Events/s; 0: no wait.
    rate: u64,
}

impl Pace {
    /// Waits until the batch starting at tick `first` is due. A batch
    /// acknowledged late is not made up for by a burst beyond the
    /// clients' connections: each posts its next once the last is done.
    async fn until_due(self, first: u64) {
        if self.rate > 0 {
            let due = self.started + Duration::from_secs_f64(first as f64 / self.rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
    }
}

/// One keep-alive connection: claims the next batch of tick numbers,
/// generates its body and posts it when due, until stopped or the budget
/// is spent.
async fn client(
    h: Arc<Harness>,
    progress: Arc<Progress>,
    mut feed: LiveFeed,
    budget: u64,
    pace: Pace,
) -> anyhow::Result<()> {
    while !progress.stop.load(Relaxed) {
        let first = progress.claimed.fetch_add(BATCH, Relaxed);
        if first >= budget {
            break;
        }
        pace.until_due(first).await;
        let range = first..(first + BATCH).min(budget);
        let lines = range.end - range.start;
        if let Err(e) = h.post(feed.body(range)).await {
            // The others stop too: the phase fails as soon as it can.
            progress.stop.store(true, Relaxed);
            return Err(e);
        }
        progress.acked.fetch_add(lines, Relaxed);
    }
    Ok(())
}

/// Ack → visible probes: one posted every 100 ms while the clients send
/// (however long the last takes to show), and one watcher polling `/v1`
/// every 5 ms for the oldest still invisible, so a backlog of seconds
/// still gives a probe per 100 ms and costs one poller.
async fn probe(
    h: Arc<Harness>,
    progress: Arc<Progress>,
    delays: Arc<Mutex<Vec<f64>>>,
) -> anyhow::Result<()> {
    let waiting = Arc::new(Mutex::new(VecDeque::<(i64, Instant)>::new()));
    let poster = {
        let (h, waiting) = (h.clone(), waiting.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(100));
            // A slow acknowledgement delays the next probe, not a burst.
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !progress.stop.load(Relaxed) {
                every.tick().await;
                let t = h.post_probe().await?;
                waiting.lock().unwrap().push_back((t, Instant::now()));
            }
            anyhow::Ok(())
        })
    };
    loop {
        let oldest = waiting.lock().unwrap().front().map(|&(t, _)| t);
        match oldest {
            Some(t) => {
                let visible = h.visible_probes(t).await?;
                let seen = Instant::now();
                let mut waiting = waiting.lock().unwrap();
                let mut delays = delays.lock().unwrap();
                let shown = visible.min(waiting.len());
                for (_, acked) in waiting.drain(..shown) {
                    delays.push((seen - acked).as_secs_f64() * 1000.0);
                }
            }
            None if poster.is_finished() => return poster.await?,
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Price ticks the store holds over every token of the feed, counted per
/// token where they lie (`count_ticks`), not read.
async fn stored_ticks(h: &Harness, prefix: &str, tokens: usize) -> anyhow::Result<u64> {
    let (start, end) = (
        Timestamp::from_secs(DAY),
        Timestamp::from_secs(DAY + 10 * 365 * 86_400),
    );
    let mut total = 0;
    for token in 0..tokens {
        total += h
            .app
            .store
            .count_ticks(TickKind::Price, &token_id(prefix, token), start, end)
            .await?;
    }
    Ok(total)
}

/// `/proc/loadavg`'s three load averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The long ids are as long as their doc says, over the markets of
    /// both phases.
    #[test]
    fn long_ids_have_polymarkets_lengths() {
        let markets = 100_000 / 2;
        let market = |m: usize| format!("{LONG_PREFIX}{m}").len();
        assert_eq!((market(0), market(markets - 1)), (65, 69));
        let token = |t: usize| token_id(LONG_PREFIX, t).len();
        assert_eq!((token(1), token(2 * markets - 2)), (68, 73));
    }
}
