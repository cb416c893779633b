//! Operations: a real Prometheus server scrapes a running `hindsight dev`
//! while traffic flows, and its HTTP API shows the key series moving as the
//! traffic did; `promtool check metrics` accepts every service's /metrics.
//! (Prometheus and promtool come from Debian's `prometheus` package.)

mod common;
use common::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DAY: i64 = 1_756_684_800;

/// The value of an instant query, summed over series (0 when empty; NaN
/// while Prometheus is not answering yet).
async fn query(prom: &str, q: &str) -> f64 {
    let Ok(r) = client()
        .get(format!("{prom}/api/v1/query"))
        .query(&[("query", q)])
        .send()
        .await
    else {
        return f64::NAN;
    };
    let r: serde_json::Value = r.json().await.unwrap_or_default();
    r["data"]["result"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|s| s["value"][1].as_str().unwrap().parse::<f64>().unwrap())
                .sum()
        })
        .unwrap_or(f64::NAN)
}

async fn wait_value(prom: &str, q: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = query(prom, q).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{q}: Prometheus has {got}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn promtool_accepts(name: &str, metrics: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_series_as_traffic_moves_them() {
    let dev = Dev::start("prometheus", &[]);
    let dir = temp_dir("prometheus-server");
    let target = dev.base.trim_start_matches("http://").to_string();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hindsight\n    static_configs:\n      - targets: ['{target}']\n"),
    )
    .unwrap();
    let port = free_port();
    let _prometheus = Killed(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is installed (Debian package prometheus)"),
    );
    let prom = format!("http://127.0.0.1:{port}");
    wait_value(&prom, "up{job=\"hindsight\"}", 1.0).await;

    // Traffic, first round: 1 market + 20 ticks accepted, 2 lines rejected;
    // 5 good API reads, 3 without a key.
    let mut lines = vec![market_line("p1")];
    lines.extend((0..20).map(|k| price_line("p1", "p1-yes", DAY + k, 0.5)));
    lines.push("{broken".into());
    lines.push(price_line("p1", "p1-yes", DAY, 7.0));
    let (status, _) = ingest(&dev, lines.join("\n")).await;
    assert_eq!(status, 200);
    let path = format!(
        "/v1/tokens/p1-yes/prices?start_ts={DAY}&end_ts={}&resolution=1m",
        DAY + 60
    );
    wait_for(&dev, &path, |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    for _ in 0..5 {
        assert_eq!(get(&dev, &path).await.0, 200);
    }
    for _ in 0..3 {
        assert_eq!(
            client().get(dev.url(&path)).send().await.unwrap().status(),
            401
        );
    }

    wait_value(&prom, "sum(hindsight_ingest_events_accepted_total)", 21.0).await;
    wait_value(
        &prom,
        "sum(hindsight_ingest_events_accepted_total{kind=\"price\"})",
        20.0,
    )
    .await;
    wait_value(&prom, "sum(hindsight_ingest_events_rejected_total)", 2.0).await;
    wait_value(
        &prom,
        "sum(hindsight_ingest_events_rejected_total{reason=\"malformed_json\"})",
        1.0,
    )
    .await;
    wait_value(
        &prom,
        "sum(hindsight_projector_events_applied_total{kind=\"price\"})",
        20.0,
    )
    .await;
    wait_value(
        &prom,
        "sum(hindsight_api_auth_failures_total{reason=\"missing\"})",
        3.0,
    )
    .await;
    let ok_route =
        "sum(hindsight_api_requests_total{route=\"/v1/tokens/{token_id}/prices\",status=\"200\"})";
    let first_ok = query(&prom, ok_route).await;
    assert!(first_ok >= 6.0, "wait_for's reads and 5 more: {first_ok}");
    wait_value(&prom, "sum(hindsight_projector_lag_events)", 0.0).await;
    assert!(
        query(&prom, "sum(hindsight_api_request_duration_seconds_count)").await >= first_ok + 3.0
    );

    // Second round: the same series move by exactly the new traffic.
    let more: Vec<String> = (20..50)
        .map(|k| price_line("p1", "p1-yes", DAY + k, 0.25))
        .collect();
    assert_eq!(ingest(&dev, more.join("\n")).await.0, 200);
    for _ in 0..7 {
        assert_eq!(get(&dev, &path).await.0, 200);
    }
    wait_value(
        &prom,
        "sum(hindsight_ingest_events_accepted_total{kind=\"price\"})",
        50.0,
    )
    .await;
    wait_value(
        &prom,
        "sum(hindsight_projector_events_applied_total{kind=\"price\"})",
        50.0,
    )
    .await;
    wait_value(&prom, ok_route, first_ok + 7.0).await;
    wait_value(&prom, "sum(hindsight_ingest_events_rejected_total)", 2.0).await;

    let body = client()
        .get(dev.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    promtool_accepts("hindsight dev", &body);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_service_serves_metrics_promtool_accepts_and_probes() {
    let dir = temp_dir("services-metrics");
    let (ingest_port, ingest_ops, projector_ops, api_port, api_ops) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let run = |args: Vec<String>| {
        Killed(
            Command::new(bin())
                .args(&args)
                .arg("--data-dir")
                .arg(&dir)
                .env("HINDSIGHT_INGEST_TOKEN", INGEST_TOKEN)
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _ingest = run(vec![
        "ingest".into(),
        "--listen".into(),
        format!("127.0.0.1:{ingest_port}"),
        "--metrics-listen".into(),
        format!("127.0.0.1:{ingest_ops}"),
    ]);
    let _projector = run(vec![
        "projector".into(),
        "--metrics-listen".into(),
        format!("127.0.0.1:{projector_ops}"),
    ]);
    let _api = run(vec![
        "api".into(),
        "--listen".into(),
        format!("127.0.0.1:{api_port}"),
        "--metrics-listen".into(),
        format!("127.0.0.1:{api_ops}"),
    ]);
    for (name, port) in [
        ("ingest", ingest_ops),
        ("projector", projector_ops),
        ("api", api_ops),
    ] {
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let ready = loop {
            if let Ok(r) = client().get(format!("{base}/readyz")).send().await {
                break r;
            }
            assert!(Instant::now() < deadline, "{name} never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(ready.status(), 200, "{name} is ready");
        assert_eq!(
            client()
                .get(format!("{base}/livez"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        // Some traffic so the families have samples.
        if name == "ingest" {
            let r = client()
                .post(format!("http://127.0.0.1:{ingest_port}/ingest/v1/events"))
                .bearer_auth(INGEST_TOKEN)
                .body(format!("{}\n{{bad", price_line("m", "t", DAY, 0.5)))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
        if name == "api" {
            let r = client()
                .get(format!("http://127.0.0.1:{api_port}/v1/health"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 401);
            // The service port does not serve /metrics when it has its own.
            let r = client()
                .get(format!("http://127.0.0.1:{api_port}/metrics"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 404);
        }
        let body = client()
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(body.contains("hindsight_"), "{name}: {body}");
        promtool_accepts(name, &body);
    }
}
