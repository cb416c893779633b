//! The embedded deployment end to end, in this process, over real HTTP on
//! loopback: throughput from ingest to durable buckets, and the delay from
//! an ingest acknowledgement to the tick being visible in `/v1`.

use hindsight::app::Embedded;
use hindsight_api::keys;
use hindsight_contracts::{AuthStore, ProjectionStore};
use hindsight_projector::ProjectorConfig;
use std::time::{Duration, Instant};
use tokio::sync::watch;

const TOKEN: &str = "bench-ingest-token";
const KEY: &str = "hsk_bench_key";
const DAY: i64 = 1_756_684_800;

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

async fn run_async(quick: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("hindsight-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let app = Embedded::open(&dir)?;
    app.store
        .put_key(keys::record_for(KEY, "bench", "enterprise"))
        .await?;
    let (stop_tx, stop) = watch::channel(false);
    let projector = tokio::spawn(app.projector(ProjectorConfig::default()).run(stop.clone()));
    let router = app
        .api_router(Default::default())
        .await?
        .merge(app.ingest_router(TOKEN, 64 << 20));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    let client = reqwest::Client::new();

    // -- throughput -----------------------------------------------------------
    let events = if quick { 200_000 } else { 1_000_000 };
    let bodies = bodies(events, 10_000);
    let total_lines: usize = bodies.iter().map(|b| b.lines().count()).sum();
    let started = Instant::now();
    crate::send_all(&format!("{base}/ingest/v1/events"), TOKEN, bodies, 4).await?;
    let acked = started.elapsed().as_secs_f64();
    let head = app.log.head().await?;
    loop {
        let done = app.store.committed().await?.first().map_or(0, |p| p.offset);
        if done >= head {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    let catalog = "{\"kind\":\"market\",\"id\":\"probe\",\"slug\":\"probe\",\"status\":\"open\",\"tokens\":[{\"id\":\"probe-yes\",\"label\":\"Yes\"}]}\n";
    post(&client, &base, catalog.to_string()).await;
    let background = {
        let (client, base) = (client.clone(), base.clone());
        let bodies = self::bodies(if quick { 100_000 } else { 400_000 }, 2_000);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for body in bodies {
                tick.tick().await;
                post(&client, &base, body).await;
            }
        })
    };
    let probes = if quick { 60 } else { 200 };
    let mut delays = Vec::with_capacity(probes);
    for i in 0..probes {
        let t = DAY + 30 * 86_400 + i as i64 * 60;
        post(&client, &base, format!("{{\"kind\":\"price\",\"market_id\":\"probe\",\"token_id\":\"probe-yes\",\"ts\":{t},\"p\":0.5}}\n")).await;
        let acked = Instant::now();
        let url = format!(
            "{base}/v1/tokens/probe-yes/prices?start_ts={t}&end_ts={}&resolution=1m",
            t + 60
        );
        loop {
            let body: serde_json::Value = client
                .get(&url)
                .header("X-API-Key", KEY)
                .send()
                .await?
                .json()
                .await?;
            if body["data"].as_array().is_some_and(|d| !d.is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        delays.push(acked.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    background.abort();
    delays.sort_by(f64::total_cmp);
    let pct = |q: f64| delays[((delays.len() as f64 * q).ceil() as usize).min(delays.len()) - 1];
    println!("== acknowledgement -> visible in /v1 ({probes} probes under a background feed)");
    println!(
        "   p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(0.50),
        pct(0.99),
        delays[delays.len() - 1]
    );

    let _ = stop_tx.send(true);
    let _ = projector.await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn post(client: &reqwest::Client, base: &str, body: String) {
    let r = client
        .post(format!("{base}/ingest/v1/events"))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
