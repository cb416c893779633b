//! Operations: a real Prometheus server scrapes `hindsight dev`'s services,
//! running in this process, while traffic flows, and its HTTP API shows the
//! key series moving exactly as the traffic did. (Prometheus and promtool
//! come from Debian's `prometheus` package.)
//!
//! Its own test binary: the metrics registry is one per process, and the
//! exact counts below hold only when no other test's traffic adds to them.
//! `tests/app/ops.rs` checks every service's /metrics with promtool.

mod common;
#[path = "app/helpers.rs"]
mod helpers;
use common::{free_port, Killed};
use helpers::*;
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

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_series_as_traffic_moves_them() {
    let dev = spawn_dev("prometheus").await;
    let dir = temp_dir("prometheus-server");
    let target = dev.api.trim_start_matches("http://").to_string();
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
            client()
                .get(dev.api_url(&path))
                .send()
                .await
                .unwrap()
                .status(),
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
    // Its steps timed their stages before their writes counted the events.
    for stage in hindsight_projector::runner::STAGES {
        let q = format!(
            "sum(hindsight_projector_step_stage_duration_seconds_count{{stage=\"{stage}\"}})"
        );
        assert!(query(&prom, &q).await >= 1.0, "{q}");
    }
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
        .get(dev.api_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    promtool_accepts("hindsight dev", &body);
}

/// A fresh deployment, before any traffic, lists every family on `/metrics`,
/// counters at zero for each label value they can be recorded with, so
/// dashboards and alerts can tell zero from absent. (The families keyed by
/// partition appear once the partition is known: the log's head at open,
/// the projector's lag after its first step, its position once it has one.)
#[tokio::test(flavor = "multi_thread")]
async fn every_metric_family_is_listed_from_start_with_zero_counters() {
    let app = spawn_app("families-from-start").await;
    let keyed_by_partition = [
        hindsight_telemetry::LOG_HEAD,
        hindsight_telemetry::PROJECTOR_POSITION,
        hindsight_telemetry::PROJECTOR_LAG,
    ];
    let body = client()
        .get(format!("{}/metrics", app.ops))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let missing: Vec<&str> = hindsight_telemetry::DESCRIPTIONS
        .iter()
        .map(|(name, _, _)| *name)
        .filter(|name| !keyed_by_partition.contains(name))
        .filter(|name| !body.contains(&format!("# TYPE {name} ")))
        .collect();
    assert!(
        missing.is_empty(),
        "families absent from start: {missing:?}"
    );
    for reject in hindsight_schemas::wire::RejectKind::ALL {
        let series = format!(
            "{}{{reason=\"{}\"}} 0\n",
            hindsight_telemetry::INGEST_EVENTS_REJECTED,
            reject.label()
        );
        assert!(body.contains(&series), "no {series}");
    }
    for reason in hindsight_schemas::wire::RejectKind::CATALOG {
        let series = format!(
            "{}{{reason=\"{}\"}} 0\n",
            hindsight_telemetry::PROJECTOR_NOT_FOLDED,
            reason.label()
        );
        assert!(body.contains(&series), "no {series}");
    }
    for series in [
        "hindsight_api_rate_limited_total 0\n",
        "hindsight_api_forbidden_total{reason=\"lookback\"} 0\n",
        "hindsight_api_auth_failures_total{reason=\"missing\"} 0\n",
        "hindsight_api_requests_total{route=\"/v1/health\",status=\"429\"} 0\n",
        "hindsight_ingest_responses_total{status=\"413\"} 0\n",
        "hindsight_kafka_delivery_errors_total{reason=\"not_confirmed\"} 0\n",
        "hindsight_http_timeouts_total{listener=\"api\",bound=\"request\"} 0\n",
        "hindsight_http_timeouts_total{listener=\"ingest\",bound=\"header\"} 0\n",
        "hindsight_http_max_connections{listener=\"api\"} 512\n",
    ] {
        // On failure, what the family holds instead (absent, another value,
        // other labels).
        let name = series.split(['{', ' ']).next().unwrap_or(series);
        let held: Vec<&str> = body.lines().filter(|l| l.starts_with(name)).collect();
        assert!(body.contains(series), "no {series}; {name} holds {held:?}");
    }
    promtool_accepts("fresh api", &body);
    app.stop().await;
}

/// A service's listeners are listed on `/metrics` once it is handed its
/// shutdown signal, before its future first runs: a test (or a binary) that
/// starts several services may be scraped through one of them while
/// another's task has not started. (Before, registration waited for the
/// listener's task, and the test above failed in one CI run and in 2 of
/// 25 local runs: the ingest listener's series absent.) The `ops`
/// listener: no other test of this binary has one, so nothing else
/// registers it.
#[tokio::test(flavor = "multi_thread")]
async fn a_services_listeners_are_listed_before_it_first_runs() {
    use hindsight::backends::{BackendConfig, Backends};
    use hindsight::services::{self, ingest::IngestConfig, Listeners};
    let handle = hindsight_telemetry::install();
    let dir = temp_dir("listed-before-run");
    let backends = Backends::connect(&BackendConfig::embedded(&dir))
        .await
        .unwrap();
    let cfg = IngestConfig {
        token: INGEST_TOKEN.into(),
        max_body_bytes: 1 << 20,
        limits: ingest_limits(),
    };
    let listeners = Listeners {
        service: port0().await,
        ops: Some(port0().await),
    };
    let ingest = services::ingest::build(&cfg, &backends, listeners).unwrap();
    let series = "hindsight_http_timeouts_total{listener=\"ops\",bound=\"header\"} 0\n";
    assert!(!handle.render().contains(series), "not before the call");
    let never_polled = ingest.run_until_stopped(std::future::pending());
    assert!(handle.render().contains(series), "no {series}");
    drop(never_polled);
}
