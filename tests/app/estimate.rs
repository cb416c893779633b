//! `/v1/estimate/{kind}`: the points a history request would return,
//! counted by the store, equal to what paging through the request
//! actually returns, and bytes near the pages' real size; gated and
//! rate-counted like the route it estimates.

use crate::helpers::*;
use serde_json::json;
use std::collections::BTreeSet;

/// 2025-09-01T00:00:00Z, in milliseconds.
const T0: i64 = 1_756_684_800_000;

fn iso(ms: i64) -> String {
    hindsight_schemas::Timestamp(ms).to_rfc3339()
}

fn market_line() -> String {
    json!({"kind": "market", "id": "est-m", "slug": "estimates", "event_id": null,
        "question": "Estimates?", "description": null, "status": "open", "start_date": null,
        "end_date": null, "closed_at": null, "resolved_token_id": null, "resolved_token_label": null,
        "tokens": [{"id": "est-yes", "label": "Yes"}, {"id": "est-no", "label": "No"}],
        "created_at": "2025-08-01T00:00:00Z", "updated_at": "2025-08-01T00:00:00Z"})
    .to_string()
}

/// Every page of `path` at `limit=200`: points and total body bytes.
async fn read_all(app: &TestApp, path: &str) -> (u64, u64) {
    let (mut points, mut bytes) = (0, 0);
    let mut cursor = String::new();
    loop {
        let r = client()
            .get(app.api_url(&format!("{path}&limit=200{cursor}")))
            .header("X-API-Key", API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body = r.bytes().await.unwrap();
        bytes += body.len() as u64;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        points += match &body["data"] {
            serde_json::Value::Array(a) => a.len() as u64,
            serde_json::Value::Object(m) => {
                m.values().map(|v| v.as_array().unwrap().len() as u64).sum()
            }
            other => panic!("{other}"),
        };
        match body["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return (points, bytes),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimates_count_what_the_routes_return_and_size_it_closely() {
    let app = spawn_app("estimate").await;
    let (status, body) = ingest(&app, market_line()).await;
    assert_eq!(status, 200, "{body}");
    let mut lines = Vec::new();
    let mut minutes: [BTreeSet<i64>; 2] = Default::default();
    let mut ticks: [Vec<i64>; 2] = Default::default();
    let mut trades = Vec::new();
    for i in 0..900_i64 {
        let ms = T0 + (i * 47_917) % (12 * 3_600_000);
        let (token, k) = if i % 3 == 0 {
            ("est-no", 1)
        } else {
            ("est-yes", 0)
        };
        minutes[k].insert(ms / 60_000);
        ticks[k].push(ms);
        if k == 0 && i % 4 == 1 {
            // A trade every fourth tick of est-yes, each sent twice: its id
            // counts once.
            let trade = json!({"kind": "trade", "market_id": "est-m", "token_id": token,
                "ts": iso(ms), "price": 0.5, "size": 2.0, "side": "buy", "trade_id": format!("tr{i}")})
            .to_string();
            lines.push(trade.clone());
            lines.push(trade);
            trades.push(ms);
        }
        lines.push(json!({"kind": "price", "market_id": "est-m", "token_id": token, "ts": iso(ms), "p": 0.5}).to_string());
        lines.push(
            json!({"kind": "book", "market_id": "est-m", "token_id": token, "ts": iso(ms),
            "bids": [[0.49, 10.0], [0.48, 5.5]], "asks": [[0.51, 7.25]]})
            .to_string(),
        );
        lines.push(json!({"kind": "metrics", "market_id": "est-m", "ts": iso(ms), "volume": 10.0, "liquidity": 2.0, "spread": 0.01}).to_string());
    }
    let (status, body) = ingest(&app, lines.join("\n")).await;
    assert_eq!(status, 200, "{body}");
    let day = format!(
        "/v1/markets/est-m/metrics?start_ts={}&end_ts={}&resolution=1d",
        iso(T0),
        iso(T0 + 86_400_000)
    );
    wait_for(&app, &day, |b| !b["data"].as_array().unwrap().is_empty()).await;
    // Wait until the projector has caught up with every event.
    let last_book = format!(
        "/v1/tokens/est-yes/candles?start_ts={}&end_ts={}&resolution=1d",
        iso(T0),
        iso(T0 + 86_400_000)
    );
    wait_for(&app, &last_book, |b| {
        b["data"][0]["n"].as_u64() == Some(600)
    })
    .await;

    let range = |res: &str| {
        format!(
            "start_ts={}&end_ts={}&resolution={res}",
            iso(T0 + 3_600_000),
            iso(T0 + 9 * 3_600_000)
        )
    };
    let in_range = |k: usize| {
        minutes[k]
            .iter()
            .filter(|&&m| m * 60_000 >= T0 + 3_600_000 && m * 60_000 < T0 + 9 * 3_600_000)
            .count() as u64
    };
    let cases = [
        (
            "prices",
            "token_id=est-yes",
            "/v1/tokens/est-yes/prices",
            in_range(0),
        ),
        (
            "candles",
            "token_id=est-no",
            "/v1/tokens/est-no/candles",
            in_range(1),
        ),
        (
            "books",
            "token_id=est-yes",
            "/v1/tokens/est-yes/books",
            in_range(0),
        ),
        (
            "prices",
            "market_id=estimates",
            "/v1/markets/est-m/prices",
            in_range(0) + in_range(1),
        ),
        (
            "candles",
            "market_id=est-m",
            "/v1/markets/est-m/candles",
            in_range(0) + in_range(1),
        ),
        ("metrics", "market_id=est-m", "/v1/markets/est-m/metrics", {
            let all: BTreeSet<i64> = minutes[0].union(&minutes[1]).copied().collect();
            all.iter()
                .filter(|&&m| m * 60_000 >= T0 + 3_600_000 && m * 60_000 < T0 + 9 * 3_600_000)
                .count() as u64
        }),
    ];
    for (kind, target, route, want) in cases {
        let (status, _, est) = get_as(
            &app,
            Some(API_KEY),
            &format!("/v1/estimate/{kind}?{target}&{}", range("1m")),
        )
        .await;
        assert_eq!(status, 200, "{kind} {target}: {est}");
        let (points, bytes) = read_all(&app, &format!("{route}?{}", range("1m"))).await;
        assert!(want > 100, "{kind}: the range holds many points");
        assert_eq!(est["records"], want, "{kind} {target}: {est}");
        assert_eq!(points, want, "{kind}: the route returns what was counted");
        let estimated = est["bytes"].as_u64().unwrap() as f64;
        let ratio = estimated / bytes as f64;
        assert!(
            (0.8..1.25).contains(&ratio),
            "{kind} {target}: estimated {estimated} bytes, pages hold {bytes}"
        );
    }
    // Tick level: prices and books at `resolution=tick`, trades (no
    // resolution), counted as the routes page them.
    let span = format!(
        "start_ts={}&end_ts={}",
        iso(T0 + 3_600_000),
        iso(T0 + 9 * 3_600_000)
    );
    let within = |times: &[i64]| {
        times
            .iter()
            .filter(|&&ms| (T0 + 3_600_000..T0 + 9 * 3_600_000).contains(&ms))
            .count() as u64
    };
    for (kind, token, query, want) in [
        (
            "prices",
            "est-yes",
            format!("{span}&resolution=tick"),
            within(&ticks[0]),
        ),
        (
            "books",
            "est-no",
            format!("{span}&resolution=tick"),
            within(&ticks[1]),
        ),
        ("trades", "est-yes", span.clone(), within(&trades)),
    ] {
        let (status, _, est) = get_as(
            &app,
            Some(API_KEY),
            &format!("/v1/estimate/{kind}?token_id={token}&{query}"),
        )
        .await;
        assert_eq!(status, 200, "{kind} at tick: {est}");
        let (points, bytes) = read_all(&app, &format!("/v1/tokens/{token}/{kind}?{query}")).await;
        assert!(want > 50, "{kind}: the span holds many ticks");
        assert_eq!(est["records"], want, "{kind} at tick: {est}");
        assert_eq!(points, want, "{kind}: the route returns what was counted");
        let ratio = est["bytes"].as_u64().unwrap() as f64 / bytes as f64;
        assert!(
            (0.8..1.25).contains(&ratio),
            "{kind} at tick: estimated {est}, pages hold {bytes}"
        );
    }
    // An empty range, and one outside all data.
    let (status, _, est) = get_as(
        &app,
        Some(API_KEY),
        &format!(
            "/v1/estimate/prices?token_id=est-yes&start_ts={}&end_ts={}&resolution=1h",
            iso(T0 - 86_400_000),
            iso(T0)
        ),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(est["records"], 0);
    // Refusals.
    let r = range("1m");
    for (path, status_want) in [
        (format!("/v1/estimate/prices?{r}"), 400),
        (
            format!("/v1/estimate/prices?token_id=est-yes&market_id=est-m&{r}"),
            400,
        ),
        (format!("/v1/estimate/metrics?token_id=est-yes&{r}"), 400),
        (format!("/v1/estimate/ticks?token_id=est-yes&{r}"), 422),
        (
            format!("/v1/estimate/candles?token_id=est-yes&{span}&resolution=tick"),
            422,
        ),
        (
            format!("/v1/estimate/metrics?market_id=est-m&{span}&resolution=tick"),
            422,
        ),
        (format!("/v1/estimate/prices?token_id=nope&{r}"), 404),
        (format!("/v1/estimate/prices?market_id=nope&{r}"), 404),
        (
            "/v1/estimate/prices?token_id=est-yes&resolution=1m".to_string(),
            422,
        ),
    ] {
        let (status, _, body) = get_as(&app, Some(API_KEY), &path).await;
        assert_eq!(status, status_want, "{path}: {body}");
    }
}

#[tokio::test]
async fn estimates_are_plan_gated_as_their_route_and_rate_counted() {
    let dir = temp_dir("estimate_plans");
    let plans = dir.join("plans.json");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        &plans,
        r#"{"metrics_only": {"requests_per_minute": 5, "granularity_allowed": "1h", "max_history_days": 3650,
                            "metrics": true, "prices": false, "books": false}}"#,
    )
    .unwrap();
    let app = spawn_app_in(
        &dir,
        Options {
            plans_file: Some(plans),
            ..Options::default()
        },
    )
    .await;
    let (status, body) = ingest(&app, market_line()).await;
    assert_eq!(status, 200, "{body}");
    wait_for(&app, "/v1/markets/est-m", |b| b["id"] == "est-m").await;
    let key = app.key("metrics_only").await;
    let range = format!("start_ts={}&end_ts={}", iso(T0), iso(T0 + 86_400_000));
    for (path, want) in [
        (
            format!("/v1/estimate/candles?market_id=est-m&{range}&resolution=1h"),
            403,
        ),
        (
            format!("/v1/estimate/metrics?market_id=est-m&{range}&resolution=1m"),
            403,
        ),
        // No trades in the plan, and no tick level.
        (format!("/v1/estimate/trades?token_id=est-yes&{range}"), 403),
        (
            format!("/v1/estimate/prices?token_id=est-yes&{range}&resolution=tick"),
            403,
        ),
        (
            format!("/v1/estimate/metrics?market_id=est-m&{range}&resolution=1h"),
            200,
        ),
        (
            format!("/v1/estimate/metrics?market_id=est-m&{range}&resolution=1h"),
            429,
        ),
    ] {
        let (status, _, body) = get_as(&app, Some(&key), &path).await;
        assert_eq!(status, want, "{path}: {body}");
    }
}
