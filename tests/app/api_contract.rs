//! The /v1 contract of docs/SPEC.md: every refusal with its status and exact
//! text, plans, discovery and paging (rate limits: `rate_limits.rs`;
//! cursors: `cursors.rs`).

use crate::helpers::*;
use serde_json::Value;

const DAY: i64 = 1_756_684_800; // 2025-09-01

/// A app server seeded with a catalog and ticks, and keys of every plan.
struct Seeded {
    app: TestApp,
}

async fn seeded(name: &str) -> Seeded {
    let app = spawn_app(name).await;
    let mut lines = vec![
        r#"{"kind":"series","id":"s-pol","slug":"politics-series","title":"US Politics","tags":["politics","us"],"updated_at":"2025-08-02T00:00:00Z"}"#.to_string(),
        r#"{"kind":"series","id":"s-cry","slug":"crypto-series","title":"Crypto","tags":["crypto"],"updated_at":"2025-08-03T00:00:00Z"}"#.to_string(),
        r#"{"kind":"event","id":"e-elec","slug":"election","series_id":"s-pol","title":"Election","tags":["politics","us"],"updated_at":"2025-08-02T00:00:00Z"}"#.to_string(),
        r#"{"kind":"event","id":"e-btc","slug":"bitcoin-2026","series_id":"s-cry","title":"Bitcoin 2026","tags":["crypto"],"updated_at":"2025-08-03T00:00:00Z"}"#.to_string(),
    ];
    for i in 0..12 {
        let event = if i % 2 == 0 { "e-elec" } else { "e-btc" };
        lines.push(format!(
            r#"{{"kind":"market","id":"mk{i:02}","slug":"market-{i:02}","event_id":"{event}","question":"Question number {i} about {}","status":"open","start_date":"2025-08-{:02}T00:00:00Z","tokens":[{{"id":"mk{i:02}-y","label":"Yes"}},{{"id":"mk{i:02}-n","label":"No"}}],"created_at":"2025-08-01T00:00:00Z","updated_at":"2025-08-{:02}T00:00:00Z"}}"#,
            if i % 2 == 0 { "the Election" } else { "BITCOIN" },
            i + 1,
            i + 1
        ));
    }
    let big_tokens: Vec<String> = (0..201)
        .map(|i| format!(r#"{{"id":"big-{i}","label":"L{i}"}}"#))
        .collect();
    lines.push(format!(
        r#"{{"kind":"market","id":"big","slug":"big","status":"open","tokens":[{}]}}"#,
        big_tokens.join(",")
    ));
    for m in 0..2 {
        for k in 0..180 {
            let t = DAY + k * 60;
            lines.push(price_line(
                &format!("mk{m:02}"),
                &format!("mk{m:02}-y"),
                t,
                0.5,
            ));
            lines.push(price_line(
                &format!("mk{m:02}"),
                &format!("mk{m:02}-n"),
                t,
                0.5,
            ));
        }
        lines.push(format!(r#"{{"kind":"book","market_id":"mk{m:02}","token_id":"mk{m:02}-y","ts":{DAY},"bids":[[0.4,1]],"asks":[[0.6,1]]}}"#));
        lines.push(format!(r#"{{"kind":"metrics","market_id":"mk{m:02}","ts":{DAY},"volume":10,"liquidity":5,"spread":0.1}}"#));
    }
    let (status, body) = ingest(&app, lines.join("\n")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rejected_count"], 0, "{body}");
    wait_for(&app, "/v1/markets?limit=1000", |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 13)
    })
    .await;
    let path = format!(
        "/v1/tokens/mk01-n/prices?start_ts={DAY}&end_ts={}&resolution=1h",
        DAY + 86_400
    );
    wait_for(&app, &path, |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 3)
    })
    .await;
    Seeded { app }
}

fn detail(body: &Value) -> &str {
    body["detail"].as_str().unwrap_or_default()
}

fn first_issue(body: &Value) -> (Vec<String>, String, String) {
    let i = &body["detail"][0];
    (
        i["loc"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect(),
        i["msg"].as_str().unwrap().to_string(),
        i["type"].as_str().unwrap().to_string(),
    )
}

fn hist(path: &str, extra: &str) -> String {
    format!(
        "{path}?start_ts={DAY}&end_ts={}&resolution=1h{extra}",
        DAY + 86_400
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_plans() {
    let s = seeded("auth").await;
    let app = &s.app;
    let path = hist("/v1/tokens/mk00-y/prices", "");

    // 401
    let (st, h, b) = get_as(app, None, &path).await;
    assert_eq!(
        (st, detail(&b)),
        (
            401,
            "API key required. Include the X-API-Key header with your API key."
        )
    );
    assert!(h.contains_key("x-request-id"));
    let (st, _, b) = get_as(app, Some("hsk_not_a_key"), &path).await;
    assert_eq!((st, detail(&b)), (401, "Invalid or expired API key."));

    // Keys from the CLI, against the running service's store.
    let free = create_key(&app.data_dir, "acme", "free", None);
    let pro = create_key(&app.data_dir, "acme", "pro", None);
    assert!(free.starts_with("hsk_") && free.len() > 60);
    let listing = keys_cli(&app.data_dir, &["list"]);
    assert!(!listing.contains(&free), "keys are never shown again");

    // 403 by reason.
    let (st, _, b) = get_as(app, Some(&free), &hist("/v1/tokens/mk00-y/books", "")).await;
    assert_eq!(st, 403);
    assert_eq!(
        detail(&b),
        "Your plan does not allow historical order books."
    );
    let (st, _, b) = get_as(
        app,
        Some(&free),
        &path.replace("resolution=1h", "resolution=1m"),
    )
    .await;
    assert_eq!(
        (st, detail(&b)),
        (
            403,
            "Your plan does not allow resolution 1m; the finest allowed is 1h."
        )
    );
    let (st, _, b) = get_as(app, Some(&free), &path).await;
    assert_eq!(
        (st, detail(&b)),
        (403, "start_ts is beyond your plan's lookback of 30 days.")
    );
    let july = "/v1/tokens/mk00-y/prices?start_ts=2025-07-01T00:00:00Z&end_ts=2025-07-02T00:00:00Z&resolution=1h";
    let (st, _, b) = get_as(app, Some(&pro), july).await;
    assert_eq!(
        (st, detail(&b)),
        (
            403,
            "History before 2025-08-01 is available on enterprise plans only."
        )
    );
    let (st, _, b) = get_as(app, Some(API_KEY), july).await;
    assert_eq!(
        (st, b["data"].as_array().unwrap().len()),
        (200, 0),
        "enterprise reads before coverage; empty range is empty"
    );

    // A plan change takes effect at once; a revoked key stops at once.
    let key_id = listing
        .lines()
        .find(|l| l.contains("\tfree\t"))
        .unwrap()
        .split('\t')
        .next()
        .unwrap()
        .to_string();
    let (st, _, _) = get_as(app, Some(&free), &hist("/v1/tokens/mk00-y/books", "")).await;
    assert_eq!(st, 403);
    keys_cli(&app.data_dir, &["set-plan", &key_id, "enterprise"]);
    let (st, _, b) = get_as(app, Some(&free), &hist("/v1/tokens/mk00-y/books", "")).await;
    assert_eq!(st, 200, "{b}");
    keys_cli(&app.data_dir, &["revoke", &key_id]);
    let (st, _, b) = get_as(app, Some(&free), "/v1/health").await;
    assert_eq!((st, detail(&b)), (401, "Invalid or expired API key."));

    // Health and usage.
    let (st, _, b) = get_as(app, Some(&pro), "/v1/health").await;
    assert_eq!((st, b["status"].as_str()), (200, Some("ok")));
    let (_, h, b) = get_as(app, Some(&pro), "/v1/usage").await;
    assert_eq!(b["plan"], "pro");
    assert_eq!(b["organization"], "acme");
    assert_eq!(b["limits"]["requests_per_minute"], 600);
    assert_eq!(b["limits"]["granularity_allowed"], "1m");
    assert_eq!(b["limits"]["max_history_days"], 365);
    assert_eq!(
        b["limits"]["data_points"],
        serde_json::json!({"metrics": true, "prices": true, "books": true, "trades": true})
    );
    assert_eq!(
        b["limits"]["requests_remaining"].to_string(),
        h["x-ratelimit-remaining"].to_str().unwrap()
    );
    assert_eq!(
        b["reset_at"].to_string(),
        h["x-ratelimit-reset"].to_str().unwrap()
    );
    let (_, h, b) = get_as(app, Some(API_KEY), "/v1/usage").await;
    assert_eq!(
        (b["plan"].as_str(), b["reset_at"].is_null()),
        (Some("enterprise"), true)
    );
    assert!(
        !h.contains_key("x-ratelimit-limit"),
        "no limit headers on unlimited plans"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_errors_are_422_in_fastapi_shape_and_bad_values_400() {
    let s = seeded("validation").await;
    let app = &s.app;
    let k = Some(API_KEY);
    let base = "/v1/tokens/mk00-y/prices";

    let (st, _, b) = get_as(app, k, &format!("{base}?end_ts={DAY}&resolution=1h")).await;
    assert_eq!(st, 422);
    assert_eq!(
        first_issue(&b),
        (
            vec!["query".into(), "start_ts".into()],
            "Field required".into(),
            "missing".into()
        )
    );
    let (st, _, b) = get_as(app, k, &hist(base, "").replace("1h", "2h")).await;
    assert_eq!(st, 422);
    assert_eq!(
        first_issue(&b),
        (
            vec!["query".into(), "resolution".into()],
            "Input should be 'tick', '1m', '5m', '10m', '15m', '1h', '6h' or '1d'".into(),
            "enum".into()
        )
    );
    let (st, _, b) = get_as(app, k, &hist(base, "&limit=0")).await;
    assert_eq!((st, first_issue(&b).2), (422, "greater_than_equal".into()));
    let (st, _, b) = get_as(app, k, &hist(base, "&limit=ten")).await;
    assert_eq!((st, first_issue(&b).2), (422, "int_parsing".into()));
    let (st, _, b) = get_as(app, k, &hist(base, "&limit=500")).await;
    assert_eq!(
        (st, detail(&b)),
        (400, "Requested limit 500 exceeds the maximum of 200.")
    );
    let (st, _, b) = get_as(
        app,
        k,
        &format!("{base}?start_ts=yesterday&end_ts={DAY}&resolution=1h"),
    )
    .await;
    assert_eq!(st, 400);
    assert!(detail(&b).starts_with("Invalid start_ts:"), "{b}");
    let (st, _, b) = get_as(app, k, &hist(base, "&cursor=h1deadbeef")).await;
    assert_eq!(st, 400);
    assert!(
        detail(&b).starts_with("Invalid pagination cursor: the `cursor` parameter"),
        "{b}"
    );

    let (st, _, b) = get_as(app, k, "/v1/markets?limit=1001").await;
    assert_eq!(st, 422);
    assert_eq!(
        first_issue(&b),
        (
            vec!["query".into(), "limit".into()],
            "Input should be less than or equal to 1000".into(),
            "less_than_equal".into()
        )
    );
    let (st, _, b) = get_as(app, k, &format!("/v1/series?search={}", "a".repeat(201))).await;
    assert_eq!((st, first_issue(&b).2), (422, "string_too_long".into()));
    let (st, _, b) = get_as(app, k, "/v1/markets?sort=volume").await;
    assert_eq!(
        (st, first_issue(&b).1),
        (
            422,
            "Input should be 'created_at', 'updated_at', 'start_date' or 'end_date'".into()
        )
    );
    let (st, _, b) = get_as(app, k, "/v1/markets?order=up&tags_match=some").await;
    assert_eq!(
        (st, b["detail"].as_array().unwrap().len()),
        (422, 2),
        "every failed parameter is listed"
    );
    let (st, _, b) = get_as(
        app,
        k,
        "/v1/markets?start_date_min=2025-09-01&start_date_max=2025-08-01",
    )
    .await;
    assert_eq!(
        (st, detail(&b)),
        (400, "start_date_min must be <= start_date_max")
    );
    let (st, _, b) = get_as(app, k, "/v1/markets?start_date_min=soon").await;
    assert_eq!(st, 400, "{b}");
    let (st, _, b) = get_as(app, k, "/v1/markets?cursor=l1garbage").await;
    assert_eq!(st, 400);
    assert!(
        detail(&b).starts_with("Invalid pagination cursor: the `cursor` parameter"),
        "{b}"
    );
    // A cursor from another sort order is refused too.
    let (_, _, b) = get_as(app, k, "/v1/markets?limit=2&order=asc").await;
    let c = b["metadata"]["next_cursor"].as_str().unwrap().to_string();
    let (st, _, _) = get_as(
        app,
        k,
        &format!("/v1/markets?limit=2&order=desc&cursor={c}"),
    )
    .await;
    assert_eq!(st, 400);

    // Paths: 1..200 characters; unknown ids are 404.
    let (st, _, b) = get_as(
        app,
        k,
        &hist(&format!("/v1/tokens/{}/prices", "x".repeat(201)), ""),
    )
    .await;
    assert_eq!(
        (st, first_issue(&b).0),
        (422, vec!["path".to_string(), "token_id".to_string()])
    );
    let (st, _, b) = get_as(app, k, &hist("/v1/tokens/nope/prices", "")).await;
    assert_eq!((st, detail(&b)), (404, "Token not found"));
    let (st, _, b) = get_as(app, k, "/v1/markets/nope").await;
    assert_eq!((st, detail(&b)), (404, "Market not found"));
    let (st, _, _) = get_as(app, k, &hist("/v1/markets/nope/metrics", "")).await;
    assert_eq!(st, 404);

    // Market-level rules of SPEC §4.5.
    let (st, _, b) = get_as(app, k, &hist("/v1/markets/mk00/prices", "&limit=1")).await;
    assert_eq!(
        (st, detail(&b)),
        (
            400,
            "limit 1 is too small for market mk00 with 2 tokens; the minimum required is 2."
        )
    );
    let (st, _, b) = get_as(app, k, &hist("/v1/markets/big/prices", "")).await;
    assert_eq!(st, 400);
    assert!(
        detail(&b).contains("has 201 tokens")
            && detail(&b).contains("/v1/tokens/{token_id}/prices"),
        "{b}"
    );
    let (st, _, b) = get_as(app, k, &hist("/v1/markets/big/books", "")).await;
    assert!(
        st == 400 && detail(&b).contains("/v1/tokens/{token_id}/books"),
        "{b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_routes_page_chronologically() {
    let s = seeded("history").await;
    let app = &s.app;
    let k = Some(API_KEY);
    // Token prices at 1m: 180 points, pages of 50.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!(
            "/v1/tokens/mk00-y/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=50{cursor}",
            DAY + 86_400
        );
        let (st, _, b) = get_as(app, k, &path).await;
        assert_eq!(st, 200, "{b}");
        assert_eq!(b["metadata"]["limit"], 50);
        assert_eq!(b["metadata"]["count"], b["data"].as_array().unwrap().len());
        seen.extend(point_times(&b));
        match b["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 180);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "chronological, no repeats"
    );

    // Market prices: every token, label -> id, limit counts across tokens.
    let (st, _, b) = get_as(
        app,
        k,
        &format!(
            "/v1/markets/market-00/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=10",
            DAY + 86_400
        ),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["market_id"], "mk00");
    assert_eq!(
        b["tokens"],
        serde_json::json!({"Yes": "mk00-y", "No": "mk00-n"})
    );
    assert_eq!(b["data"]["Yes"].as_array().unwrap().len(), 5);
    assert_eq!(b["data"]["No"].as_array().unwrap().len(), 5);
    assert_eq!(b["metadata"]["count"], 10);
    let next = b["metadata"]["next_cursor"].as_str().unwrap();
    let (_, _, b2) = get_as(
        app,
        k,
        &format!(
            "/v1/markets/mk00/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=10&cursor={next}",
            DAY + 86_400
        ),
    )
    .await;
    assert_eq!(
        b2["data"]["Yes"][0]["t"], "2025-09-01T00:05:00Z",
        "the next page starts where this one ended"
    );

    // Books (last snapshot) and metrics (averages).
    let (_, _, b) = get_as(app, k, &hist("/v1/markets/mk00/books", "")).await;
    assert_eq!(b["data"]["Yes"][0]["bids"], serde_json::json!([[0.4, 1.0]]));
    assert_eq!(b["data"]["No"], serde_json::json!([]));
    let (_, _, b) = get_as(app, k, &hist("/v1/tokens/mk00-y/books", "")).await;
    assert_eq!(
        (b["token_label"].as_str(), b["data"][0]["asks"].clone()),
        (Some("Yes"), serde_json::json!([[0.6, 1.0]]))
    );
    let (_, _, b) = get_as(app, k, &hist("/v1/markets/mk01/metrics", "")).await;
    assert_eq!(
        b["data"][0],
        serde_json::json!({"t": "2025-09-01T00:00:00Z", "volume": 10.0, "liquidity": 5.0, "spread": 0.1})
    );
    // An empty range is an empty array.
    let (st, _, b) = get_as(
        app,
        k,
        &format!("/v1/tokens/mk00-y/prices?start_ts={DAY}&end_ts={DAY}&resolution=1h"),
    )
    .await;
    assert_eq!(
        (
            st,
            b["data"].as_array().unwrap().len(),
            b["metadata"]["next_cursor"].is_null()
        ),
        (200, 0, true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_filters_sorts_and_pages_stably_while_the_catalog_changes() {
    let s = seeded("discovery").await;
    let app = &s.app;
    let k = Some(API_KEY);
    let ids = |b: &Value| -> Vec<String> {
        b["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };

    let (_, _, b) = get_as(app, k, "/v1/markets?search=bitcoin&limit=100").await;
    assert_eq!(
        ids(&b),
        ["mk11", "mk09", "mk07", "mk05", "mk03", "mk01"],
        "case-insensitive, updated_at desc"
    );
    let (_, _, b) = get_as(
        app,
        k,
        "/v1/markets?search=MARKET-0&sort=start_date&order=asc&limit=3",
    )
    .await;
    assert_eq!(ids(&b), ["mk00", "mk01", "mk02"]);
    let (_, _, b) = get_as(app, k, "/v1/markets?event_slug=bitcoin-2026&limit=100").await;
    assert_eq!(ids(&b).len(), 6);
    let (_, _, b) = get_as(
        app,
        k,
        "/v1/markets?event_id=e-elec&start_date_min=2025-08-05&start_date_max=2025-08-09",
    )
    .await;
    assert_eq!(ids(&b), ["mk08", "mk06", "mk04"]);
    let (_, _, b) = get_as(app, k, "/v1/markets?tags=crypto&tags=politics&limit=100").await;
    assert_eq!(ids(&b).len(), 12, "any: OR");
    let (_, _, b) = get_as(app, k, "/v1/markets?tags=crypto,politics&tags_match=all").await;
    assert_eq!(ids(&b).len(), 0, "all: AND");
    let (_, _, b) = get_as(
        app,
        k,
        "/v1/markets?tags=politics,us&tags_match=all&limit=100",
    )
    .await;
    assert_eq!(ids(&b).len(), 6);
    let (_, _, b) = get_as(app, k, "/v1/series?search=CRYPTO").await;
    assert_eq!(ids(&b), ["s-cry"]);
    let (_, _, b) = get_as(app, k, "/v1/events?series_slug=politics-series").await;
    assert_eq!(ids(&b), ["e-elec"]);
    let (_, _, b) = get_as(app, k, "/v1/events?series_id=s-cry").await;
    assert_eq!(ids(&b), ["e-btc"]);
    let (_, _, b) = get_as(app, k, "/v1/tags").await;
    assert_eq!(
        b,
        serde_json::json!({"count": 3, "data": ["crypto", "politics", "us"]})
    );
    let (_, _, b) = get_as(app, k, "/v1/markets/market-03").await;
    assert_eq!(
        (b["id"].as_str(), b["tokens"][1]["label"].as_str()),
        (Some("mk03"), Some("No"))
    );

    // Page through the original markets while new ones arrive and an old
    // one is updated: every original market appears exactly once.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    let mut round = 0;
    loop {
        let (st, _, b) = get_as(
            app,
            k,
            &format!("/v1/markets?sort=created_at&order=asc&limit=4{cursor}"),
        )
        .await;
        assert_eq!(st, 200, "{b}");
        seen.extend(ids(&b));
        round += 1;
        if round == 1 {
            let new = (0..3)
                .map(|i| format!(r#"{{"kind":"market","id":"new{i}","slug":"new-{i}","status":"open","tokens":[{{"id":"new{i}-y","label":"Yes"}}],"created_at":"2025-09-0{}T00:00:00Z"}}"#, i + 1))
                .chain([r#"{"kind":"market","id":"mk11","slug":"market-11","status":"closed","question":"q","tokens":[{"id":"mk11-y","label":"Yes"},{"id":"mk11-n","label":"No"}],"created_at":"2025-08-01T00:00:00Z","updated_at":"2025-10-01T00:00:00Z"}"#.to_string()])
                .collect::<Vec<_>>()
                .join("\n");
            ingest(app, new).await;
            wait_for(app, "/v1/markets?limit=1000", |b| {
                b["data"].as_array().is_some_and(|d| d.len() == 16)
            })
            .await;
        }
        match b["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    for i in 0..12 {
        assert_eq!(
            seen.iter().filter(|id| **id == format!("mk{i:02}")).count(),
            1,
            "mk{i:02} in {seen:?}"
        );
    }
    assert!(
        seen.contains(&"new2".to_string()),
        "later-created markets appear at the end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_is_500_failed_to_fetch_data_without_internals() {
    let s = seeded("store-failure").await;
    let app = &s.app;
    let conn = rusqlite::Connection::open(app.data_dir.join("store.db")).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    conn.execute_batch("ALTER TABLE price_heads RENAME TO price_heads_moved")
        .unwrap();
    let (st, h, b) = get_as(app, Some(API_KEY), &hist("/v1/tokens/mk00-y/prices", "")).await;
    assert_eq!(st, 500);
    assert_eq!(b, serde_json::json!({"detail": "failed to fetch data"}));
    assert!(h.contains_key("x-request-id"));
    conn.execute_batch("ALTER TABLE price_heads_moved RENAME TO price_heads")
        .unwrap();
}
