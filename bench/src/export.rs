//! Bulk export: one token with a price every minute for 10 million minutes
//! (about 19 years; 1 million with `--quick`), projected into the embedded
//! store, then exported whole at `1m` from a separate `hindsight api`
//! process as CSV and as Parquet. Prints MB/s and rows/s of each, the API
//! process's resident memory sampled before and during the export (the
//! export streams: memory must stay flat whatever the row count), nginx
//! serving the same CSV bytes as a static file (the anchor), and checks the
//! Parquet file with pyarrow: row count, first and last time, and the sum
//! of prices against the values generated here.
//!
//! Needs `cargo build --release` (the `hindsight` binary), nginx and the
//! virtualenv `scripts/install-tools.sh` fills.

use crate::api::{project_with_key, KEY};
use crate::nginx::Nginx;
use crate::process::Server;
use hindsight::app::Embedded;
use hindsight_schemas::*;
use std::process::Command;
use std::time::{Duration, Instant};

/// 2006-01-01T00:00:00Z: 10 million minutes end in 2025.
const START: i64 = 1_136_073_600_000;
const MINUTE: i64 = 60_000;

fn price(i: i64) -> f64 {
    (i % 9_973) as f64 / 9_973.0
}

pub fn run(quick: bool) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run_async(quick))
}

struct Pulled {
    bytes: Vec<u8>,
    secs: f64,
    rss_max: f64,
}

/// Downloads `url` whole, sampling the server's RSS every 100 ms.
async fn pull(client: &reqwest::Client, url: &str, server: &Server) -> anyhow::Result<Pulled> {
    let started = Instant::now();
    let mut r = client.get(url).header("X-API-Key", KEY).send().await?;
    anyhow::ensure!(r.status() == 200, "{url}: {}", r.status());
    let mut bytes = Vec::new();
    let mut rss_max: f64 = server.memory_mb("VmRSS:");
    let mut sampled = Instant::now();
    while let Some(piece) = r.chunk().await? {
        bytes.extend_from_slice(&piece);
        if sampled.elapsed() > Duration::from_millis(100) {
            rss_max = rss_max.max(server.memory_mb("VmRSS:"));
            sampled = Instant::now();
        }
    }
    Ok(Pulled {
        bytes,
        secs: started.elapsed().as_secs_f64(),
        rss_max: rss_max.max(server.memory_mb("VmRSS:")),
    })
}

async fn run_async(quick: bool) -> anyhow::Result<()> {
    let python = std::path::PathBuf::from(std::env::var("HINDSIGHT_VENV").unwrap_or_else(|_| {
        format!(
            "{}/.cache/hindsight-venv",
            std::env::var("HOME").unwrap_or_default()
        )
    }))
    .join("bin/python");
    anyhow::ensure!(
        python.exists(),
        "{} is missing: run scripts/install-tools.sh",
        python.display()
    );
    let rows: i64 = if quick { 1_000_000 } else { 10_000_000 };
    let dir = std::env::temp_dir().join(format!("hindsight-bench-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let started = Instant::now();
    {
        let app = Embedded::open(&dir)?;
        let mut events = vec![Event::Market(Box::new(MarketRecord {
            id: "xm".into(),
            slug: "export-market".into(),
            event_id: None,
            question: Some("Export benchmark".into()),
            description: None,
            status: "open".into(),
            start_date: Some(Timestamp(START)),
            end_date: None,
            closed_at: None,
            resolved_token_id: None,
            resolved_token_label: None,
            tokens: vec![Token {
                id: "xm-yes".into(),
                label: "Yes".into(),
            }],
            created_at: Timestamp(START),
            updated_at: Timestamp(START),
        }))];
        for block in (0..rows).step_by(1_000_000) {
            events.extend((block..(block + 1_000_000).min(rows)).map(|i| {
                Event::Price(PriceTick {
                    market_id: "xm".into(),
                    token_id: "xm-yes".into(),
                    ts: Timestamp(START + i * MINUTE),
                    p: price(i),
                })
            }));
            project_with_key(&app, std::mem::take(&mut events)).await?;
        }
    }
    println!(
        "== export ({rows} rows: one token, a price every minute from 2006; projected in {:.1} s; separate `hindsight api` process)",
        started.elapsed().as_secs_f64()
    );

    let server = Server::api(|c| {
        c.arg("--data-dir").arg(&dir);
    })?;
    let base = server.base.clone();
    let client = reqwest::Client::new();
    server
        .until_ready(&client, "/v1/markets/xm", KEY, |_| true)
        .await?;
    let end = START + rows * MINUTE;
    let url = |format: &str| {
        format!(
            "{base}/v1/export/prices?token_id=xm-yes&start_ts={}&end_ts={}&resolution=1m&format={format}",
            START / 1000,
            end / 1000
        )
    };
    let idle = server.memory_mb("VmRSS:");
    println!("   API process RSS before exporting: {idle:.0} MB");
    println!(
        "   {:<34} {:>10} {:>9} {:>12} {:>14}",
        "export", "MB", "MB/s", "rows/s", "max RSS MB"
    );
    let mut csv = None;
    for format in ["csv", "parquet"] {
        let got = pull(&client, &url(format), &server).await?;
        let mb = got.bytes.len() as f64 / 1e6;
        println!(
            "   {:<34} {:>10.1} {:>9.1} {:>12.0} {:>14.0}",
            format!("{rows} rows at 1m, {format}"),
            mb,
            mb / got.secs,
            rows as f64 / got.secs,
            got.rss_max
        );
        if format == "csv" {
            let lines = got.bytes.iter().filter(|&&b| b == b'\n').count() as i64;
            anyhow::ensure!(lines == rows + 1, "csv has {lines} lines for {rows} rows");
            csv = Some(got);
        } else {
            let file = dir.join("export.parquet");
            std::fs::write(&file, &got.bytes)?;
            check_with_pyarrow(&python, &file, rows)?;
        }
    }
    println!(
        "   peak RSS of the API process over both exports: {:.0} MB (before: {idle:.0} MB)",
        server.memory_mb("VmHWM:")
    );
    drop(server);

    // The anchor: the same CSV bytes as one static file from nginx.
    let csv = csv.expect("the csv export ran");
    let nginx = Nginx::serve(&client, &csv.bytes).await?;
    let started = Instant::now();
    let mut r = client.get(&nginx.url).send().await?;
    let mut n = 0usize;
    while let Some(piece) = r.chunk().await? {
        n += piece.len();
    }
    let secs = started.elapsed().as_secs_f64();
    drop(nginx);
    anyhow::ensure!(
        n == csv.bytes.len(),
        "nginx served {n} of {} bytes",
        csv.bytes.len()
    );
    let mb = n as f64 / 1e6;
    println!(
        "   {:<34} {:>10.1} {:>9.1}",
        "nginx, the same CSV as a file",
        mb,
        mb / secs
    );
    println!(
        "   CSV export / nginx static file: {:.2}x MB/s",
        (mb / csv.secs) / (mb / secs)
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Reads the Parquet file with pyarrow and compares it with what was
/// generated: row count, first and last time, the sum of prices.
fn check_with_pyarrow(
    python: &std::path::Path,
    file: &std::path::Path,
    rows: i64,
) -> anyhow::Result<()> {
    let script = r#"
import sys, pyarrow.parquet as pq, pyarrow.compute as pc
t = pq.read_table(sys.argv[1])
ts = t.column("t").cast("int64")
print(t.num_rows, pc.min(ts).as_py(), pc.max(ts).as_py(), repr(pc.sum(t.column("p")).as_py()), t.schema.field("t").type)
"#;
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(file)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "pyarrow failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    let want_sum: f64 = (0..rows).map(price).sum();
    let got_sum: f64 = fields[3].parse()?;
    anyhow::ensure!(
        fields[0] == rows.to_string(),
        "pyarrow read {} rows",
        fields[0]
    );
    anyhow::ensure!(fields[1] == START.to_string(), "first t {}", fields[1]);
    anyhow::ensure!(
        fields[2] == (START + (rows - 1) * MINUTE).to_string(),
        "last t {}",
        fields[2]
    );
    anyhow::ensure!(
        (got_sum - want_sum).abs() <= 1e-9 * want_sum,
        "sum of p: pyarrow {got_sum}, generated {want_sum}"
    );
    println!(
        "   pyarrow read the Parquet file back: {} rows, t {} .. {} ({}), sum of p {got_sum} = generated {want_sum} (1e-9)",
        fields[0], fields[1], fields[2], fields[4..].join(" ")
    );
    Ok(())
}
