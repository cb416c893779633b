//! In-process harness: the real services, built over real embedded backends
//! in a temporary data directory, on port 0, with a clock the test moves.
#![allow(dead_code)]

use hindsight::backends::{BackendConfig, Backends, Uses};
use hindsight::services::api::ApiConfig;
use hindsight::services::dev::DevConfig;
use hindsight::services::http::HttpLimits;
use hindsight::services::ingest::IngestConfig;
use hindsight::services::{self, Listeners, Service};
use hindsight_api::jobs::JobConfig;
use hindsight_api::plans::Plans;
use hindsight_ingest::http::IngestLimits;
use hindsight_projector::ProjectorConfig;
use hindsight_schemas::time::ManualClock;
use hindsight_schemas::Timestamp;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub const API_KEY: &str = "hsk_test_key_for_end_to_end_tests";
pub const INGEST_TOKEN: &str = "hsi_test_ingest_token";
/// Where the test clock starts: 2025-11-01T00:00:00Z, two months after the
/// test data's day, at the start of a rate-limit window.
pub const CLOCK_START: Timestamp = Timestamp(1_761_955_200_000);

/// A fresh, empty directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hindsight-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What a test may change about the services it spawns.
pub struct Options {
    pub plans_file: Option<PathBuf>,
    pub max_body_bytes: usize,
    /// The connection bounds of every listener.
    pub http: HttpLimits,
    /// Dev only: `/metrics`, `/livez` and `/readyz` on their own listener.
    pub ops_listener: bool,
    /// `--cursor-secret`; empty: the data directory's generated secret.
    pub cursor_secrets: Vec<String>,
    /// `--export-*`: how export jobs run (polled every 20 ms here).
    pub export_jobs: JobConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            plans_file: None,
            max_body_bytes: 64 << 20,
            http: HttpLimits::default(),
            ops_listener: false,
            cursor_secrets: Vec::new(),
            export_jobs: JobConfig {
                poll: Duration::from_millis(20),
                ..JobConfig::default()
            },
        }
    }
}

/// Running services over one data directory, stopped on drop.
pub struct TestApp {
    /// Base URL of `/v1` (and, for `spawn_app`, the API's ops routes).
    pub api: String,
    /// Base URL of `/ingest/v1`.
    pub ingest: String,
    /// Base URL of `/metrics`, `/livez` and `/readyz` (for `spawn_app`, the
    /// API's).
    pub ops: String,
    pub data_dir: PathBuf,
    pub clock: Arc<ManualClock>,
    pub plans: Arc<Plans>,
    /// Held as long as the services run (the projector lock among them).
    _backends: Backends,
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestApp {
    pub fn api_url(&self, path: &str) -> String {
        format!("{}{path}", self.api)
    }

    pub fn ingest_url(&self, path: &str) -> String {
        format!("{}{path}", self.ingest)
    }

    /// A new API key of `plan`, stored as `hindsight keys create` stores it.
    pub async fn key(&self, plan: &str) -> String {
        self.key_of("test-org", plan).await
    }

    /// A new API key of `organization` on `plan`.
    pub async fn key_of(&self, organization: &str, plan: &str) -> String {
        let (key, record) = hindsight_api::keys::generate(organization, plan);
        self._backends
            .store()
            .unwrap()
            .put_key(record)
            .await
            .unwrap();
        key
    }

    /// Stops every service and waits for each to finish cleanly.
    pub async fn stop(mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for task in self.tasks.drain(..) {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

/// Runs `service` on this runtime until the returned sender fires (or is dropped).
pub fn run(
    service: Service,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(service.run_until_stopped(async move {
        let _ = rx.await;
    }));
    (tx, task)
}

pub async fn port0() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

/// Ingest as configured, except that its catalog view is read again at
/// every batch: a test sees a record ingest checks against as soon as the
/// API shows it.
pub fn ingest_limits() -> IngestLimits {
    IngestLimits {
        catalog_max_age: std::time::Duration::ZERO,
        ..IngestLimits::default()
    }
}

/// The API's configuration as `hindsight api --data-dir dir` builds it.
pub fn api_config(opts: &Options, clock: &Arc<ManualClock>, dir: &Path) -> ApiConfig {
    ApiConfig {
        plans: Arc::new(Plans::load(opts.plans_file.as_deref()).unwrap()),
        clock: clock.clone(),
        cursors: services::api::cursor_keys(&opts.cursor_secrets, &BackendConfig::embedded(dir))
            .unwrap(),
        dashboard: Default::default(),
        export_jobs: opts.export_jobs.clone(),
        page_cache_bytes: hindsight_api::cache::DEFAULT_PAGE_BYTES,
    }
}

/// Ingest, projector and API as three services on their own ports, over
/// one set of embedded backends in a fresh directory, with the test key.
pub async fn spawn_app(name: &str) -> TestApp {
    spawn_app_with(name, Options::default()).await
}

pub async fn spawn_app_with(name: &str, opts: Options) -> TestApp {
    spawn_app_in(&temp_dir(name), opts).await
}

pub async fn spawn_app_in(dir: &Path, opts: Options) -> TestApp {
    let backends = Backends::connect(&BackendConfig::embedded(dir))
        .await
        .unwrap();
    put_test_key(&backends).await;
    let clock = Arc::new(ManualClock::new(CLOCK_START));
    let api_cfg = api_config(&opts, &clock, dir);
    let ingest_cfg = IngestConfig {
        token: INGEST_TOKEN.into(),
        max_body_bytes: opts.max_body_bytes,
        limits: ingest_limits(),
    };
    let listeners = || async {
        Listeners {
            service: port0().await,
            ops: None,
        }
    };
    let ingest = services::ingest::build(&ingest_cfg, &backends, listeners().await)
        .unwrap()
        .with_http_limits(opts.http);
    let projector =
        services::projector::build(&ProjectorConfig::default(), &backends, port0().await)
            .unwrap()
            .with_http_limits(opts.http);
    let api = services::api::build(&api_cfg, &backends, listeners().await)
        .await
        .unwrap()
        .with_http_limits(opts.http);
    let (api_addr, ingest_addr) = (api.local_addr(), ingest.local_addr());
    let mut app = TestApp {
        api: base(api_addr),
        ingest: base(ingest_addr),
        ops: base(api.ops_addr()),
        data_dir: dir.to_path_buf(),
        clock,
        plans: api_cfg.plans.clone(),
        _backends: backends,
        stops: Vec::new(),
        tasks: Vec::new(),
    };
    for service in [ingest, projector, api] {
        let (stop, task) = run(service);
        app.stops.push(stop);
        app.tasks.push(task);
    }
    app
}

/// Another `hindsight api` over an app's data directory, with connections of
/// its own to the embedded store (as a second process has) and the app's
/// plans and clock; stopped when dropped.
pub struct Replica {
    pub api: String,
    _stop: oneshot::Sender<()>,
    _backends: Backends,
}

impl Replica {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api)
    }
}

/// A replica of `app`'s API signing cursors with `cursor_secrets` (empty:
/// the data directory's generated secret).
pub async fn spawn_api_replica(app: &TestApp, cursor_secrets: &[&str]) -> Replica {
    let backends = Backends::connect(&BackendConfig {
        uses: Uses::READ,
        ..BackendConfig::embedded(&app.data_dir)
    })
    .await
    .unwrap();
    let secrets: Vec<String> = cursor_secrets.iter().map(|s| s.to_string()).collect();
    let cfg = ApiConfig {
        plans: app.plans.clone(),
        clock: app.clock.clone(),
        cursors: services::api::cursor_keys(&secrets, &BackendConfig::embedded(&app.data_dir))
            .unwrap(),
        dashboard: Default::default(),
        export_jobs: Options::default().export_jobs,
        page_cache_bytes: hindsight_api::cache::DEFAULT_PAGE_BYTES,
    };
    let listeners = Listeners {
        service: port0().await,
        ops: None,
    };
    let api = services::api::build(&cfg, &backends, listeners)
        .await
        .unwrap();
    let url = base(api.local_addr());
    let (stop, _task) = run(api);
    Replica {
        api: url,
        _stop: stop,
        _backends: backends,
    }
}

/// `hindsight dev`'s composition (ingest, API and ops on one port, the
/// projector as a worker), without demo data.
pub async fn spawn_dev(name: &str) -> TestApp {
    spawn_dev_with(name, Options::default()).await
}

pub async fn spawn_dev_with(name: &str, opts: Options) -> TestApp {
    let dir = temp_dir(name);
    let backends = Backends::connect(&BackendConfig::embedded(&dir))
        .await
        .unwrap();
    put_test_key(&backends).await;
    let clock = Arc::new(ManualClock::new(CLOCK_START));
    let cfg = DevConfig {
        ingest: IngestConfig {
            token: INGEST_TOKEN.into(),
            max_body_bytes: 64 << 20,
            limits: ingest_limits(),
        },
        api: api_config(&opts, &clock, &dir),
        projector: ProjectorConfig::default(),
        demo: None,
    };
    let listeners = Listeners {
        service: port0().await,
        ops: if opts.ops_listener {
            Some(port0().await)
        } else {
            None
        },
    };
    let dev = services::dev::build(&cfg, &backends, listeners)
        .await
        .unwrap()
        .with_http_limits(opts.http);
    let (addr, ops) = (base(dev.local_addr()), base(dev.ops_addr()));
    let (stop, task) = run(dev);
    TestApp {
        api: addr.clone(),
        ingest: addr,
        ops,
        data_dir: dir,
        clock,
        plans: cfg.api.plans.clone(),
        _backends: backends,
        stops: vec![stop],
        tasks: vec![task],
    }
}

async fn put_test_key(backends: &Backends) {
    backends
        .store()
        .unwrap()
        .put_key(hindsight_api::keys::record_for(
            API_KEY,
            "test",
            "enterprise",
        ))
        .await
        .unwrap();
}

fn base(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// POSTs an NDJSON body to ingest; returns status and JSON body.
pub async fn ingest(app: &TestApp, body: String) -> (u16, serde_json::Value) {
    let r = client()
        .post(app.ingest_url("/ingest/v1/events"))
        .bearer_auth(INGEST_TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

pub async fn get(app: &TestApp, path: &str) -> (u16, serde_json::Value) {
    let r = client()
        .get(app.api_url(path))
        .header("X-API-Key", API_KEY)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// GET with a given key (or none); status, headers and JSON body.
pub async fn get_as(
    app: &TestApp,
    key: Option<&str>,
    path: &str,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    get_from(&app.api, key, path).await
}

/// [`get_as`] on another API (a replica): `base` is its base URL.
pub async fn get_from(
    base: &str,
    key: Option<&str>,
    path: &str,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let mut req = client().get(format!("{base}{path}"));
    if let Some(k) = key {
        req = req.header("X-API-Key", k);
    }
    let r = req.send().await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (
        status,
        headers,
        r.json().await.unwrap_or(serde_json::Value::Null),
    )
}

/// The `/metrics` text served at `base`.
pub async fn metrics_text(base: &str) -> String {
    client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the series `series` (name and labels, exactly as
/// exposed) in the `/metrics` text served at `base`; 0 when absent.
pub async fn metric_value(base: &str, series: &str) -> f64 {
    metrics_text(base)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Polls `path` until `done` holds for the JSON body, or panics after 20 s.
pub async fn wait_for(
    app: &TestApp,
    path: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get(app, path).await;
        if status == 200 && done(&body) {
            return body;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {path}: last answer {status} {body}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `t` of every point of a history page's `data` array.
pub fn point_times(body: &serde_json::Value) -> Vec<String> {
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["t"].as_str().unwrap().to_string())
        .collect()
}

/// A catalog line for a Yes/No market `m` with tokens `{m}-yes`, `{m}-no`.
pub fn market_line(m: &str) -> String {
    format!(
        r#"{{"kind":"market","id":"{m}","slug":"{m}-slug","question":"Will {m} happen?","status":"open","tokens":[{{"id":"{m}-yes","label":"Yes"}},{{"id":"{m}-no","label":"No"}}],"updated_at":"2025-08-15T00:00:00Z"}}"#
    )
}

/// A catalog line for market `id` with `slug` and `tokens` (labelled as
/// their ids).
pub fn market_line_with(id: &str, slug: &str, tokens: &[&str]) -> String {
    let tokens: Vec<(&str, &str)> = tokens.iter().map(|t| (*t, *t)).collect();
    let m = hindsight_contracts::conformance::store::market(
        id,
        slug,
        "q",
        hindsight_contracts::conformance::T0,
        &tokens,
    );
    hindsight_schemas::wire::to_line(&hindsight_schemas::Event::Market(Box::new(m)))
}

pub fn price_line(market: &str, token: &str, ts_secs: i64, p: f64) -> String {
    format!(
        r#"{{"kind":"price","market_id":"{market}","token_id":"{token}","ts":{ts_secs},"p":{p}}}"#
    )
}

/// The `hindsight` binary, for the command-line tests.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_hindsight")
}

/// The `hindsight` binary without the engine addresses `scripts/test.sh`
/// exports (`HINDSIGHT_KAFKA_BROKERS`, `HINDSIGHT_SCYLLA_NODES`): every test
/// names its backends with flags, so one meant for the embedded backends
/// never drifts onto Kafka or Cassandra because the engines are up.
pub fn hindsight() -> std::process::Command {
    let mut cmd = std::process::Command::new(bin());
    cmd.env_remove("HINDSIGHT_KAFKA_BROKERS")
        .env_remove("HINDSIGHT_SCYLLA_NODES");
    cmd
}

/// Runs a `hindsight keys` command against a data directory (the CLI an
/// operator uses beside running services); its stdout.
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

/// Creates an API key with the real CLI, in the running store.
pub fn create_key(data_dir: &Path, org: &str, plan: &str, plans_file: Option<&Path>) -> String {
    let mut args = vec!["create", "--org", org, "--plan", plan];
    if let Some(f) = plans_file {
        args.extend(["--plans-file", f.to_str().unwrap()]);
    }
    keys_cli(data_dir, &args).trim().to_string()
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

/// `promtool check metrics` accepts the exposition `metrics` of `name`.
pub fn promtool_accepts(name: &str, metrics: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (Debian package prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics rejects {name}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
