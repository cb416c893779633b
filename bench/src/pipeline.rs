//! The embedded deployment end to end, in this process, over real HTTP on
//! loopback: throughput from ingest to durable buckets, and the delay from
//! an ingest acknowledgement to the tick being visible in `/v1`.

use crate::shape::DAY;
use hindsight::app::Embedded;
use hindsight_api::keys;
use hindsight_contracts::{AuthStore, ProjectionStore};
use hindsight_projector::ProjectorConfig;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub const TOKEN: &str = "bench-ingest-token";
const KEY: &str = "hsk_bench_key";

pub fn run(quick: bool) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run_async(quick))
}

/// NDJSON batches: 500 markets × 2 tokens of price ticks, and every tenth
/// round a book and a metrics sample per market.
fn bodies(events: usize, batch: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut body = String::with_capacity(batch * 100);
    let mut lines = 0;
    let mut i = 0usize;
    while i < events {
        let m = i % 500;
        let round = i / 1000;
        let t = DAY + round as i64;
        let p = ((i * 7919) % 1000) as f64 / 1000.0;
        body.push_str(&format!(
            "{{\"kind\":\"price\",\"market_id\":\"bm{m}\",\"token_id\":\"bm{m}-{}\",\"ts\":{t},\"p\":{p}}}\n",
            if i.is_multiple_of(2) { "yes" } else { "no" }
        ));
        if round.is_multiple_of(10) && i.is_multiple_of(2) {
            body.push_str(&format!(
                "{{\"kind\":\"book\",\"market_id\":\"bm{m}\",\"token_id\":\"bm{m}-yes\",\"ts\":{t},\"bids\":[[0.41,10],[0.40,20]],\"asks\":[[0.43,5],[0.44,9]]}}\n"
            ));
            body.push_str(&format!(
                "{{\"kind\":\"metrics\",\"market_id\":\"bm{m}\",\"ts\":{t},\"volume\":{},\"liquidity\":1000.5,\"spread\":0.02}}\n",
                i as f64
            ));
            lines += 2;
            i += 2;
        }
        lines += 1;
        i += 1;
        if lines >= batch {
            out.push(std::mem::take(&mut body));
            lines = 0;
        }
    }
    if !body.is_empty() {
        out.push(body);
    }
    out
}

/// The embedded app serving ingest and `/v1` on a loopback port, with its
/// projector running, over a fresh data directory (removed by
/// [`Harness::stop`]). Shared by the `pipeline` and `live` sections, so
/// both measure the same server the same way.
pub struct Harness {
    pub app: Embedded,
    /// `http://127.0.0.1:{port}`
    pub base: String,
    pub client: reqwest::Client,
    dir: std::path::PathBuf,
    stop: watch::Sender<bool>,
    projector: tokio::task::JoinHandle<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    probes: std::sync::atomic::AtomicI64,
}

impl Harness {
    /// Opens a fresh data directory named after `name`, adds the API key
    /// and the probe market, and starts the projector and the server.
    pub async fn start(name: &str) -> anyhow::Result<Harness> {
        let dir =
            std::env::temp_dir().join(format!("hindsight-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let app = Embedded::open(&dir)?;
        app.store
            .put_key(keys::record_for(KEY, "bench", "enterprise"))
            .await?;
        let (stop, stopped) = watch::channel(false);
        let projector = tokio::spawn(app.projector(projector_config()).run(stopped.clone()));
        let router = app
            .api_router(Default::default(), stopped.clone())
            .await?
            .merge(app.ingest_router(TOKEN, 64 << 20));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let mut stopping = stopped;
        let server = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopping.wait_for(|stop| *stop).await;
                })
                .await
        });
        let harness = Harness {
            app,
            base,
            client: reqwest::Client::new(),
            dir,
            stop,
            projector,
            server,
            probes: 0.into(),
        };
        harness.post(PROBE_MARKET.to_string()).await?;
        Ok(harness)
    }

    /// POSTs one NDJSON body to ingest; anything but 200 is an error.
    pub async fn post(&self, body: String) -> anyhow::Result<()> {
        post(&self.client, &self.base, body).await
    }

    /// The log offset the projector has made durable in buckets: every
    /// event below it is in the store.
    pub async fn durable(&self) -> anyhow::Result<u64> {
        Ok(self
            .app
            .store
            .committed()
            .await?
            .first()
            .map_or(0, |p| p.offset))
    }

    /// Waits until everything appended so far is durable in buckets.
    pub async fn drain(&self) -> anyhow::Result<()> {
        let head = self.app.log.head().await?;
        while self.durable().await? < head {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Ingests the next probe tick, alone in a 1m bucket of its own, and
    /// returns its time once acknowledged. Probes are one minute apart from
    /// 30 days after the feeds' day: minutes no feed tick falls in.
    pub async fn post_probe(&self) -> anyhow::Result<i64> {
        let i = self
            .probes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = DAY + 30 * 86_400 + i * 60;
        self.post(format!(
            "{{\"kind\":\"price\",\"market_id\":\"probe\",\"token_id\":\"probe-yes\",\"ts\":{t},\"p\":0.5}}\n"
        ))
        .await?;
        Ok(t)
    }

    /// How many probe ticks `/v1` serves from time `from` on (one page, so
    /// at most 200). The projector makes ticks visible in log order, so
    /// these are the ones posted first.
    pub async fn visible_probes(&self, from: i64) -> anyhow::Result<usize> {
        let url = format!(
            "{}/v1/tokens/probe-yes/prices?start_ts={from}&end_ts={}&resolution=1m&limit=200",
            self.base,
            from + 200 * 60
        );
        let r = self
            .client
            .get(&url)
            .header("X-API-Key", KEY)
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "{url} answered {}", r.status());
        let body: serde_json::Value = r.json().await?;
        Ok(body["data"].as_array().map_or(0, Vec::len))
    }

    /// Ingests one probe tick and returns the milliseconds from its
    /// acknowledgement until `/v1` serves it.
    pub async fn probe(&self) -> anyhow::Result<f64> {
        let t = self.post_probe().await?;
        let acked = Instant::now();
        while self.visible_probes(t).await? == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(acked.elapsed().as_secs_f64() * 1000.0)
    }

    /// Stops the projector, the server and its usage meter, and removes
    /// the data directory. Everything the harness opened is freed here, so
    /// a harness started next in the process (`live`'s second phase) is
    /// measured without this one's caches and catalogs.
    pub async fn stop(self) {
        let Harness {
            app,
            client,
            dir,
            stop,
            projector,
            server,
            ..
        } = self;
        // Its idle keep-alive connections would hold the server's graceful
        // shutdown open.
        drop(client);
        let _ = stop.send(true);
        let _ = projector.await;
        let _ = server.await;
        drop(app);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The binary's running projector's settings (`ProjectorOpts::config`),
/// read from the same environment (`HINDSIGHT_PROJECTOR_STEP_ROWS_MAX`,
/// …), so a tuned deployment's projector can be measured as it would run.
fn projector_config() -> ProjectorConfig {
    #[derive(clap::Parser)]
    struct FromEnv {
        #[command(flatten)]
        projector: hindsight::config::ProjectorOpts,
    }
    <FromEnv as clap::Parser>::parse_from(["hindsight-bench"])
        .projector
        .config()
}

const PROBE_MARKET: &str = "{\"kind\":\"market\",\"id\":\"probe\",\"slug\":\"probe\",\"status\":\"open\",\"tokens\":[{\"id\":\"probe-yes\",\"label\":\"Yes\"}]}\n";

/// The `q` quantile of `sorted` (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

async fn run_async(quick: bool) -> anyhow::Result<()> {
    let harness = Harness::start("pipeline").await?;
    let base = harness.base.clone();

    // -- throughput -----------------------------------------------------------
    let events = if quick { 200_000 } else { 1_000_000 };
    let bodies = bodies(events, 10_000);
    let total_lines: usize = bodies.iter().map(|b| b.lines().count()).sum();
    let started = Instant::now();
    crate::send_all(&format!("{base}/ingest/v1/events"), TOKEN, bodies, 4).await?;
    let acked = started.elapsed().as_secs_f64();
    harness.drain().await?;
    let durable = started.elapsed().as_secs_f64();
    println!("== embedded pipeline (HTTP ingest -> log -> projector -> buckets, 4 client connections, 10 000-line batches)");
    println!(
        "   {total_lines} events acknowledged in {acked:.2} s: {:.0} events/s ingested",
        total_lines as f64 / acked
    );
    println!(
        "   all durable in buckets after {durable:.2} s: {:.0} events/s end to end",
        total_lines as f64 / durable
    );

    // -- acknowledgement to visibility ---------------------------------------
    // A probe tick every 50 ms into its own 1m bucket, while a background
    // feed keeps ingest and projector busy (about 20 000 events/s).
    let background = {
        let (client, base) = (harness.client.clone(), base.clone());
        let bodies = self::bodies(if quick { 100_000 } else { 400_000 }, 2_000);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for body in bodies {
                tick.tick().await;
                post(&client, &base, body).await?;
            }
            anyhow::Ok(())
        })
    };
    let probes = if quick { 60 } else { 200 };
    let mut delays = Vec::with_capacity(probes);
    for _ in 0..probes {
        delays.push(harness.probe().await?);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    background.abort();
    delays.sort_by(f64::total_cmp);
    println!("== acknowledgement -> visible in /v1 ({probes} probes under a background feed)");
    println!(
        "   p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        quantile(&delays, 0.50),
        quantile(&delays, 0.99),
        delays[delays.len() - 1]
    );
    harness.stop().await;
    Ok(())
}

async fn post(client: &reqwest::Client, base: &str, body: String) -> anyhow::Result<()> {
    let r = client
        .post(format!("{base}/ingest/v1/events"))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await?;
    anyhow::ensure!(r.status() == 200, "ingest answered {}", r.status());
    Ok(())
}
