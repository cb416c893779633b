//! Hindsight next to DuckDB and ClickHouse on the same files, in the same
//! run: each shape is written as one NDJSON file (the ingest wire format),
//! then rolled into durable buckets of every resolution by
//!
//! - Hindsight: `hindsight backfill --project` into a fresh embedded data
//!   directory (validated, durably logged, and rolled into the buckets
//!   `/v1` reads while it appends) — the figure compared. Then, for what
//!   each half costs alone: `hindsight rebuild` of that directory (the log
//!   replayed into the buckets; the tables must come out the same, byte
//!   for byte), and `hindsight backfill` appending only into another;
//! - DuckDB (`read_json` into a table of ticks, one `GROUP BY` table per
//!   resolution, checkpointed) and ClickHouse (chdb, MergeTree tables of
//!   the same), through `bench/shapes.py` in the virtualenv
//!   `scripts/install-tools.sh` fills. They keep what Hindsight's store
//!   keeps: every tick, and per resolution the buckets' sums, counts and
//!   candles (Hindsight also keeps its log).
//!
//! Each shape runs in rounds of the three (see [`rounds`]); the ratios
//! compared are taken round by round, then their median. Bytes are what
//! the files occupy on disk afterwards. Before any figure is printed the
//! three must agree, in every round: rows and ticks per resolution, and the
//! busiest token's 1h averages, read back through Hindsight's read store.
//!
//! Needs the release binary (`cargo build --release`).

use crate::shape::{dense, long_tail, spaced, Shape, DAY};
use hindsight_contracts::{Range, ReadStore};
use hindsight_schemas::{Resolution, Timestamp};
use hindsight_sqlite::{res_code, SqliteStore};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const SCRIPT: &str = include_str!("../shapes.py");

/// What an engine left behind and how the checks read it back.
struct Answer {
    secs: f64,
    bytes: u64,
    /// Per resolution: bucket rows, ticks they hold.
    rows: BTreeMap<String, (u64, u64)>,
    busiest: String,
    /// The busiest token's 1h buckets: start (ms), average.
    hourly: Vec<(i64, f64)>,
}

pub fn run(quick: bool) -> anyhow::Result<()> {
    let bin = crate::process::release_binary()?;
    let venv = std::env::var_os("HINDSIGHT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/hindsight-venv")
        });
    let python = venv.join("bin/python");
    let dir = std::env::temp_dir().join(format!("hindsight-bench-shapes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let _scratch = Scratch(dir.clone());
    let script = dir.join("shapes.py");
    std::fs::write(&script, SCRIPT)?;
    let versions = String::from_utf8(
        Command::new(&python)
            .args([
                "-c",
                "import duckdb, chdb; print(duckdb.__version__, chdb.__version__)",
            ])
            .output()
            .map_err(|e| anyhow::anyhow!("{}: {e}", python.display()))?
            .stdout,
    )?;
    let Some((duckdb_version, chdb_version)) = versions.trim().split_once(' ') else {
        anyhow::bail!(
            "duckdb and chdb are not importable from {}: run scripts/install-tools.sh",
            python.display()
        );
    };

    let rounds = rounds(quick)?;
    // The long tail of the issue; a dense shape of the same size order.
    let (tail_ticks, every) = if quick { (200_000, 8) } else { (2_000_000, 1) };
    let shapes = [
        ("long-tail", long_tail("lt", 1_000, tail_ticks)),
        ("dense", dense("dn", 10, every, 24)),
    ];
    println!(
        "== Shapes: one NDJSON file each, rolled into durable buckets of {} resolutions; \
         Hindsight (backfill --project) next to DuckDB {duckdb_version} and ClickHouse (chdb {chdb_version}) on the same file",
        Resolution::ALL.len()
    );
    for (key, shape) in &shapes {
        let work = dir.join(key);
        std::fs::create_dir_all(&work)?;
        compare(&bin, &python, &script, &work, shape, rounds)?;
        std::fs::remove_dir_all(&work)?;
    }
    Ok(())
}

/// The run's directory, removed however the run ends (a failed check
/// leaves hundreds of MB otherwise).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn compare(
    bin: &Path,
    python: &Path,
    script: &Path,
    work: &Path,
    shape: &Shape,
    rounds: usize,
) -> anyhow::Result<()> {
    let file = work.join("ticks.ndjson");
    shape.write(&file)?;
    let ticks = shape
        .lines
        .iter()
        .filter(|l| l.starts_with(r#"{"kind":"price""#))
        .count();
    println!(
        "   {}: {} ticks, {:.0} MB of NDJSON",
        shape.name,
        spaced(ticks),
        std::fs::metadata(&file)?.len() as f64 / 1e6
    );

    let mut done = Vec::with_capacity(rounds);
    for n in 1..=rounds {
        let round = one_round(bin, python, script, work, &file, ticks)?;
        println!(
            "     round {n}: backfill --project {:.2} s, DuckDB {:.2} s, ClickHouse {:.2} s: speed {:.3}x DuckDB, {:.3}x ClickHouse",
            round.hindsight.secs,
            round.duck.secs,
            round.click.secs,
            round.duck.secs / round.hindsight.secs,
            round.click.secs / round.hindsight.secs,
        );
        done.push(round);
    }

    let mb = |b: f64| b / 1e6;
    let rate = |s: f64| ticks as f64 / s;
    // Each figure's median over the rounds.
    let med = |f: fn(&Round) -> f64| median(done.iter().map(f));
    let (bytes, store_bytes) = (
        med(|r| r.hindsight.bytes as f64),
        med(|r| r.store_bytes as f64),
    );
    println!(
        "     {:<44} {:>8} {:>12} {:>10}",
        "medians of the rounds", "seconds", "ticks/s", "MB on disk"
    );
    for (name, s, on_disk) in [
        (
            "Hindsight backfill alone (durable log)",
            med(|r| r.backfill),
            med(|r| r.log_bytes as f64),
        ),
        (
            "Hindsight rebuild alone (log -> buckets)",
            med(|r| r.rebuild),
            store_bytes,
        ),
        (
            "Hindsight backfill --project (log + store)",
            med(|r| r.hindsight.secs),
            bytes,
        ),
        (
            "DuckDB (ticks + candle buckets)",
            med(|r| r.duck.secs),
            med(|r| r.duck.bytes as f64),
        ),
        (
            "ClickHouse (chdb MergeTree, the same)",
            med(|r| r.click.secs),
            med(|r| r.click.bytes as f64),
        ),
    ] {
        println!(
            "     {name:<44} {s:>8.2} {:>12.0} {:>10.1}",
            rate(s),
            mb(on_disk)
        );
    }
    // Ratios: per round (its runs fall in about one phase of the machine),
    // then their median and range; bytes, of the medians.
    for (name, anchor) in [
        ("DuckDB", (|r: &Round| &r.duck) as fn(&Round) -> &Answer),
        ("ClickHouse", |r: &Round| &r.click),
    ] {
        let mut speeds: Vec<f64> = done
            .iter()
            .map(|r| anchor(r).secs / r.hindsight.secs)
            .collect();
        speeds.sort_by(f64::total_cmp);
        let theirs = median(done.iter().map(|r| anchor(r).bytes as f64));
        println!(
            "     Hindsight / {name:<10}  speed {:.3}x (median of {rounds}; {:.3}x-{:.3}x)   bytes {:.2}x (store alone {:.2}x)",
            crate::pipeline::quantile(&speeds, 0.5),
            speeds[0],
            speeds[speeds.len() - 1],
            bytes / theirs,
            store_bytes / theirs
        );
    }
    println!(
        "     agreed in every round: rows and ticks per resolution; {}'s {} 1h averages (to 1e-9); rebuild's tables = backfill --project's",
        done[0].hindsight.busiest,
        done[0].hindsight.hourly.len()
    );
    Ok(())
}

/// How many rounds each shape runs (`HINDSIGHT_BENCH_SHAPES_ROUNDS`; 3, or
/// 1 with `--quick`). A round runs Hindsight, DuckDB and ClickHouse one
/// after the other on the same file, and the ratios compared are taken
/// round by round: this machine goes through faster and slower phases
/// within minutes (the same long-tail `backfill --project` took 2.4–2.6 s
/// in one hour and 3.0–3.5 s in the next), and a round's runs fall in
/// about one of them.
fn rounds(quick: bool) -> anyhow::Result<usize> {
    match std::env::var("HINDSIGHT_BENCH_SHAPES_ROUNDS") {
        Err(_) => Ok(if quick { 1 } else { 3 }),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => anyhow::bail!(
                "HINDSIGHT_BENCH_SHAPES_ROUNDS={v:?}: a whole number of rounds, 1 or more"
            ),
        },
    }
}

/// The median of the rounds' figures (nearest rank, as the other
/// sections' quantiles).
pub(crate) fn median(figures: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = figures.collect();
    v.sort_by(f64::total_cmp);
    crate::pipeline::quantile(&v, 0.5)
}

/// One round's figures, each engine checked against Hindsight's buckets.
struct Round {
    hindsight: Answer,
    duck: Answer,
    click: Answer,
    rebuild: f64,
    backfill: f64,
    log_bytes: u64,
    store_bytes: u64,
}

/// One round on `file`, in fresh directories under `work` (removed after).
fn one_round(
    bin: &Path,
    python: &Path,
    script: &Path,
    work: &Path,
    file: &Path,
    ticks: usize,
) -> anyhow::Result<Round> {
    let data = work.join("hindsight");
    let projecting = timed(
        bin,
        &["backfill", "--project", "--no-progress", "--data-dir"],
        &data,
        Some(file),
    )?;
    let store_bytes: u64 = ["store.db", "store.db-wal", "store.db-shm"]
        .iter()
        .map(|f| disk_bytes(&data.join(f)))
        .sum::<std::io::Result<u64>>()?;
    let total_bytes = disk_bytes(&data)?;
    let hindsight = read_hindsight(&data, projecting, total_bytes)?;
    let projected = tables_digest(&data)?;
    let rebuild = timed(bin, &["rebuild", "--data-dir"], &data, None)?;
    anyhow::ensure!(
        tables_digest(&data)? == projected,
        "the rebuilt tables differ from those projected while appending"
    );
    std::fs::remove_dir_all(&data)?;
    let appending = work.join("hindsight-append-only");
    let backfill = timed(
        bin,
        &["backfill", "--no-progress", "--data-dir"],
        &appending,
        Some(file),
    )?;
    let log_bytes = disk_bytes(&appending)?;
    std::fs::remove_dir_all(&appending)?;
    let anchor_in = |engine: &str| -> anyhow::Result<Answer> {
        let out = work.join(engine);
        let answer = anchor(python, script, engine, file, &out)?;
        std::fs::remove_dir_all(&out)?;
        Ok(answer)
    };
    let duck = anchor_in("duckdb")?;
    let click = anchor_in("clickhouse")?;
    agree(&hindsight, &duck, "DuckDB", ticks)?;
    agree(&hindsight, &click, "ClickHouse", ticks)?;
    Ok(Round {
        hindsight,
        duck,
        click,
        rebuild,
        backfill,
        log_bytes,
        store_bytes,
    })
}

/// A digest of every bucket table of a data directory's store and of its
/// tick count, to tell two stores' tables apart. (Where tick blocks are cut
/// depends on how the log was cut into steps, not the ticks they hold: see
/// `hindsight_sqlite::tickblock`.)
fn tables_digest(data: &Path) -> anyhow::Result<u64> {
    use std::hash::{Hash, Hasher};
    let conn = rusqlite::Connection::open_with_flags(
        data.join("store.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let ticks: Option<i64> =
        conn.query_row("SELECT SUM(n) FROM price_tick_blocks", [], |r| r.get(0))?;
    ticks.hash(&mut hasher);
    for table in ["price_bucket_blocks", "metric_buckets", "book_buckets"] {
        let mut stmt = conn.prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2, 3, 4"))?;
        let columns = stmt.column_count();
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            for i in 0..columns {
                use rusqlite::types::ValueRef;
                match row.get_ref(i)? {
                    ValueRef::Null => 0u8.hash(&mut hasher),
                    ValueRef::Integer(v) => v.hash(&mut hasher),
                    ValueRef::Real(v) => v.to_bits().hash(&mut hasher),
                    ValueRef::Text(v) | ValueRef::Blob(v) => v.hash(&mut hasher),
                }
            }
        }
    }
    Ok(hasher.finish())
}

/// Runs `bin args… data [file]` to success; its wall-clock seconds.
fn timed(bin: &Path, args: &[&str], data: &Path, file: Option<&Path>) -> anyhow::Result<f64> {
    let mut command = Command::new(bin);
    command
        .args(args)
        .arg(data)
        .env("HINDSIGHT_LOG", "warn")
        .stdout(std::process::Stdio::null());
    command.args(file);
    let started = Instant::now();
    let status = command.status()?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(status.success(), "hindsight {} failed: {status}", args[0]);
    Ok(secs)
}

/// Bytes allocated on disk to a file, or to everything under a directory.
fn disk_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        other => other?,
    };
    if !meta.is_dir() {
        return Ok(meta.blocks() * 512);
    }
    let mut total = 0;
    for entry in std::fs::read_dir(path)? {
        total += disk_bytes(&entry?.path())?;
    }
    Ok(total)
}

/// Hindsight's buckets as the checks compare them: row counts straight from
/// the store's table, the busiest token's hours through the read store the
/// API serves from.
fn read_hindsight(data: &Path, secs: f64, bytes: u64) -> anyhow::Result<Answer> {
    let conn = rusqlite::Connection::open_with_flags(
        data.join("store.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )?;
    // The store's layout (schema 8): `res` is the resolution's code
    // (`res_code`), ids are `series_ids` names, and a block keeps how many
    // buckets it holds (`n`) and the ticks they counted.
    let mut rows = BTreeMap::new();
    let mut stmt =
        conn.prepare("SELECT res, sum(n), sum(ticks) FROM price_bucket_blocks GROUP BY res")?;
    for row in stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })? {
        let (code, n, ticks) = row?;
        let res = Resolution::ALL
            .into_iter()
            .find(|r| res_code(*r) == code)
            .ok_or_else(|| {
                anyhow::anyhow!("price_bucket_blocks holds an unknown resolution code {code}")
            })?;
        rows.insert(res.as_str().to_string(), (n as u64, ticks as u64));
    }
    let busiest: String = conn.query_row(
        "SELECT s.name FROM price_bucket_blocks p JOIN series_ids s USING (sid) WHERE p.res = ?1
         GROUP BY p.sid ORDER BY sum(p.ticks) DESC, s.name LIMIT 1",
        [res_code(Resolution::D1)],
        |r| r.get(0),
    )?;
    let store = SqliteStore::open(data)?;
    let range = Range {
        res: Resolution::H1,
        start: Timestamp(DAY * 1000),
        end: Timestamp((DAY + 86_400) * 1000),
        limit: 200,
    };
    let hourly = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(store.prices(&busiest, range))?
        .into_iter()
        .map(|p| (p.t.0, p.p))
        .collect();
    Ok(Answer {
        secs,
        bytes,
        rows,
        busiest,
        hourly,
    })
}

/// DuckDB or ClickHouse through `bench/shapes.py`, into a fresh directory.
fn anchor(
    python: &Path,
    script: &Path,
    engine: &str,
    file: &Path,
    out: &Path,
) -> anyhow::Result<Answer> {
    std::fs::create_dir_all(out)?;
    let output = hindsight::allocator::with_system_thp(&mut Command::new(python))
        .arg(script)
        .arg(engine)
        .arg(file)
        .arg(out)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "{engine} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let num = |v: &serde_json::Value| v.as_u64().unwrap_or(u64::MAX);
    Ok(Answer {
        secs: v["secs"].as_f64().unwrap_or(f64::NAN),
        bytes: disk_bytes(out)?,
        rows: v["rows"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(res, r)| (res.clone(), (num(&r[0]), num(&r[1]))))
            .collect(),
        busiest: v["busiest"].as_str().unwrap_or_default().to_string(),
        hourly: v["hourly"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                (
                    b[0].as_i64().unwrap_or(0),
                    b[1].as_f64().unwrap_or(f64::NAN),
                )
            })
            .collect(),
    })
}

/// Fails unless `other` holds the same aggregates as Hindsight.
fn agree(hindsight: &Answer, other: &Answer, name: &str, ticks: usize) -> anyhow::Result<()> {
    for r in Resolution::ALL {
        let want = hindsight.rows.get(r.as_str());
        anyhow::ensure!(
            want.map(|w| w.1) == Some(ticks as u64),
            "Hindsight's {} buckets hold {want:?} (rows, ticks), not the file's {ticks} ticks",
            r.as_str()
        );
        let got = other.rows.get(r.as_str());
        anyhow::ensure!(
            want == got,
            "{} buckets: Hindsight has {want:?} (rows, ticks), {name} {got:?}",
            r.as_str()
        );
    }
    anyhow::ensure!(
        hindsight.busiest == other.busiest,
        "busiest token: Hindsight says {}, {name} {}",
        hindsight.busiest,
        other.busiest
    );
    anyhow::ensure!(
        hindsight.hourly.len() == other.hourly.len() && !hindsight.hourly.is_empty(),
        "{}: Hindsight has {} 1h buckets, {name} {}",
        hindsight.busiest,
        hindsight.hourly.len(),
        other.hourly.len()
    );
    for (h, o) in hindsight.hourly.iter().zip(&other.hourly) {
        anyhow::ensure!(
            h.0 == o.0 && (h.1 - o.1).abs() <= 1e-9 * h.1.abs().max(1e-12),
            "{}'s 1h bucket: Hindsight has {h:?} (start ms, average), {name} {o:?}",
            hindsight.busiest
        );
    }
    Ok(())
}
