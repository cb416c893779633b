//! Rate limits: a sliding window that no interval of 60 s ever exceeds,
//! across a minute's edge and across API replicas sharing a store;
//! `/v1/usage` answers a limited key; the headers say when to come back.

use crate::helpers::*;
use hindsight_schemas::time::Clock;
use reqwest::header::HeaderMap;
use serde_json::Value;
use std::time::Duration;

const WINDOW_MS: i64 = 60_000;

/// `tiny`: 5 requests per minute.
fn tiny_plans(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("plans.json");
    std::fs::write(
        &path,
        r#"{"tiny": {"requests_per_minute": 5, "granularity_allowed": "1h", "max_history_days": 36500,
                    "metrics": true, "prices": true, "books": true}}"#,
    )
    .unwrap();
    path
}

async fn spawn_tiny(name: &str) -> TestApp {
    let dir = temp_dir(name);
    let plans = tiny_plans(&dir);
    spawn_app_in(
        &dir,
        Options {
            plans_file: Some(plans),
            ..Options::default()
        },
    )
    .await
}

async fn call(base: &str, key: &str, path: &str) -> (u16, HeaderMap, Value) {
    get_from(base, Some(key), path).await
}

fn header(h: &HeaderMap, name: &str) -> i64 {
    h[name].to_str().unwrap().parse().unwrap()
}

fn now_ms(app: &TestApp) -> i64 {
    app.clock.now().millis()
}

/// Admitted iff fewer than `limit` admitted requests lie in the 60 s before
/// (exclusive): the sliding window, for a clock that only moves forward.
fn sliding_window(limit: usize, times: &[i64]) -> Vec<bool> {
    let mut admitted: Vec<i64> = Vec::new();
    times
        .iter()
        .map(|&t| {
            let ok = admitted.iter().filter(|&&a| a > t - WINDOW_MS).count() < limit;
            if ok {
                admitted.push(t);
            }
            ok
        })
        .collect()
}

/// The most admitted requests in any interval of 60 s.
fn busiest_minute(admitted: &[i64]) -> usize {
    admitted
        .iter()
        .map(|&start| {
            admitted
                .iter()
                .filter(|&&t| t >= start && t < start + WINDOW_MS)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sixty_seconds_hold_more_than_the_plan_across_a_minute_boundary() {
    let app = spawn_app("rate-boundary").await;
    let key = app.key("free").await; // 60 per minute
                                     // The clock starts on a minute boundary; 0.6 s before the next one, 120
                                     // requests 10 ms apart straddle it. Fixed minute windows admitted all
                                     // 120 (60 either side of the boundary) in 1.2 s.
    app.clock.advance(Duration::from_millis(59_400));
    let mut times = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..120 {
        times.push(now_ms(&app));
        statuses.push(call(&app.api, &key, "/v1/health").await.0);
        app.clock.advance(Duration::from_millis(10));
    }
    let burst = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(
        burst, 60,
        "the 1.2 s burst across the boundary: {statuses:?}"
    );
    // Then three minutes of a request every 250 ms (four per second, four
    // times the plan's rate): refused while the window is full, admitted as
    // earlier requests leave it.
    for _ in 0..720 {
        app.clock.advance(Duration::from_millis(250));
        times.push(now_ms(&app));
        statuses.push(call(&app.api, &key, "/v1/health").await.0);
    }
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    let got: Vec<bool> = statuses.iter().map(|s| *s == 200).collect();
    assert_eq!(
        got,
        sliding_window(60, &times),
        "each decision is the sliding window's"
    );
    let admitted: Vec<i64> = times
        .iter()
        .zip(&got)
        .filter(|(_, ok)| **ok)
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(busiest_minute(&admitted), 60, "no 60 s hold more than 60");
    assert!(
        admitted.len() >= 60 * 3,
        "the key keeps its full rate: {} admitted over 4 minutes",
        admitted.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_answers_a_limited_key_and_headers_say_when_to_come_back() {
    let app = spawn_tiny("rate-usage").await;
    let key = app.key("tiny").await;
    let t0 = now_ms(&app);
    // Five requests 10 s apart fill the window; each says what is left.
    for i in 0..5 {
        let (st, h, _) = call(&app.api, &key, "/v1/health").await;
        assert_eq!(st, 200);
        assert_eq!(header(&h, "x-ratelimit-limit"), 5);
        assert_eq!(header(&h, "x-ratelimit-remaining"), 4 - i);
        assert_eq!(
            header(&h, "x-ratelimit-reset"),
            (now_ms(&app) + WINDOW_MS) / 1000,
            "the full allowance is back when this request leaves the window"
        );
        app.clock.advance(Duration::from_secs(10));
    }
    // At t0 + 50 s: refused until the request of t0 leaves, at t0 + 60 s.
    let (st, h, b) = call(&app.api, &key, "/v1/markets").await;
    assert_eq!(
        (st, b["detail"].as_str()),
        (429, Some("rate limit exceeded, try again later"))
    );
    assert_eq!(header(&h, "retry-after"), 10);
    assert_eq!(header(&h, "x-ratelimit-remaining"), 0);
    assert_eq!(
        header(&h, "x-ratelimit-reset"),
        (t0 + 40_000 + WINDOW_MS) / 1000
    );

    // /v1/usage answers, says the same, and counts nothing.
    for _ in 0..20 {
        let (st, h, b) = call(&app.api, &key, "/v1/usage").await;
        assert_eq!(st, 200, "{b}");
        assert_eq!(b["plan"], "tiny");
        assert_eq!(b["limits"]["requests_per_minute"], 5);
        assert_eq!(b["limits"]["requests_remaining"], 0);
        assert_eq!(b["reset_at"], (t0 + 40_000 + WINDOW_MS) / 1000);
        assert_eq!(header(&h, "x-ratelimit-remaining"), 0);
        assert_eq!(
            header(&h, "x-ratelimit-reset"),
            (t0 + 40_000 + WINDOW_MS) / 1000
        );
    }
    // Still authenticated.
    let (st, _, _) = call(&app.api, "hsk_wrong", "/v1/usage").await;
    assert_eq!(st, 401);

    // At t0 + 60 s the first request has left: one fits, then none until
    // t0 + 70 s.
    app.clock.advance(Duration::from_secs(10));
    let (_, _, b) = call(&app.api, &key, "/v1/usage").await;
    assert_eq!(b["limits"]["requests_remaining"], 1, "{b}");
    assert_eq!(call(&app.api, &key, "/v1/health").await.0, 200);
    let (st, h, _) = call(&app.api, &key, "/v1/health").await;
    assert_eq!((st, header(&h, "retry-after")), (429, 10));
    // Long after, the whole allowance is back.
    app.clock.advance(Duration::from_secs(120));
    let (_, h, b) = call(&app.api, &key, "/v1/usage").await;
    assert_eq!(b["limits"]["requests_remaining"], 5, "{b}");
    assert_eq!(header(&h, "x-ratelimit-remaining"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_holds_across_two_api_replicas_sharing_a_store() {
    let app = spawn_tiny("rate-replicas").await;
    let replica = spawn_api_replica(&app, &[]).await;
    let key = app.key("tiny").await;
    let bases = [app.api.clone(), replica.api.clone()];
    // 30 requests at once, alternately to each replica, at one instant.
    let calls = (0..30).map(|i| {
        let (base, key) = (bases[i % 2].clone(), key.clone());
        tokio::spawn(async move { call(&base, &key, "/v1/health").await.0 })
    });
    let mut statuses = Vec::new();
    for c in calls {
        statuses.push(c.await.unwrap());
    }
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(
        admitted, 5,
        "5 per minute in total, whichever replica answers: {statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 25);
    // Both replicas see the full window.
    for base in &bases {
        let (_, _, b) = call(base, &key, "/v1/usage").await;
        assert_eq!(b["limits"]["requests_remaining"], 0, "{base}: {b}");
    }
    // A minute later, alternating replicas admit exactly five again.
    app.clock.advance(Duration::from_secs(60));
    let mut later = Vec::new();
    for i in 0..8 {
        later.push(call(&bases[i % 2], &key, "/v1/health").await.0);
        app.clock.advance(Duration::from_millis(100));
    }
    assert_eq!(later, [200, 200, 200, 200, 200, 429, 429, 429]);
}
