//! `hindsight backfill --project` rolls its files into the read tables as it
//! appends them: when it returns, the store has consumed the whole log, and
//! its tables equal a clean `rebuild`'s, bit for bit. A second file on top
//! of that history (some of its ticks in buckets the first left open) is
//! projected from the store's frontiers, not into an emptied store. While
//! another process holds the data directory's projector, the backfill only
//! appends and says so.

mod common;
use common::*;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::Stdio;

const DAY: i64 = 1_756_684_800;
const MARKETS: usize = 12;

/// Markets, then `rounds` rounds of a price tick per token (every market's
/// yes and no), with a book snapshot and a metrics sample every third
/// round, from `from_secs` after `DAY` on, `step` seconds apart. Returns
/// the number of price ticks.
fn write_file(path: &Path, from_secs: i64, rounds: i64, step: i64) -> i64 {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for m in 0..MARKETS {
        writeln!(f, "{}", market_line(&format!("bp{m}"))).unwrap();
    }
    let mut prices = 0;
    for round in 0..rounds {
        for m in 0..MARKETS as i64 {
            let t = DAY + from_secs + round * step + m;
            let p = ((round * 37 + m * 11) % 100) as f64 / 100.0;
            for (token, p) in [("yes", p), ("no", 1.0 - p)] {
                let line = price_line(&format!("bp{m}"), &format!("bp{m}-{token}"), t, p);
                writeln!(f, "{line}").unwrap();
                prices += 1;
            }
            if round % 3 == 0 {
                writeln!(
                    f,
                    r#"{{"kind":"book","market_id":"bp{m}","token_id":"bp{m}-yes","ts":{t},"bids":[[{p},10]],"asks":[]}}"#
                )
                .unwrap();
                writeln!(
                    f,
                    r#"{{"kind":"metrics","market_id":"bp{m}","ts":{t},"volume":{round},"liquidity":5,"spread":0.01}}"#
                )
                .unwrap();
            }
        }
    }
    prices
}

fn backfill(dir: &Path, file: &Path) -> std::process::Output {
    backfill_in_steps(dir, file, None)
}

/// A projecting backfill whose projector takes at most `step` events at a
/// time, when given; its appends then run at most two steps ahead of it.
fn backfill_in_steps(dir: &Path, file: &Path, step: Option<usize>) -> std::process::Output {
    let mut command = hindsight();
    command
        .args(["backfill", "--project", "--no-progress", "--data-dir"])
        .arg(dir)
        .arg(file);
    if let Some(step) = step {
        command
            .env("HINDSIGHT_PROJECTOR_BATCH_MAX", step.to_string())
            .env("HINDSIGHT_PROJECTOR_BACKLOG_BATCH_MAX", step.to_string());
    }
    succeed(&mut command)
}

fn price_ticks(dir: &Path, res_minutes: i64) -> i64 {
    scalar(
        &dir.join("store.db"),
        &format!("SELECT SUM(ticks) FROM price_bucket_blocks WHERE res = {res_minutes}"),
    )
}

#[test]
fn a_projecting_backfill_leaves_the_tables_a_rebuild_makes() {
    projected_equals_rebuilt("backfill-project", None);
}

/// Steps of 15 000 events: the 20 000-line chunks' appends wait for the
/// projector (two steps ahead at most), which takes them from the log's
/// memory, whole and in parts, and reads the file for what was not kept.
#[test]
fn a_backfill_paced_by_its_projector_leaves_the_tables_a_rebuild_makes() {
    projected_equals_rebuilt("backfill-project-paced", Some(15_000));
}

fn projected_equals_rebuilt(name: &str, step: Option<usize>) {
    let dir = temp_dir(name);
    let (first, second) = (dir.join("first.ndjson"), dir.join("second.ndjson"));
    // The second file starts 30 minutes before the first ends: its first
    // ticks fall in 1h, 6h and 1d buckets the first file's left open.
    let a = write_file(&first, 0, 2_000, 7);
    let b = write_file(&second, 2_000 * 7 - 1_800, 2_000, 7);

    let out = backfill_in_steps(&dir, &first, step);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("projected into the read tables"), "{said}");
    assert_eq!(consumed(&dir), log_head(&dir), "the whole log is projected");
    assert_eq!(price_ticks(&dir, 1), a);

    backfill_in_steps(&dir, &second, step);
    assert_eq!(consumed(&dir), log_head(&dir));
    for res in [1, 5, 10, 15, 60, 360, 1440] {
        assert_eq!(price_ticks(&dir, res), a + b, "price ticks at res {res}");
    }
    let projected = snapshot(&dir.join("store.db"));

    succeed(hindsight().args(["rebuild", "--data-dir"]).arg(&dir));
    let clean = snapshot(&dir.join("store.db"));
    assert_eq!(projected.len(), clean.len());
    for (p, c) in projected.iter().zip(&clean) {
        assert_eq!(p, c, "projected while appending equals a clean rebuild");
    }
}

#[test]
fn with_another_projector_running_a_backfill_only_appends() {
    let dir = temp_dir("backfill-project-locked");
    let file = dir.join("events.ndjson");
    let prices = write_file(&file, 0, 200, 60);
    let mut projector = Killed(
        hindsight()
            .args(["projector", "--metrics-listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .env_remove("HINDSIGHT_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // It says where it listens once its backends are open, the lock held;
    // the rest of its stderr is drained so that it never blocks on it.
    let mut lines = std::io::BufReader::new(projector.0.stderr.take().unwrap()).lines();
    let started = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("listening on"));
    assert!(started, "the projector did not start");
    std::thread::spawn(move || lines.for_each(drop));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let out = backfill(&dir, &file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another projector holds"), "{err}");
    assert!(err.contains("appending only"), "{err}");
    // The running projector rolls the file in.
    while price_ticks(&dir, 1) < prices {
        assert!(
            std::time::Instant::now() < deadline,
            "the projector did not roll it in"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(projector);
    assert_eq!(price_ticks(&dir, 1440), prices);
}
