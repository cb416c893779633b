//! The API under load: a separate `hindsight api` process over a store of
//! 100 000 markets, driven over loopback by this process. Each route is
//! measured next to a hello-world route of the same server (`/livez`) in
//! the same run, and the 200-point page, from the page cache and with the
//! cache missed, next to nginx serving its bytes as a static file, in
//! rounds (a ratio is the median of the rounds'); the API process's peak
//! RSS is read from /proc.
//!
//! Needs the release binary next to this one: `cargo build --release`.

use crate::nginx::Nginx;
use crate::process::Server;
use crate::shapes::median;
use hindsight::app::Embedded;
use hindsight_api::keys;
use hindsight_contracts::AuthStore;
use hindsight_contracts::{AppendBatch, EventLog};
use hindsight_projector::ProjectorConfig;
use hindsight_schemas::*;
use std::time::{Duration, Instant};

pub const KEY: &str = "hsk_bench_api_key";
const DAY: i64 = 1_756_684_800_000;
/// Rounds of the page from the cache, the page with the cache missed and
/// nginx, one after another.
const ROUNDS: u32 = 3;

pub fn run(quick: bool) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run_async(quick))
}

fn market(i: usize) -> Event {
    Event::Market(Box::new(MarketRecord {
        id: format!("bm-{i:06}"),
        slug: format!("bench-market-{i:06}"),
        event_id: Some(format!("be-{}", i / 10)),
        question: Some(format!(
            "Will benchmark outcome number {i} resolve yes by the end of the season?"
        )),
        description: None,
        status: "open".into(),
        start_date: Some(Timestamp(DAY)),
        end_date: None,
        closed_at: None,
        resolved_token_id: None,
        resolved_token_label: None,
        tokens: vec![
            Token {
                id: format!("bm-{i:06}-yes"),
                label: "Yes".into(),
            },
            Token {
                id: format!("bm-{i:06}-no"),
                label: "No".into(),
            },
        ],
        created_at: Timestamp(DAY),
        updated_at: Timestamp(DAY + i as i64),
    }))
}

/// 100 000 markets; 400 minutes of ticks and books for market 0.
async fn seed(app: &Embedded, markets: usize) -> anyhow::Result<()> {
    for chunk in (0..markets).collect::<Vec<_>>().chunks(20_000) {
        let events: Vec<_> = chunk.iter().map(|&i| market(i)).collect();
        app.log
            .append(AppendBatch {
                events: events.into(),
                idempotency: None,
            })
            .await?;
    }
    let mut events = Vec::new();
    for k in 0..400 {
        let ts = Timestamp(DAY + k * 60_000);
        for (token, p) in [("bm-000000-yes", 0.4), ("bm-000000-no", 0.6)] {
            events.push(Event::Price(PriceTick {
                market_id: "bm-000000".into(),
                token_id: token.into(),
                ts,
                p,
            }));
            let levels = |base: f64, step: f64| {
                (0..10)
                    .map(|l| BookLevel {
                        price: base + step * l as f64,
                        size: 100.0,
                    })
                    .collect()
            };
            events.push(Event::Book(Box::new(BookSnapshot {
                market_id: "bm-000000".into(),
                token_id: token.into(),
                ts,
                bids: levels(0.39, -0.01),
                asks: levels(0.41, 0.01),
            })));
        }
    }
    project_with_key(app, events).await
}

/// Appends `events` to the embedded log, projects them all, and stores the
/// benchmark's API key: a data directory `hindsight api` can serve.
pub async fn project_with_key(app: &Embedded, events: Vec<Event>) -> anyhow::Result<()> {
    for chunk in events.chunks(20_000) {
        app.log
            .append(AppendBatch {
                events: chunk.to_vec().into(),
                idempotency: None,
            })
            .await?;
    }
    app.projector(ProjectorConfig::default()).catch_up().await?;
    app.store
        .put_key(keys::record_for(KEY, "bench", "enterprise"))
        .await?;
    Ok(())
}

pub struct Figures {
    pub rps: f64,
    pub p50: f64,
    pub p99: f64,
}

/// `connections` clients hitting `url` for `secs`; every response must be 200.
pub async fn load(client: &reqwest::Client, url: &str, connections: usize, secs: f64) -> Figures {
    let url = url.to_string();
    load_each(client, move |_| url.clone(), connections, secs).await
}

/// As [`load`], request `n` (counted per client) asking `url(n)`.
pub async fn load_each(
    client: &reqwest::Client,
    url: impl Fn(u64) -> String + Clone + Send + 'static,
    connections: usize,
    secs: f64,
) -> Figures {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut n = c as u64;
            while Instant::now() < until {
                let url = url(n);
                n += connections as u64;
                let t = Instant::now();
                let r = client
                    .get(&url)
                    .header("X-API-Key", KEY)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{url}");
                r.bytes().await.unwrap();
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_by(f64::total_cmp);
    let pct = |q: f64| all[((all.len() as f64 * q).ceil() as usize).clamp(1, all.len()) - 1];
    Figures {
        rps: all.len() as f64 / secs,
        p50: pct(0.5),
        p99: pct(0.99),
    }
}

async fn run_async(quick: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("hindsight-bench-api-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let markets = 100_000;
    let started = Instant::now();
    seed(&Embedded::open(&dir)?, markets).await?;
    println!(
        "== API ({markets} markets seeded in {:.1} s; separate `hindsight api` process)",
        started.elapsed().as_secs_f64()
    );

    let server = Server::api(|c| {
        c.arg("--data-dir").arg(&dir);
    })?;
    let base = server.base.clone();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    // Ready once the catalog is loaded: a search finds the last market.
    server
        .until_ready(
            &client,
            "/v1/markets?search=bench-market-099999",
            KEY,
            |body| body.contains("bm-099999"),
        )
        .await?;

    let (start, end) = (DAY / 1000, DAY / 1000 + 86_400);
    let routes = [
        ("hello world (/livez)", "/livez".to_string()),
        ("token prices, 200 points", format!("/v1/tokens/bm-000000-yes/prices?start_ts={start}&end_ts={end}&resolution=1m&limit=200")),
        ("market prices, 2 tokens x 100", format!("/v1/markets/bm-000000/prices?start_ts={start}&end_ts={end}&resolution=1m&limit=200")),
        ("token books, 100 snapshots x 20 levels", format!("/v1/tokens/bm-000000-yes/books?start_ts={start}&end_ts={end}&resolution=1m&limit=100")),
        ("markets search over 100 000", "/v1/markets?search=outcome%20number%2077777%20".to_string()),
    ];
    let secs = if quick { 1.5 } else { 4.0 };
    let mut hello = 0.0;
    println!(
        "   {:<40} {:>10} {:>9} {:>9} {:>9}",
        "route", "req/s", "p50 ms", "p99 ms", "x hello"
    );
    let show = |name: &str, f: &Figures, hello: f64| {
        println!(
            "   {name:<40} {:>10.0} {:>9.2} {:>9.2} {:>9.2}",
            f.rps,
            f.p50,
            f.p99,
            f.rps / hello
        )
    };
    let page_url = format!("{base}{}", routes[1].1);
    for (name, path) in routes {
        let f = load(&client, &format!("{base}{path}"), 8, secs).await;
        if hello == 0.0 {
            hello = f.rps;
        }
        show(name, &f, hello);
    }
    // The anchor: the same page's bytes as a static file from nginx,
    // measured in rounds with the page from the cache and the page with
    // the cache missed, so that a moment of the machine's (which moves a
    // single measurement by a third) weighs on both sides of a ratio.
    let body = client
        .get(&page_url)
        .header("X-API-Key", KEY)
        .send()
        .await?
        .bytes()
        .await?;
    let nginx = Nginx::serve(&client, &body).await?;
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let cached = load(&client, &page_url, 8, secs).await;
        // Each request starts a second earlier than any before it, in
        // this round or another: the same 200 points, another cursor.
        let (base_, token) = (base.clone(), "bm-000000-yes");
        let missed = load_each(
            &client,
            move |n| {
                let earlier = round as u64 * 1_000_000 + n + 1;
                format!(
                    "{base_}/v1/tokens/{token}/prices?start_ts={}&end_ts={end}&resolution=1m&limit=200",
                    start - earlier as i64
                )
            },
            8,
            secs,
        )
        .await;
        let anchor = load(&client, &nginx.url, 8, secs).await;
        println!(
            "   round {}: page from the cache {:.0} req/s (p99 {:.2} ms), cache missed {:.0} \
             (p99 {:.2} ms), nginx {:.0} (p99 {:.2} ms): {:.2}x and {:.2}x nginx",
            round + 1,
            cached.rps,
            cached.p99,
            missed.rps,
            missed.p99,
            anchor.rps,
            anchor.p99,
            cached.rps / anchor.rps,
            missed.rps / anchor.rps
        );
        rounds.push([cached, missed, anchor]);
    }
    drop(nginx);
    // Medians of the rounds: each figure's, and each round's ratio's.
    let figures = |i: usize| Figures {
        rps: median(rounds.iter().map(|r| r[i].rps)),
        p50: median(rounds.iter().map(|r| r[i].p50)),
        p99: median(rounds.iter().map(|r| r[i].p99)),
    };
    let ratio = |i: usize| median(rounds.iter().map(|r| r[i].rps / r[2].rps));
    let (cached, missed, anchor) = (figures(0), figures(1), figures(2));
    show("token prices, 200 points, cache missed", &missed, hello);
    show("nginx, the 200-point page as a file", &anchor, hello);
    println!(
        "   200-point page / nginx: req/s {:.2}x (median of {ROUNDS} rounds' ratios), p99 {:.2} ms \
         against nginx's {:.2} ({} bytes; the store unchanged, so served from the page cache)",
        ratio(0),
        cached.p99,
        anchor.p99,
        body.len()
    );
    println!(
        "   the same, cache missed / nginx: req/s {:.2}x (median of {ROUNDS}), p99 {:.2} ms \
         (read and encoded each time)",
        ratio(1),
        missed.p99,
    );
    println!(
        "   peak RSS of the API process: {:.0} MB",
        server.memory_mb("VmHWM:")
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
