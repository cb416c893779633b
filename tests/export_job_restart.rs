//! An export job that a real `hindsight dev` acknowledged (202) survives a
//! SIGKILL of that process before any replica ran it: the restarted
//! process runs it, and the download is the streamed export's bytes.
//! (A job killed part way is reclaimed after its lease:
//! `tests/app/export_jobs.rs`.)

mod common;
use common::*;
use std::time::{Duration, Instant};

/// 2025-09-01T00:00:00Z
const DAY: i64 = 1_756_684_800;

async fn get(base: &Dev, key: &str, path: &str) -> (u16, Vec<u8>) {
    let r = client()
        .get(base.url(path))
        .header("X-API-Key", key)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_job_acknowledged_before_a_sigkill_runs_after_the_restart() {
    let dir = temp_dir("export-job-restart");
    // This process looks for jobs once an hour: the job stays queued
    // until the kill.
    let mut dev = Dev::start_in(&dir, &["--export-job-poll-ms", "3600000"]);
    let key = create_key(&dir, "org-restart", "enterprise", None);
    let mut lines = vec![market_line("m1")];
    for i in 0..600 {
        lines.push(price_line(
            "m1",
            "m1-yes",
            DAY + i * 20,
            (i % 97) as f64 / 100.0,
        ));
    }
    let (status, ack) = ingest(&dev, lines.join("\n")).await;
    assert_eq!(status, 200, "{ack}");
    let query = format!(
        "token_id=m1-yes&start_ts={DAY}&end_ts={}&resolution=1m&format=csv",
        DAY + 12_000
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let last = format!(
        "/v1/tokens/m1-yes/prices?start_ts={}&end_ts={}&resolution=1m",
        DAY + 11_940,
        DAY + 12_000
    );
    loop {
        let (status, body) = get(&dev, &key, &last).await;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if status == 200 && body["data"].as_array().is_some_and(|d| !d.is_empty()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the last bucket never showed: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, sync) = get(&dev, &key, &format!("/v1/export/prices?{query}")).await;
    assert_eq!(status, 200);
    let r = client()
        .post(dev.url(&format!("/v1/exports?kind=prices&{query}")))
        .header("X-API-Key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let job: serde_json::Value = r.json().await.unwrap();
    assert_eq!(job["status"], "queued", "{job}");
    let id = job["id"].as_str().unwrap().to_string();

    dev.child.kill().unwrap(); // SIGKILL
    dev.child.wait().unwrap();
    drop(dev);

    let dev = Dev::start_in(&dir, &["--export-job-poll-ms", "20"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let job = loop {
        let (status, body) = get(&dev, &key, &format!("/v1/exports/{id}")).await;
        let job: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(status, 200, "the job after the restart: {job}");
        assert_ne!(job["status"], "failed", "{job}");
        if job["status"] == "done" {
            break job;
        }
        assert!(Instant::now() < deadline, "the job never finished: {job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(job["rows"], 200, "{job}");
    let (status, file) = get(&dev, &key, &format!("/v1/exports/{id}/download")).await;
    assert_eq!(status, 200);
    assert!(
        file == sync,
        "the job's file differs from the streamed export"
    );
}
