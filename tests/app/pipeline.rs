//! Ingest over HTTP → log → projector → read store → /v1, on the embedded
//! default, checked against averages computed independently here.

use crate::helpers::*;
use std::collections::BTreeMap;

/// 2025-09-01T00:00:00Z
const DAY: i64 = 1_756_684_800;

/// Deterministic ticks around the 2025-09-01/02 day boundary and several
/// 6 h boundaries, several per minute, out of order in places.
fn ticks() -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    let mut x: u64 = 42;
    // 17:50 on day 1 to 00:20 on day 2, every 17 s.
    let mut t = DAY + 17 * 3600 + 50 * 60;
    while t < DAY + 86_400 + 20 * 60 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let p = ((x >> 33) % 10_000) as f64 / 10_000.0;
        out.push((t, p));
        t += 17;
    }
    // Late events: they belong to their own (earlier) buckets.
    out.push((DAY + 18 * 3600 + 5, 0.9));
    out.push((DAY + 60, 0.1));
    out
}

fn expected(ticks: &[(i64, f64)], width: i64) -> BTreeMap<i64, f64> {
    let mut sums: BTreeMap<i64, (f64, u32)> = BTreeMap::new();
    for (t, p) in ticks {
        let e = sums.entry(t.div_euclid(width) * width).or_default();
        e.0 += p;
        e.1 += 1;
    }
    sums.into_iter()
        .map(|(b, (s, n))| (b, s / n as f64))
        .collect()
}

/// ISO 8601 of Unix seconds as chrono prints it (pages write their own,
/// `IsoWriter`).
fn iso(secs: i64) -> String {
    hindsight_schemas::Timestamp(secs * 1000).to_rfc3339()
}

/// Reads every page of a token's prices (following `next_cursor`).
async fn all_pages(
    app: &TestApp,
    token: &str,
    res: &str,
    start: i64,
    end: i64,
) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!(
            "/v1/tokens/{token}/prices?start_ts={start}&end_ts={}&resolution={res}&limit=200{cursor}",
            iso(end)
        );
        let (status, body) = get(app, &path).await;
        assert_eq!(status, 200, "{body}");
        for point in body["data"].as_array().unwrap() {
            out.push((
                point["t"].as_str().unwrap().to_string(),
                point["p"].as_f64().unwrap(),
            ));
        }
        match body["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_ingested_over_http_come_back_as_exact_bucket_averages() {
    let app = spawn_app("e2e").await;
    let ticks = ticks();
    let mut body = market_line("m1") + "\n";
    for (t, p) in &ticks {
        body += &price_line("m1", "m1-yes", *t, *p);
        body += "\n";
    }
    let (status, ack) = ingest(&app, body).await;
    assert_eq!(status, 200, "{ack}");
    assert_eq!(ack["accepted"], ticks.len() + 1);
    assert_eq!(ack["rejected_count"], 0);

    let (start, end) = (DAY, DAY + 2 * 86_400);
    // Everything acknowledged becomes visible: wait for the last 1d bucket.
    let n = ticks.len();
    let day2 = format!("/v1/tokens/m1-yes/prices?start_ts={start}&end_ts={end}&resolution=1d");
    wait_for(&app, &day2, |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 2)
    })
    .await;
    let h1 = format!(
        "/v1/tokens/m1-yes/prices?start_ts={}&end_ts={end}&resolution=1m&limit=1",
        DAY + 86_400 + 19 * 60
    );
    wait_for(&app, &h1, |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;

    for (res, width) in [("1m", 60), ("1h", 3600), ("6h", 21_600), ("1d", 86_400)] {
        let want = expected(&ticks, width);
        let got = all_pages(&app, "m1-yes", res, start, end).await;
        assert_eq!(
            got.len(),
            want.len(),
            "{res}: one point per bucket with ticks"
        );
        for ((t, p), (bucket, avg)) in got.iter().zip(&want) {
            assert_eq!(t, &iso(*bucket), "{res}: chronological bucket starts");
            assert!((p - avg).abs() < 1e-12, "{res} {t}: got {p}, want {avg}");
        }
    }
    // Bucket starts fall on UTC day and 6 h boundaries.
    let six = all_pages(&app, "m1-yes", "6h", start, end).await;
    let starts: Vec<&str> = six.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        starts,
        [
            "2025-09-01T00:00:00Z",
            "2025-09-01T12:00:00Z",
            "2025-09-01T18:00:00Z",
            "2025-09-02T00:00:00Z"
        ]
    );
    let daily = all_pages(&app, "m1-yes", "1d", start, end).await;
    assert_eq!(daily[0].0, "2025-09-01T00:00:00Z");
    assert_eq!(daily[1].0, "2025-09-02T00:00:00Z");
    assert!(
        n > 1000 && expected(&ticks, 60).len() > 200,
        "1m spans several pages of 200"
    );

    // Half-open range: end_ts excludes the bucket that starts at it.
    let (_, b) = get(
        &app,
        &format!(
            "/v1/tokens/m1-yes/prices?start_ts={}&end_ts={}&resolution=1h",
            DAY + 18 * 3600,
            DAY + 19 * 3600
        ),
    )
    .await;
    assert_eq!(b["data"].as_array().unwrap().len(), 1);
    assert_eq!(b["market_id"], "m1");
    assert_eq!(b["token_label"], "Yes");
    // Stopping ends every service cleanly (each run returns Ok).
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_gzip_and_idempotent_retries() {
    use std::io::Write;
    let app = spawn_app("gzip").await;
    let body = format!(
        "{}\n{}\n",
        market_line("g1"),
        price_line("g1", "g1-yes", DAY + 30, 0.25)
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(body.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let send = |key: &'static str| {
        client()
            .post(app.ingest_url("/ingest/v1/events"))
            .bearer_auth(INGEST_TOKEN)
            .header("Content-Encoding", "gzip")
            .header("Idempotency-Key", key)
            .body(gz.clone())
            .send()
    };
    let first = send("batch-1").await.unwrap();
    assert_eq!(first.status(), 200);
    let first: serde_json::Value = first.json().await.unwrap();
    assert_eq!(first["accepted"], 2);
    let retry = send("batch-1").await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<serde_json::Value>().await.unwrap(), first);
    // A new key appends again: the 1m bucket then averages two equal ticks
    // (count 2), while the retry above added nothing.
    send("batch-2").await.unwrap();
    let path = format!(
        "/v1/tokens/g1-yes/prices?start_ts={DAY}&end_ts={}&resolution=1m",
        DAY + 60
    );
    wait_for(&app, &path, |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    let store = rusqlite::Connection::open(app.data_dir.join("store.db")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let count: i64 = store
            .query_row(
                "SELECT ticks FROM price_bucket_blocks
                 WHERE sid = (SELECT sid FROM series_ids WHERE name = 'g1-yes') AND res = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if count == 2 {
            break;
        }
        assert!(count < 2, "the retried batch was appended twice");
        assert!(
            std::time::Instant::now() < deadline,
            "second batch never projected"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_idempotency_key_with_another_body_is_409_and_appends_nothing() {
    let app = spawn_app("key-reuse").await;
    let first = format!(
        "{}\n{}\n",
        market_line("r1"),
        price_line("r1", "r1-yes", DAY + 30, 0.25)
    );
    let other = format!("{}\n", price_line("r1", "r1-yes", DAY + 40, 0.75));
    let send = |body: &str| {
        client()
            .post(app.ingest_url("/ingest/v1/events"))
            .bearer_auth(INGEST_TOKEN)
            .header("Idempotency-Key", "reused-key")
            .body(body.to_string())
            .send()
    };
    let accepted = send(&first).await.unwrap();
    assert_eq!(accepted.status(), 200);
    let accepted: serde_json::Value = accepted.json().await.unwrap();
    assert_eq!(accepted["accepted"], 2);

    let refused = send(&other).await.unwrap();
    assert_eq!(refused.status(), 409);
    assert!(!refused.headers().contains_key("idempotent-replayed"));
    let detail = refused.json::<serde_json::Value>().await.unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        detail.starts_with("Idempotency-Key reused-key was used for a different body"),
        "{detail}"
    );

    // The first body's retry is still answered from the first append.
    let replayed = send(&first).await.unwrap();
    assert_eq!(replayed.status(), 200);
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    assert_eq!(
        replayed.json::<serde_json::Value>().await.unwrap(),
        accepted
    );

    // The log holds the first body's two events, nothing of the other.
    let log_events = || {
        scalar(
            &app.data_dir.join("log.db"),
            "SELECT COALESCE(SUM(count), 0) FROM log_batches",
        )
    };
    assert_eq!(log_events(), 2);
    let path = format!(
        "/v1/tokens/r1-yes/prices?start_ts={DAY}&end_ts={}&resolution=1m",
        DAY + 60
    );
    let prices = wait_for(&app, &path, |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    assert_eq!(
        prices["data"][0]["p"], 0.25,
        "the refused tick is not in the bucket"
    );
    assert_eq!(log_events(), 2);
}
