//! Demo data: the generator ([`generator`]), and the one loop that feeds it
//! somewhere — straight into the log (`dev`) or over HTTP to an ingest
//! service, as a pipeline would (`hindsight feed`).

pub mod generator;

use anyhow::bail;
use generator::Demo;
use hindsight_contracts::{AppendBatch, EventLog, Idempotency};
use hindsight_schemas::{codec, Event, Timestamp};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Events per history batch.
const HISTORY_BATCH: usize = 5_000;
/// A book snapshot every this many rounds (one round a minute of history,
/// one a second live).
const BOOK_EVERY: u64 = 5;
const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 3_600_000;

/// What the generator produces.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    pub seed: u64,
    /// Hours of history before the live ticks, starting on the hour.
    pub history_hours: u32,
}

/// Where demo batches go. Every batch carries an idempotency key derived
/// from the seed and the history's start, so a retried batch is never
/// appended twice.
pub enum Sink {
    /// Appended to the log in this process (dev).
    Log(Arc<dyn EventLog>),
    /// Posted to an ingest service (feed).
    Http(HttpSink),
}

impl Sink {
    async fn send(&self, key: String, events: Vec<Event>) -> anyhow::Result<()> {
        match self {
            Sink::Log(log) => {
                // The body a pipeline would send: the events' envelopes.
                let body: Vec<u8> = events.iter().flat_map(codec::encode).collect();
                let batch = AppendBatch {
                    idempotency: Some(Idempotency::for_body(key, &body, Vec::new())),
                    events: events.into(),
                };
                // Dev keeps generating after a failed append (the next round
                // may well succeed); the failure is logged, not fatal.
                if let Err(e) = log.append(batch).await {
                    tracing::error!(error = %e, "demo feed could not append");
                }
                Ok(())
            }
            Sink::Http(http) => http.post(&key, events).await,
        }
    }
}

/// The demo generator positioned at the start of its history.
pub struct DemoFeed {
    demo: Demo,
    start: Timestamp,
    /// Prefix of every idempotency key of this feed.
    prefix: String,
}

impl DemoFeed {
    pub fn new(cfg: &DemoConfig, now: Timestamp) -> Self {
        let start = Timestamp((now.0 / HOUR_MS - i64::from(cfg.history_hours)) * HOUR_MS);
        DemoFeed {
            demo: Demo::new(cfg.seed, start),
            start,
            prefix: format!("demo-{}-{}", cfg.seed, start.0),
        }
    }

    /// Sends the catalog, then a round a minute from the start of the
    /// history up to `now`. Returns the number of events sent.
    pub async fn history(&mut self, sink: &Sink, now: Timestamp) -> anyhow::Result<usize> {
        let catalog = self.demo.catalog().to_vec();
        let mut sent = catalog.len();
        sink.send(format!("{}-catalog", self.prefix), catalog)
            .await?;
        let (mut t, mut n) = (self.start, 0);
        let mut events = Vec::new();
        while t < now {
            self.demo.round(t, BOOK_EVERY, &mut events);
            t = Timestamp(t.0 + MINUTE_MS);
            if events.len() >= HISTORY_BATCH || t >= now {
                sent += events.len();
                sink.send(format!("{}-{n}", self.prefix), std::mem::take(&mut events))
                    .await?;
                n += 1;
            }
        }
        Ok(sent)
    }

    /// A round of live ticks every second until `stop` turns true.
    pub async fn live(
        &mut self,
        sink: &Sink,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
            let at = Timestamp::now();
            let mut events = Vec::new();
            self.demo.round(at, BOOK_EVERY, &mut events);
            sink.send(format!("{}-live-{}", self.prefix, at.0), events)
                .await?;
        }
    }
}

/// Dev's demo: history only into a fresh log, then live ticks until stopped.
pub async fn run(
    cfg: &DemoConfig,
    sink: &Sink,
    history: bool,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let now = Timestamp::now();
    let mut feed = DemoFeed::new(cfg, now);
    if history {
        feed.history(sink, now).await?;
    }
    feed.live(sink, stop).await
}

/// Posts NDJSON batches to an ingest service, retrying 503s (honouring
/// `Retry-After`) and transport errors under the batch's idempotency key,
/// so a retry never duplicates.
pub struct HttpSink {
    client: reqwest::Client,
    url: String,
    token: String,
}

impl HttpSink {
    /// `base` is the ingest service's address (`http://host:port`).
    pub fn new(base: &str, token: &str) -> Self {
        HttpSink {
            client: reqwest::Client::new(),
            url: format!("{}/ingest/v1/events", base.trim_end_matches('/')),
            token: token.to_string(),
        }
    }

    async fn post(&self, key: &str, events: Vec<Event>) -> anyhow::Result<()> {
        let body = events
            .iter()
            .map(hindsight_schemas::wire::to_line)
            .collect::<Vec<_>>()
            .join("\n");
        let mut delay = Duration::from_millis(500);
        for _ in 0..20 {
            let sent = self
                .client
                .post(&self.url)
                .bearer_auth(&self.token)
                .header("Idempotency-Key", key)
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                    let wait = r
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1);
                    tokio::time::sleep(Duration::from_secs(wait).max(delay)).await;
                }
                Ok(r) => bail!(
                    "ingest answered {}: {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "ingest unreachable; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
            delay = (delay * 2).min(Duration::from_secs(10));
        }
        bail!("ingest kept refusing batch {key}")
    }
}
