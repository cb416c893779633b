//! Helpers of the tests that run the real `hindsight` binary as separate
//! processes (the SIGKILL crash test, the Kafka tests). Tests that can run
//! the services in process live in `tests/app/`.
#![allow(dead_code)]

pub mod cql;
pub mod kafka;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

pub const API_KEY: &str = "hsk_test_key_for_end_to_end_tests";
pub const INGEST_TOKEN: &str = "hsi_test_ingest_token";
/// The cursor secret of every process a test starts: API replicas on the
/// CQL store need one, and `dev` shares it so that its `next_cursor`s equal
/// theirs.
pub const CURSOR_SECRET: &str = "hindsight-test-cursor-secret-0123456789";

/// Prints a figure a test proves (events acknowledged and counted, answers
/// compared) and, when `HINDSIGHT_TEST_REPORT` names a file, appends it
/// there under the test's name: `cargo test` hides a passing test's output,
/// and scripts/test.sh prints the file after the run.
pub fn report(line: std::fmt::Arguments) {
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("HINDSIGHT_TEST_REPORT") {
        use std::io::Write;
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open the test report");
        writeln!(file, "{test}: {line}").expect("write the test report");
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_hindsight")
}

/// The `hindsight` binary without the engine addresses `scripts/test.sh`
/// exports (`HINDSIGHT_KAFKA_BROKERS`, `HINDSIGHT_SCYLLA_NODES`): every test
/// names its backends with flags, so one meant for the embedded backends
/// never drifts onto Kafka or Cassandra because the engines are up. Every
/// process signs cursors with [`CURSOR_SECRET`].
pub fn hindsight() -> std::process::Command {
    let mut cmd = std::process::Command::new(bin());
    cmd.env_remove("HINDSIGHT_KAFKA_BROKERS")
        .env_remove("HINDSIGHT_SCYLLA_NODES")
        .env("HINDSIGHT_CURSOR_SECRET", CURSOR_SECRET);
    cmd
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hindsight-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A running `hindsight dev`, killed on drop.
pub struct Dev {
    pub child: Child,
    pub base: String,
    pub data_dir: PathBuf,
}

impl Dev {
    pub fn start(name: &str, extra: &[&str]) -> Dev {
        Self::start_in(&temp_dir(name), extra)
    }

    pub fn start_in(data_dir: &Path, extra: &[&str]) -> Dev {
        let mut child = hindsight()
            .args(["dev", "--no-demo", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .env("HINDSIGHT_DEMO_API_KEY", API_KEY)
            .env("HINDSIGHT_INGEST_TOKEN", INGEST_TOKEN)
            .env("HINDSIGHT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("hindsight binary starts");
        let base = read_base_url(&mut child);
        Dev {
            child,
            base,
            data_dir: data_dir.to_path_buf(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the welcome lines until the API address appears.
fn read_base_url(child: &mut Child) -> String {
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.trim_start().strip_prefix("API") {
            let url = rest.split_whitespace().next().unwrap();
            let base = url.trim_end_matches("/v1").to_string();
            // Keep draining stdout so the child never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return base;
        }
    }
    panic!("hindsight dev did not print its address");
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// POSTs an NDJSON body to ingest; returns status and JSON body.
pub async fn ingest(dev: &Dev, body: String) -> (u16, serde_json::Value) {
    let r = client()
        .post(dev.url("/ingest/v1/events"))
        .bearer_auth(INGEST_TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// A catalog line for a Yes/No market `m` with tokens `{m}-yes`, `{m}-no`.
pub fn market_line(m: &str) -> String {
    format!(
        r#"{{"kind":"market","id":"{m}","slug":"{m}-slug","question":"Will {m} happen?","status":"open","tokens":[{{"id":"{m}-yes","label":"Yes"}},{{"id":"{m}-no","label":"No"}}],"updated_at":"2025-08-15T00:00:00Z"}}"#
    )
}

pub fn price_line(market: &str, token: &str, ts_secs: i64, p: f64) -> String {
    format!(
        r#"{{"kind":"price","market_id":"{market}","token_id":"{token}","ts":{ts_secs},"p":{p}}}"#
    )
}

/// Creates an API key with the real CLI, in the running store.
pub fn create_key(data_dir: &Path, org: &str, plan: &str, plans_file: Option<&Path>) -> String {
    let mut cmd = hindsight();
    cmd.args(["keys", "create", "--org", org, "--plan", plan, "--data-dir"])
        .arg(data_dir);
    if let Some(f) = plans_file {
        cmd.arg("--plans-file").arg(f);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Runs a command to success, failing the test with its stderr otherwise.
pub fn succeed(command: &mut std::process::Command) -> std::process::Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn keys_cli(data_dir: &Path, args: &[&str]) -> String {
    let out = hindsight()
        .arg("keys")
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A number from an SQLite file of a data directory; 0 until it exists.
pub fn scalar(db: &Path, sql: &str) -> i64 {
    if !db.exists() {
        return 0;
    }
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
        .unwrap_or(None)
        .unwrap_or(0)
}

/// The position after the last event the embedded store consumed.
pub fn consumed(dir: &Path) -> i64 {
    scalar(
        &dir.join("store.db"),
        "SELECT MAX(next_offset) FROM consumed",
    )
}

/// The position after the last event of the embedded log.
pub fn log_head(dir: &Path) -> i64 {
    scalar(
        &dir.join("log.db"),
        "SELECT MAX(first_offset + count) FROM log_batches",
    )
}

/// Every row of the derived tables of `store.db`, floats in their exact
/// round-trip form (blobs as bytes), for comparing incremental tables with
/// a rebuild. A series table's `sid` is shown as the id it stands for:
/// sids are allocated in first-write order, which differs between step
/// sizes, and `series_ids` survives a rebuild.
pub fn snapshot(store_db: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(store_db).unwrap();
    let mut out = Vec::new();
    for table in [
        "price_bucket_blocks",
        "metric_buckets",
        "book_buckets",
        "series",
        "events",
        "markets",
        "tokens",
        "consumed",
    ] {
        // `change_seq` numbers catalog changes for the API's change feed; it
        // keeps counting across `rebuild` (so feed cursors stay valid) and is
        // no part of the projected data.
        let columns: Vec<String> = conn
            .prepare(&format!(
                "SELECT name FROM pragma_table_info('{table}') WHERE name <> 'change_seq' ORDER BY cid"
            ))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let select: Vec<String> = columns
            .iter()
            .map(|c| match c.as_str() {
                "sid" => "(SELECT name FROM series_ids s WHERE s.sid = t.sid)".to_string(),
                c => format!("t.{c}"),
            })
            .collect();
        let order: Vec<String> = (1..=select.len()).map(|i| i.to_string()).collect();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {} FROM {table} t ORDER BY {}",
                select.join(", "),
                order.join(", ")
            ))
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            let cols: Vec<String> = (0..select.len())
                .map(|i| format!("{:?}", row.get_ref(i).unwrap()))
                .collect();
            out.push(format!("{table}: {}", cols.join(" | ")));
        }
    }
    out
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free right now, for a child process to bind later.
/// Drawn from 20000-32767, below Linux's ephemeral range (32768-60999), as
/// `scripts/engines.sh` draws the engines' ports: a port the kernel handed
/// out for `:0` is an ephemeral one, which any outgoing connection (a
/// Kafka or CQL client of another test) could take before the child binds
/// it — a CI run once lost a test that way ("Address already in use").
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: AtomicU64 = AtomicU64::new(0);
    let mut x = SEED.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        ^ (std::process::id() as u64) << 32
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    for _ in 0..1_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 20_000 + (x % 12_768) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000-32767 after 1 000 tries");
}
