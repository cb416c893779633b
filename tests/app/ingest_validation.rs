//! Bad input is refused loudly: each bad line with its number and reason,
//! the valid lines beside it kept, nothing invalid in the log.

use crate::helpers::*;

const DAY: i64 = 1_756_684_800;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_line_is_refused_with_its_number_and_reason_and_neighbours_kept() {
    let app = spawn_app("validation").await;
    let good = |t: i64| price_line("v1", "v1-yes", DAY + t, 0.5);
    let long_id = "x".repeat(201);
    let lines = [
        market_line("v1"),                                                                   // 1 ok
        good(1),                                                                             // 2 ok
        r#"{"kind":"price","market_id":"v1","token_id":"v1-yes","ts":1756684800,"p":0.5"#.into(), // 3 malformed
        r#"{"kind":"quote","market_id":"v1"}"#.into(),                                       // 4 unknown kind
        price_line("v1", "v1-yes", DAY + 2, 1.5),                                            // 5 p out of range
        r#"{"kind":"price","market_id":"v1","token_id":"v1-yes","ts":1756684800,"p":NaN}"#.into(), // 6 NaN
        r#"{"kind":"price","market_id":"","token_id":"v1-yes","ts":1756684800,"p":0.5}"#.into(),   // 7 empty id
        format!(r#"{{"kind":"price","market_id":"v1","token_id":"{long_id}","ts":1756684800,"p":0.5}}"#), // 8 201 chars
        r#"{"kind":"book","market_id":"v1","token_id":"v1-yes","ts":1756684800,"bids":[[0.40,1],[0.45,1]],"asks":[[0.5,1]]}"#.into(), // 9 not best first
        r#"{"kind":"price","market_id":"v1","token_id":"v1-yes","ts":"next tuesday","p":0.5}"#.into(), // 10 bad ts
        String::new(),                                                                       // 11 blank: skipped
        good(3),                                                                             // 12 ok
    ];
    let (status, body) = ingest(&app, lines.join("\n")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["accepted"], 3);
    assert_eq!(body["rejected_count"], 8);
    let rejected: Vec<(u64, String)> = body["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["line"].as_u64().unwrap(),
                r["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: [(u64, &str); 8] = [
        (3, "malformed JSON"),
        (4, "unknown kind `quote`"),
        (5, "field `p`: 1.5 is not a probability in [0, 1]"),
        (6, "malformed JSON"),
        (7, "field `market_id` is empty"),
        (
            8,
            "field `token_id` is 201 characters long; at most 200 are allowed",
        ),
        (9, "field `bids` is not best first"),
        (10, "field `ts`"),
    ];
    for ((line, reason), (want_line, want_text)) in rejected.iter().zip(want) {
        assert_eq!(*line, want_line, "{reason}");
        assert!(
            reason.contains(want_text),
            "line {line}: {reason:?} should mention {want_text:?}"
        );
    }
    // The valid neighbours reached the read tables: two ticks of 0.5.
    let path = format!(
        "/v1/tokens/v1-yes/prices?start_ts={DAY}&end_ts={}&resolution=1m",
        DAY + 60
    );
    let b = wait_for(&app, &path, |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    assert_eq!(b["data"][0]["p"], 0.5);

    // Nothing invalid entered the log: exactly the 3 accepted events.
    let log = rusqlite::Connection::open(app.data_dir.join("log.db")).unwrap();
    let n: i64 = log
        .query_row("SELECT COALESCE(SUM(count), 0) FROM log_batches", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_only_bad_lines_is_422_and_appends_nothing() {
    let app = spawn_app("all-bad").await;
    let (status, body) = ingest(&app, "{oops\n{\"kind\":\"nope\"}\n".into()).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["accepted"], 0);
    assert_eq!(body["rejected"][1]["line"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_is_401_and_oversized_body_is_413() {
    let app = spawn_app_with(
        "limits",
        Options {
            max_body_bytes: 1024,
            ..Options::default()
        },
    )
    .await;
    let body = price_line("v1", "v1-yes", DAY, 0.5);
    for auth in [None, Some("Bearer wrong-token"), Some(INGEST_TOKEN)] {
        let mut req = client()
            .post(app.ingest_url("/ingest/v1/events"))
            .body(body.clone());
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let r = req.send().await.unwrap();
        // The bare token without "Bearer " is refused too.
        assert_eq!(r.status(), 401, "{auth:?}");
        let detail: serde_json::Value = r.json().await.unwrap();
        assert!(detail["detail"].as_str().unwrap().contains("ingest token"));
    }
    let big = format!("{body}\n").repeat(40);
    let r = client()
        .post(app.ingest_url("/ingest/v1/events"))
        .bearer_auth(INGEST_TOKEN)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // A gzip body that expands past the limit is refused the same way.
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![b'\n'; 100_000]).unwrap();
    let r = client()
        .post(app.ingest_url("/ingest/v1/events"))
        .bearer_auth(INGEST_TOKEN)
        .header("Content-Encoding", "gzip")
        .body(gz.finish().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
}

/// One market per token and per slug, at ingest: a line the catalog already
/// contradicts is refused with its line, field and the market holding what
/// it claims — a tick under another market than its token's
/// (`market_mismatch`), a market listing another market's token
/// (`token_claimed`) or taking its slug (`slug_taken`) — whether the read
/// store holds that market or a line before in the same batch listed it.
/// The lines beside them are kept, and the refused tick never reaches the
/// other market's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_the_catalog_contradicts_are_refused_naming_field_and_holder() {
    let app = spawn_app("catalog-rejects").await;
    let (status, body) = ingest(&app, market_line("c1")).await;
    assert_eq!(status, 200, "{body}");
    wait_for(&app, "/v1/markets/c1", |b| b["id"] == "c1").await;
    let market = market_line_with;
    let lines = [
        price_line("c9", "c1-yes", DAY, 0.9), // 1 c1's token under c9
        price_line("c1", "c1-yes", DAY, 0.5), // 2 ok
        market("c2", "c2-slug", &["c2-yes", "c1-no"]), // 3 c1's token
        market("c3", "c1-slug", &["c3-yes"]), // 4 c1's slug
        market_line("c4"),                    // 5 ok
        price_line("c5", "c4-yes", DAY, 0.9), // 6 line 5's token
        market("c6", "c4-slug", &["c6-yes"]), // 7 line 5's slug
        market("c7", "c7-slug", &["c4-no"]),  // 8 line 5's token
        price_line("c4", "c4-yes", DAY, 0.25), // 9 ok
    ];
    let (status, body) = ingest(&app, lines.join("\n")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["accepted"].as_u64(), body["rejected_count"].as_u64()),
        (Some(3), Some(6)),
        "{body}"
    );
    let rejected: Vec<(u64, &str)> = body["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["line"].as_u64().unwrap(), r["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rejected,
        [
            (1, "field `market_id`: token `c1-yes` is listed under market `c1` in the catalog, not `c9`"),
            (3, "field `tokens[1].id`: token `c1-no` is already listed under market `c1` (a token belongs to the first market that lists it)"),
            (4, "field `slug`: `c1-slug` is already the slug of market `c1`"),
            (6, "field `market_id`: token `c4-yes` is listed under market `c4` in the catalog, not `c5`"),
            (7, "field `slug`: `c4-slug` is already the slug of market `c4`"),
            (8, "field `tokens[0].id`: token `c4-no` is already listed under market `c4` (a token belongs to the first market that lists it)"),
        ]
    );
    // Each refused under its reason on /metrics (the registry is the
    // process's: other tests may have added to it).
    let metrics = metrics_text(&app.ops).await;
    for (reason, at_least) in [
        ("market_mismatch", 2),
        ("token_claimed", 2),
        ("slug_taken", 2),
    ] {
        let series = format!("hindsight_ingest_events_rejected_total{{reason=\"{reason}\"}} ");
        let n: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series}"))
            .parse()
            .unwrap();
        assert!(n >= at_least as f64, "{series}{n}");
    }
    // c1-yes's history holds c1's tick only; c4's market and tick landed.
    let path = |token: &str| {
        format!(
            "/v1/tokens/{token}/prices?start_ts={DAY}&end_ts={}&resolution=1m",
            DAY + 60
        )
    };
    let b = wait_for(&app, &path("c4-yes"), |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    assert_eq!(b["data"][0]["p"], 0.25);
    let (status, b) = get(&app, &path("c1-yes")).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["data"][0]["p"], 0.5, "{b}");
    let (status, _) = get(&app, "/v1/markets/c2").await;
    assert_eq!(status, 404, "the refused market c2 is not in the catalog");
    let (_, b) = get(&app, "/v1/markets/c1-slug").await;
    assert_eq!(b["id"], "c1");
}
