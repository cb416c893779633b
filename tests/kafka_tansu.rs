//! The distributed pipeline on a real Kafka-protocol broker (tansu): ingest,
//! projectors and API as separate processes.

mod common;
use common::kafka::{init_topics, Tansu};
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DAY: i64 = 1_756_684_800;

/// Runs a hindsight service; `brokers` for the ones that use the log.
fn spawn(args: &[&str], data_dir: &Path, brokers: Option<&str>) -> Child {
    Command::new(bin())
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .args(
            brokers
                .map(|b| vec!["--kafka-brokers", b])
                .unwrap_or_default(),
        )
        .env("HINDSIGHT_INGEST_TOKEN", INGEST_TOKEN)
        .env(
            "HINDSIGHT_LOG",
            std::env::var("HINDSIGHT_TEST_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

async fn wait_http(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while client().get(url).send().await.is_err() {
        assert!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the store holds `prices` price ticks at `1d`, then a little
/// longer to see it stays there.
async fn wait_projected(store: &Path, prices: i64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n = scalar(store, "SELECT SUM(count) FROM price_buckets WHERE res='1d'");
        assert!(n <= prices, "double-counted: {n} > {prices}");
        if n == prices {
            return;
        }
        assert!(Instant::now() < deadline, "projected {n} of {prices}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ingest_projector_and_api_as_separate_processes() {
    let dir = temp_dir("kafka-e2e");
    let broker = Tansu::start(&dir.join("broker"));
    let brokers = broker.brokers();
    init_topics(&brokers, 3);
    let (ingest_port, api_port) = (free_port(), free_port());
    let data = dir.join("data");
    let _ingest = Killed(spawn(
        &["ingest", "--listen", &format!("127.0.0.1:{ingest_port}")],
        &dir.join("ingest"),
        Some(&brokers),
    ));
    let _projector = Killed(spawn(
        &["projector", "--metrics-listen", "127.0.0.1:0"],
        &data,
        Some(&brokers),
    ));
    // The API reads the store the projector writes.
    let keyed = create_key(&data, "kafka", "enterprise", None);
    let _api = Killed(spawn(
        &["api", "--listen", &format!("127.0.0.1:{api_port}")],
        &data,
        None,
    ));
    wait_http(&format!("http://127.0.0.1:{ingest_port}/livez")).await;
    wait_http(&format!("http://127.0.0.1:{api_port}/livez")).await;

    let mut body = vec![market_line("k1")];
    let mut yes = Vec::new();
    for k in 0..600 {
        let p = (k % 17) as f64 / 20.0;
        yes.push(p);
        body.push(price_line("k1", "k1-yes", DAY + k * 6, p));
    }
    let r = client()
        .post(format!("http://127.0.0.1:{ingest_port}/ingest/v1/events"))
        .bearer_auth(INGEST_TOKEN)
        .body(body.join("\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ack: serde_json::Value = r.json().await.unwrap();
    assert_eq!(ack["accepted"], 601);

    let url = format!("http://127.0.0.1:{api_port}/v1/tokens/k1-yes/prices?start_ts={DAY}&end_ts={}&resolution=1h", DAY + 3600);
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let r = client()
            .get(&url)
            .header("X-API-Key", &keyed)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let b: serde_json::Value = r.json().await.unwrap();
        if status == 200 && b["data"].as_array().is_some_and(|d| d.len() == 1) {
            let avg = b["data"][0]["p"].as_f64().unwrap();
            if (avg - yes.iter().sum::<f64>() / 600.0).abs() < 1e-12 {
                break b;
            }
        }
        assert!(Instant::now() < deadline, "not visible: {status} {b}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(body["market_id"], "k1");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_projector_is_replaced_without_loss_or_double_counting() {
    let dir = temp_dir("kafka-handover");
    let broker = Tansu::start(&dir.join("broker"));
    let brokers = broker.brokers();
    init_topics(&brokers, 4);
    let data = dir.join("data");
    // 40 markets x 1 500 ticks, appended through the Kafka log by backfill.
    let file = dir.join("events.ndjson");
    let mut lines = Vec::new();
    let mut prices = 0;
    for m in 0..40 {
        lines.push(market_line(&format!("h{m}")));
        for k in 0..1500 {
            lines.push(price_line(
                &format!("h{m}"),
                &format!("h{m}-yes"),
                DAY + k * 11 + m,
                ((k * 31 + m) % 1000) as f64 / 1000.0,
            ));
            prices += 1;
        }
    }
    std::fs::write(&file, lines.join("\n")).unwrap();
    let out = Command::new(bin())
        .args([
            "backfill",
            "--no-progress",
            "--kafka-brokers",
            &brokers,
            "--data-dir",
        ])
        .arg(dir.join("ingest"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let store = data.join("store.db");
    let batch = ["--projector-batch-max", "300"];
    let p1 = ["--kafka-instance-id", "projector-1"];
    let p2 = ["--kafka-instance-id", "projector-2"];
    let mut one = Killed(spawn(
        &[
            &["projector", "--metrics-listen", "127.0.0.1:0"][..],
            &batch,
            &p1,
        ]
        .concat(),
        &data,
        Some(&brokers),
    ));
    let two = Killed(spawn(
        &[
            &["projector", "--metrics-listen", "127.0.0.1:0"][..],
            &batch,
            &p2,
        ]
        .concat(),
        &data,
        Some(&brokers),
    ));
    // Kill the first once both are working and the stream is part-way.
    let deadline = Instant::now() + Duration::from_secs(60);
    while scalar(
        &store,
        "SELECT SUM(count) FROM price_buckets WHERE res='1d'",
    ) < prices / 5
    {
        assert!(Instant::now() < deadline, "projectors made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = scalar(
        &store,
        "SELECT SUM(count) FROM price_buckets WHERE res='1d'",
    );
    one.0.kill().unwrap(); // SIGKILL
    one.0.wait().unwrap();
    assert!(before < prices, "killed mid-stream");
    // As an orchestrator would, restart the crashed projector. (On tansu
    // 0.6.0 the survivor alone is never given the dead member's partitions:
    // the broker keeps the dead member in the next join's member list. On
    // Kafka the survivor takes them over after the session timeout.)
    let _replacement = Killed(spawn(
        &[
            &["projector", "--metrics-listen", "127.0.0.1:0"][..],
            &batch,
            &p1,
        ]
        .concat(),
        &data,
        Some(&brokers),
    ));
    wait_projected(&store, prices).await;
    drop(two);
    drop(_replacement);
    let incremental = snapshot(&store);

    let out = Command::new(bin())
        .args(["rebuild", "--kafka-brokers", &brokers, "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let clean = snapshot(&store);
    assert_eq!(incremental.len(), clean.len());
    for (a, b) in incremental.iter().zip(&clean) {
        assert_eq!(a, b, "tables after the handover equal a clean rebuild");
    }
}

/// The RSS of a process in MB.
fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_outage_gives_503s_and_every_acknowledged_event_arrives() {
    let dir = temp_dir("kafka-outage");
    let mut broker = Tansu::start(&dir.join("broker"));
    let brokers = broker.brokers();
    init_topics(&brokers, 2);
    let data = dir.join("data");
    let port = free_port();
    let ingest = Killed(spawn(
        &[
            "ingest",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--kafka-delivery-timeout-ms",
            "3000",
            "--kafka-max-in-flight",
            "20000",
        ],
        &dir.join("ingest"),
        Some(&brokers),
    ));
    let _projector = Killed(spawn(
        &["projector", "--metrics-listen", "127.0.0.1:0"],
        &data,
        Some(&brokers),
    ));
    wait_http(&format!("http://127.0.0.1:{port}/livez")).await;
    let url = format!("http://127.0.0.1:{port}/ingest/v1/events");

    // Batch b carries 200 ticks of its own token: an acknowledged batch must
    // arrive whole, exactly once.
    let send = |b: usize| {
        let url = url.clone();
        async move {
            let mut lines = vec![market_line(&format!("o{b}"))];
            for k in 0..200 {
                lines.push(price_line(
                    &format!("o{b}"),
                    &format!("o{b}-yes"),
                    DAY + k,
                    0.5,
                ));
            }
            let r = client()
                .post(&url)
                .bearer_auth(INGEST_TOKEN)
                .body(lines.join("\n"))
                .send()
                .await;
            r.map(|r| r.status().as_u16()).unwrap_or(0)
        }
    };
    let mut acked = Vec::new();
    let mut refused = 0;
    let mut peak_rss: f64 = 0.0;
    for b in 0..45 {
        if b == 20 {
            broker.stop();
        }
        if b == 30 {
            broker.restart();
        }
        match send(b).await {
            200 => acked.push(b),
            503 => refused += 1,
            other => panic!("batch {b}: status {other}"),
        }
        peak_rss = peak_rss.max(rss_mb(ingest.0.id()));
    }
    assert!(refused > 0, "503s while the broker was down");
    assert!(
        acked.iter().any(|&b| b < 20) && acked.iter().any(|&b| b >= 30),
        "{acked:?}"
    );
    assert!(
        peak_rss < 200.0,
        "ingest memory stayed bounded: {peak_rss:.0} MB"
    );

    let store = data.join("store.db");
    let deadline = Instant::now() + Duration::from_secs(120);
    for b in &acked {
        loop {
            let n = scalar(
                &store,
                &format!(
                    "SELECT SUM(count) FROM price_buckets WHERE res='1d' AND token_id='o{b}-yes'"
                ),
            );
            assert!(n <= 200, "batch {b} counted {n} times 200");
            if n == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "acknowledged batch {b} has {n} of 200 ticks"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "{} acknowledged, {refused} refused with 503, ingest peak RSS {peak_rss:.0} MB",
        acked.len()
    );
}
