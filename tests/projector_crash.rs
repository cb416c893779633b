//! The projector, as its own process, is SIGKILLed at random points while
//! consuming more than 100 000 events, and restarted, at least 10 times.
//! The final tables must equal those of a clean `rebuild`, and every event
//! must be counted exactly once: 0 lost, 0 double-counted.

mod common;
use common::*;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const DAY: i64 = 1_756_684_800;
const MARKETS: usize = 20;

struct Counts {
    prices: i64,
    books: i64,
    metrics: i64,
}

/// Writes an NDJSON file of catalog and market data; returns what it holds.
fn write_events(path: &Path, seed: u64, rounds: usize, offset_secs: i64) -> Counts {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x = seed;
    let mut rnd = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut c = Counts {
        prices: 0,
        books: 0,
        metrics: 0,
    };
    for m in 0..MARKETS {
        writeln!(f, "{}", market_line(&format!("c{m}"))).unwrap();
    }
    for round in 0..rounds {
        for m in 0..MARKETS {
            let t = DAY + offset_secs + round as i64 * 7 + m as i64;
            let p = (rnd() * 1000.0).round() / 1000.0;
            writeln!(
                f,
                "{}",
                price_line(&format!("c{m}"), &format!("c{m}-yes"), t, p)
            )
            .unwrap();
            writeln!(
                f,
                "{}",
                price_line(&format!("c{m}"), &format!("c{m}-no"), t, 1.0 - p)
            )
            .unwrap();
            c.prices += 2;
            if round % 4 == 0 {
                let bid = (p * 100.0).floor() / 100.0;
                writeln!(
                    f,
                    r#"{{"kind":"book","market_id":"c{m}","token_id":"c{m}-yes","ts":{t},"bids":[[{bid},{}]],"asks":[[{},{}]]}}"#,
                    (rnd() * 100.0).round(),
                    (bid + 0.01).min(1.0),
                    (rnd() * 100.0).round()
                )
                .unwrap();
                writeln!(
                    f,
                    r#"{{"kind":"metrics","market_id":"c{m}","ts":{t},"volume":{},"liquidity":{},"spread":0.01}}"#,
                    rnd() * 1e6,
                    rnd() * 1e5
                )
                .unwrap();
                c.books += 1;
                c.metrics += 1;
            }
        }
    }
    c
}

fn backfill(dir: &Path, file: &Path) -> Child {
    hindsight()
        .args(["backfill", "--no-progress", "--data-dir"])
        .arg(dir)
        .arg(file)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn start_projector(dir: &Path) -> Killed {
    Killed(
        hindsight()
            .args([
                "projector",
                "--metrics-listen",
                "127.0.0.1:0",
                "--projector-batch-max",
                "500",
                "--data-dir",
            ])
            .arg(dir)
            .env("HINDSIGHT_LOG", "error")
            .spawn()
            .unwrap(),
    )
}

#[test]
fn sigkilled_projector_neither_loses_nor_double_counts() {
    let dir = temp_dir("crash");
    let (first, second) = (dir.join("first.ndjson"), dir.join("second.ndjson"));
    let a = write_events(&first, 1, 1_400, 0);
    let b = write_events(&second, 2, 1_400, 40_000);
    let mut total =
        2 * MARKETS as i64 + a.prices + a.books + a.metrics + b.prices + b.books + b.metrics;
    let (mut prices, mut metrics) = (a.prices + b.prices, a.metrics + b.metrics);
    assert!(total >= 100_000, "{total} events");
    assert!(backfill(&dir, &first).wait().unwrap().success());

    // The second file is appended while the projector is being killed.
    let mut feeder = backfill(&dir, &second);
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill schedule seed: {seed}");
    let mut rnd = move |lo: u64, hi: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + (seed >> 33) % (hi - lo)
    };
    // Kill at random points until 10 kills have landed mid-stream; if the
    // projector catches up first, append more events to keep it consuming.
    let (mut kills, mut mid_stream_kills, mut extra) = (0, 0, 0);
    let mut projector = start_projector(&dir);
    while mid_stream_kills < 10 {
        assert!(
            kills < 60,
            "only {mid_stream_kills} of {kills} kills landed mid-stream"
        );
        if consumed(&dir) >= log_head(&dir) {
            extra += 1;
            let more = dir.join(format!("more-{extra}.ndjson"));
            let c = write_events(&more, 10 + extra, 700, 80_000 + extra as i64 * 20_000);
            total += MARKETS as i64 + c.prices + c.books + c.metrics;
            prices += c.prices;
            metrics += c.metrics;
            assert!(backfill(&dir, &more).wait().unwrap().success());
        }
        std::thread::sleep(Duration::from_millis(rnd(20, 150)));
        let before = consumed(&dir);
        projector.0.kill().unwrap(); // SIGKILL
        projector.0.wait().unwrap();
        kills += 1;
        if before < log_head(&dir) {
            mid_stream_kills += 1;
        }
        projector = start_projector(&dir);
    }
    assert!(feeder.wait().unwrap().success());

    let deadline = Instant::now() + Duration::from_secs(120);
    while consumed(&dir) < log_head(&dir) {
        assert!(Instant::now() < deadline, "projector never caught up");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(projector);
    assert_eq!(
        log_head(&dir),
        total,
        "the log holds every event exactly once"
    );

    // Every event counted exactly once, at every resolution.
    let store = dir.join("store.db");
    // `res` is stored as the resolution's width in minutes.
    for res in [1, 5, 10, 15, 60, 360, 1440] {
        let p = scalar(
            &store,
            &format!("SELECT SUM(ticks) FROM price_bucket_blocks WHERE res = {res}"),
        );
        let m = scalar(
            &store,
            &format!("SELECT SUM(count) FROM metric_buckets WHERE res = {res}"),
        );
        assert_eq!(p, prices, "price ticks at res {res}");
        assert_eq!(m, metrics, "metrics samples at res {res}");
    }
    let incremental = snapshot(&dir.join("store.db"));

    let rebuilt = hindsight()
        .args(["rebuild", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        rebuilt.status.success(),
        "{}",
        String::from_utf8_lossy(&rebuilt.stderr)
    );
    let clean = snapshot(&dir.join("store.db"));
    assert_eq!(incremental.len(), clean.len());
    for (i, c) in incremental.iter().zip(&clean) {
        assert_eq!(
            i, c,
            "incremental tables equal a clean rebuild, bit for bit"
        );
    }
    eprintln!(
        "{kills} kills ({mid_stream_kills} mid-stream), {total} events, {} rows identical",
        clean.len()
    );
}
