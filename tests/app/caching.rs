//! Caching history (docs/DESIGN.md, "Caching history"): a strong `ETag`
//! from the page's bytes, `304` on `If-None-Match`, a long `Cache-Control`
//! only once the projector has passed the page, `Vary` on the key, and
//! `no-store` everywhere else a key is sent. (A `304` is metered:
//! `rate_limits.rs`.)

use crate::helpers::*;
use hindsight_api::page::{CLOSED, OPEN};
use reqwest::header::HeaderMap;
use serde_json::Value;

const DAY: i64 = 1_756_684_800; // 2025-09-01

/// A GET with the test key and, if given, `If-None-Match`.
async fn fetch(
    app: &TestApp,
    path: &str,
    if_none_match: Option<&str>,
) -> (u16, HeaderMap, Vec<u8>) {
    let mut req = client().get(app.api_url(path)).header("X-API-Key", API_KEY);
    if let Some(tags) = if_none_match {
        req = req.header("If-None-Match", tags);
    }
    let r = req.send().await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.bytes().await.unwrap().to_vec())
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .unwrap_or_else(|| panic!("no {name} in {h:?}"))
        .to_str()
        .unwrap()
}

fn prices(start: i64, end: i64, extra: &str) -> String {
    format!("/v1/tokens/m1-yes/prices?start_ts={start}&end_ts={end}&resolution=1m{extra}")
}

/// Polls `path` until its `ETag` is no longer `old`; the new answer.
async fn changed(app: &TestApp, path: &str, old: &str) -> (HeaderMap, Value) {
    for _ in 0..2000 {
        let (status, h, body) = fetch(app, path, None).await;
        assert_eq!(status, 200);
        if header(&h, "etag") != old {
            return (h, serde_json::from_slice(&body).unwrap());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the ETag of {path} never changed from {old}");
}

async fn seeded(name: &str) -> TestApp {
    let app = spawn_app(name).await;
    let mut lines = vec![market_line("m1")];
    for k in 0..5 {
        lines.push(price_line("m1", "m1-yes", DAY + k * 60, 0.5));
    }
    lines.push(format!(r#"{{"kind":"book","market_id":"m1","token_id":"m1-yes","ts":{DAY},"bids":[[0.4,1]],"asks":[[0.6,1]]}}"#));
    lines.push(format!(
        r#"{{"kind":"metrics","market_id":"m1","ts":{DAY},"volume":10,"liquidity":5,"spread":0.1}}"#
    ));
    let (status, body) = ingest(&app, lines.join("\n")).await;
    assert_eq!(
        (status, &body["rejected_count"]),
        (200, &Value::from(0)),
        "{body}"
    );
    wait_for(&app, &prices(DAY, DAY + 3600, ""), |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 5)
    })
    .await;
    wait_for(
        &app,
        &format!(
            "/v1/markets/m1/metrics?start_ts={DAY}&end_ts={}&resolution=1m",
            DAY + 60
        ),
        |b| b["data"].as_array().is_some_and(|d| d.len() == 1),
    )
    .await;
    app
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etag_follows_the_page_content_and_a_match_is_304_without_a_body() {
    let app = seeded("etag-content").await;
    let page = prices(DAY, DAY + 3600, "");
    let (status, h, body) = fetch(&app, &page, None).await;
    assert_eq!(status, 200);
    let etag = header(&h, "etag").to_string();
    assert!(
        etag.starts_with('"') && etag.ends_with('"') && !etag.starts_with("W/"),
        "a strong tag: {etag}"
    );
    let (_, again, same_body) = fetch(&app, &page, None).await;
    assert_eq!(
        (header(&again, "etag"), &same_body),
        (etag.as_str(), &body),
        "identical requests, identical tag and bytes"
    );

    // A match, however it is written, is a 304 with the validators and no body.
    for tags in [
        etag.clone(),
        format!("W/{etag}"),
        format!("\"other\", {etag}"),
        "*".to_string(),
    ] {
        let (status, h, body) = fetch(&app, &page, Some(&tags)).await;
        assert_eq!(status, 304, "{tags}");
        assert!(body.is_empty(), "{tags}");
        assert_eq!(header(&h, "etag"), etag);
        assert_eq!(header(&h, "cache-control"), OPEN);
        assert_eq!(header(&h, "vary"), "X-API-Key");
        assert!(h.get("content-type").is_none(), "{h:?}");
    }
    // No match: the whole page.
    let (status, h, other) = fetch(&app, &page, Some("\"other\", W/\"nope\"")).await;
    assert_eq!(
        (status, header(&h, "etag"), &other),
        (200, etag.as_str(), &body)
    );

    // A tick folded into a bucket of the page (even a late one) changes it.
    let (status, _) = ingest(&app, price_line("m1", "m1-yes", DAY + 30, 0.7)).await;
    assert_eq!(status, 200);
    let (h, late) = changed(&app, &page, &etag).await;
    let p = late["data"][0]["p"].as_f64().unwrap();
    assert!((p - 0.6).abs() < 1e-9, "0.5 and 0.7 averaged: {p}");
    let (status, _, body) = fetch(&app, &page, Some(&etag)).await;
    assert_eq!(status, 200, "the old tag no longer matches");
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), late);
    let etag = header(&h, "etag").to_string();

    // So does a new bucket landing in the range.
    let (status, _) = ingest(&app, price_line("m1", "m1-yes", DAY + 600, 0.9)).await;
    assert_eq!(status, 200);
    let (_, grown) = changed(&app, &page, &etag).await;
    assert_eq!(grown["data"].as_array().unwrap().len(), 6);

    // Errors are never 304, whatever the request holds.
    let missing = format!("/v1/tokens/nope/prices?start_ts={DAY}&end_ts={DAY}&resolution=1m");
    let (status, h, _) = fetch(&app, &missing, Some("*")).await;
    assert_eq!((status, header(&h, "cache-control")), (404, "no-store"));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_is_cached_long_only_once_the_projector_has_passed_it() {
    let app = seeded("etag-closed").await;
    // Ticks at minutes 0..4. A range ending at minute 2 has later buckets:
    // closed. One ending at minute 60 has none yet: open.
    let closed = prices(DAY, DAY + 120, "");
    let open = prices(DAY, DAY + 3600, "");
    let (_, h, _) = fetch(&app, &closed, None).await;
    assert_eq!(header(&h, "cache-control"), CLOSED);
    let (_, h, _) = fetch(&app, &open, None).await;
    assert_eq!(header(&h, "cache-control"), OPEN);
    let open_tag = header(&h, "etag").to_string();
    // A page followed by another one is closed: the next page's first
    // bucket is the later bucket.
    let (_, h, b) = fetch(&app, &prices(DAY, DAY + 3600, "&limit=2"), None).await;
    let b: Value = serde_json::from_slice(&b).unwrap();
    assert!(b["metadata"]["next_cursor"].is_string());
    assert_eq!(header(&h, "cache-control"), CLOSED);

    // A tick after the open range closes it, and leaves its content (and
    // so its tag) as it was.
    let (status, _) = ingest(&app, price_line("m1", "m1-yes", DAY + 7200, 0.5)).await;
    assert_eq!(status, 200);
    wait_for(&app, &prices(DAY + 3600, DAY + 7260, ""), |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    let (_, h, _) = fetch(&app, &open, None).await;
    assert_eq!(
        (header(&h, "cache-control"), header(&h, "etag")),
        (CLOSED, open_tag.as_str())
    );

    // Every history route: validators, the policy, and 304 on a match.
    // m1-no has no bucket at all, but shares m1's log partition with
    // m1-yes, whose later buckets close the market-level page.
    let q = format!("?start_ts={DAY}&end_ts={}&resolution=1m", DAY + 120);
    for path in [
        format!("/v1/tokens/m1-yes/prices{q}"),
        format!("/v1/tokens/m1-yes/books{q}"),
        format!("/v1/markets/m1/prices{q}"),
        format!("/v1/markets/m1-slug/books{q}"),
        format!("/v1/markets/m1/metrics{q}"),
    ] {
        let (status, h, body) = fetch(&app, &path, None).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(header(&h, "content-type"), "application/json", "{path}");
        assert_eq!(header(&h, "vary"), "X-API-Key", "{path}");
        let expected = if path.contains("books") || path.contains("metrics") {
            // One book and one metrics sample, at minute 0, nothing later.
            OPEN
        } else {
            CLOSED
        };
        assert_eq!(header(&h, "cache-control"), expected, "{path}");
        let etag = header(&h, "etag").to_string();
        let (status, h304, none) = fetch(&app, &path, Some(&etag)).await;
        assert_eq!((status, none.len()), (304, 0), "{path}");
        assert_eq!(header(&h304, "etag"), etag, "{path}");
        assert_eq!(header(&h304, "cache-control"), expected, "{path}");
        serde_json::from_slice::<Value>(&body).unwrap();
    }

    // Key-bearing answers that are not history pages stay out of caches.
    for path in ["/v1/usage", "/v1/markets?limit=5", "/v1/markets/m1"] {
        let (status, h, _) = fetch(&app, path, None).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(header(&h, "cache-control"), "no-store", "{path}");
        assert!(h.get("etag").is_none(), "{path}");
    }
    app.stop().await;
}

/// The API's caches (`hindsight_api::cache`): a page asked again while the
/// store is unchanged is the kept one, byte for byte, counted as a hit (and
/// so are its key and its token); a write to the store (a late tick into
/// the page) empties it, and the next answer is the new content. (A key revoked or moved to
/// another plan by another process takes effect at once: `api_contract`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_store_serves_the_kept_page_and_a_write_replaces_it() {
    let app = seeded("page-cache").await;
    let hits = r#"hindsight_api_cache_total{cache="pages",result="hit"}"#;
    let key_hits = r#"hindsight_api_cache_total{cache="keys",result="hit"}"#;
    let token_hits = r#"hindsight_api_cache_total{cache="tokens",result="hit"}"#;
    let page = prices(DAY, DAY + 3600, "&limit=3");
    let (status, h, first) = fetch(&app, &page, None).await;
    assert_eq!(status, 200);
    let etag = header(&h, "etag").to_string();
    let before = metric_value(&app.ops, hits).await;
    let keys_before = metric_value(&app.ops, key_hits).await;
    let tokens_before = metric_value(&app.ops, token_hits).await;
    // Other pages of the token (each starting a second earlier) miss the
    // page cache, not the token's (five, as a usage flush may write between).
    for back in 1..=5 {
        let other = prices(DAY - back, DAY + 3600, "&limit=3");
        assert_eq!(fetch(&app, &other, None).await.0, 200);
    }
    assert!(
        metric_value(&app.ops, token_hits).await > tokens_before,
        "the token was read from the store for each page"
    );
    for _ in 0..5 {
        let (status, h, body) = fetch(&app, &page, None).await;
        assert_eq!(
            (status, header(&h, "etag"), &body),
            (200, etag.as_str(), &first)
        );
    }
    let after = metric_value(&app.ops, hits).await;
    assert!(
        after > before,
        "no page served from the cache: {before} → {after}"
    );
    let keys_after = metric_value(&app.ops, key_hits).await;
    assert!(
        keys_after > keys_before,
        "the key was read from the store every time: {keys_before} → {keys_after}"
    );

    let (status, _) = ingest(&app, price_line("m1", "m1-yes", DAY + 90, 0.9)).await;
    assert_eq!(status, 200);
    let (_, late) = changed(&app, &page, &etag).await;
    let p = late["data"][1]["p"].as_f64().unwrap();
    assert!(
        (p - 0.7).abs() < 1e-9,
        "0.5 and 0.9 averaged in minute 1: {p}"
    );
    app.stop().await;
}
