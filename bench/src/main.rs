//! `cargo run --release -p hindsight-bench -- pipeline`
//!
//! Prints measured figures; checks only that systems compared side by side
//! hold the same data. Sections:
//! - `rollup`: the rollup engine's ticks/s on one core into all resolutions;
//! - `pipeline`: embedded end-to-end events/s from HTTP ingest to durable
//!   buckets, the delay from ingest acknowledgement to visibility in `/v1`
//!   (p50/p99), and peak RSS;
//! - `live`: the live path on a long-tail shape, with bodies generated
//!   as they are sent: 60 s (`HINDSIGHT_BENCH_LIVE_SECS`) of HTTP ingest →
//!   durable buckets on 20 000 tokens (`HINDSIGHT_BENCH_LIVE_TOKENS`)
//!   (events/s acknowledged and durable, the backlog and its drain,
//!   ack → visible p50/p99, RSS every 100 ms, the projector's steps by
//!   stage from the process's own metrics), then
//!   `HINDSIGHT_BENCH_LIVE_TICKS` ticks (default 100 M; 2 M with `--quick`)
//!   over 100 000 tokens with RSS printed at every 10 %; the clients send
//!   each batch once the last is acknowledged, or offer
//!   `HINDSIGHT_BENCH_LIVE_RATE` events/s; fails unless the store holds
//!   every acknowledged tick;
//! - `api`: req/s and p50/p99 of history pages and a search over 100 000
//!   markets next to a hello-world route, the 200-point page next to
//!   Debian's nginx serving the same bytes as a static file, and the API
//!   process's peak RSS (needs `cargo build --release` first, for the
//!   `hindsight` binary, and `scripts/install-tools.sh` for nginx);
//! - `engines`: the distributed deployment on Apache Kafka and Apache
//!   Cassandra: HTTP ingest → Kafka next to a raw rdkafka producer,
//!   projector Kafka → Cassandra on a long-tail and a dense shape, and a
//!   200-point page from Cassandra next to the embedded store (needs
//!   `eval "$(scripts/engines.sh start)"` and `cargo build --release`);
//! - `shapes`: `hindsight backfill` + `rebuild` of a long-tail and a dense
//!   file of ticks next to DuckDB and ClickHouse (chdb) rolling the same
//!   file into the same buckets, in rounds: seconds, bytes on disk, each
//!   round's ratios and their median, after checking the three agree
//!   (needs `cargo build --release` and the virtualenv
//!   `scripts/install-tools.sh` fills);
//! - `export`: a 10-million-row bulk export as CSV and Parquet from a
//!   `hindsight api` process: MB/s, rows/s and the process's RSS while it
//!   streams, next to nginx serving the same CSV bytes, and the Parquet
//!   file read back with pyarrow (needs `cargo build --release`, nginx and
//!   the virtualenv).
//! - `ticks`: tick-level reads on the embedded store, pages of 1 000 price
//!   ticks of one token per second.

mod api;
mod engines;
mod export;
mod live;
mod nginx;
mod pipeline;
mod process;
mod rollup;
mod shape;
mod shapes;
mod ticks;

fn main() -> anyhow::Result<()> {
    // As the `hindsight` binary does: `live` and `pipeline` run the server
    // in this process.
    hindsight::allocator::tune_malloc(hindsight::allocator::Workload::Service);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let which: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let all = which.is_empty();
    if all || which.contains(&"rollup") {
        rollup::run(quick);
    }
    if all || which.contains(&"pipeline") {
        pipeline::run(quick)?;
    }
    if all || which.contains(&"live") {
        live::run(quick)?;
    }
    if all || which.contains(&"api") {
        api::run(quick)?;
    }
    if all || which.contains(&"engines") {
        engines::run(quick)?;
    }
    if all || which.contains(&"shapes") {
        shapes::run(quick)?;
    }
    if all || which.contains(&"export") {
        export::run(quick)?;
    }
    if all || which.contains(&"ticks") {
        ticks::run(quick)?;
    }
    println!(
        "peak RSS of this process: {:.0} MB",
        process::memory_mb("self", "VmHWM:")
    );
    Ok(())
}

/// POSTs NDJSON bodies to an ingest URL over `connections` concurrent
/// connections; every batch must be accepted.
pub async fn send_all(
    url: &str,
    token: &str,
    bodies: Vec<String>,
    connections: usize,
) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let queue = std::sync::Arc::new(std::sync::Mutex::new(bodies));
    let mut senders = Vec::new();
    for _ in 0..connections {
        let (queue, client, url, token) = (
            queue.clone(),
            client.clone(),
            url.to_string(),
            token.to_string(),
        );
        senders.push(tokio::spawn(async move {
            loop {
                let Some(body) = queue.lock().unwrap().pop() else {
                    return Ok(());
                };
                let r = client
                    .post(&url)
                    .bearer_auth(&token)
                    .body(body)
                    .send()
                    .await?;
                anyhow::ensure!(r.status() == 200, "ingest answered {}", r.status());
            }
        }));
    }
    for s in senders {
        s.await??;
    }
    Ok(())
}
