//! Candles over HTTP: ticks ingested out of time order and with ties on
//! `ts` come back as the candles computed here from the raw input (open =
//! earliest tick, close = latest, ties going by log position), exactly,
//! through token and market pages followed by cursor, and byte for byte
//! the same after `rebuild` replays the log into emptied tables.

use crate::helpers::*;
use hindsight::backends::{BackendConfig, Backends};
use hindsight_projector::{Projector, ProjectorConfig};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// 2025-09-01T00:00:00Z, in milliseconds.
const T0: i64 = 1_756_684_800_000;

/// One tick as sent: token, time (ms) and probability. Its place in the
/// list is its place in the log.
type Tick = (&'static str, i64, f64);

/// Ticks of two tokens over ~3 hours, several per minute, out of time
/// order in places, with runs of ticks sharing a `ts` (the first and last
/// of a bucket among them).
fn ticks() -> Vec<Tick> {
    let mut out = Vec::new();
    let mut x: u64 = 7;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    for i in 0..400_i64 {
        let token = if next() % 3 == 0 { "cdl-no" } else { "cdl-yes" };
        // Mostly forward in time, sometimes back by up to 40 minutes.
        let back = if next() % 7 == 0 {
            (next() % 2_400_000) as i64
        } else {
            0
        };
        let ts = (T0 + i * 27_000 - back).max(T0);
        let p = (next() % 10_001) as f64 / 10_000.0;
        out.push((token, ts, p));
        // Ties: the same instant again, with another price.
        if next() % 5 == 0 {
            out.push((token, ts, (next() % 10_001) as f64 / 10_000.0));
        }
    }
    // A bucket's first and last instants, each taken by two ticks.
    for ms in [
        T0 + 3_600_000,
        T0 + 3_600_000,
        T0 + 3_659_999,
        T0 + 3_659_999,
    ] {
        out.push(("cdl-yes", ms, (next() % 10_001) as f64 / 10_000.0));
    }
    out
}

/// A candle computed from the raw ticks: `(o, h, l, c, n)`.
type Expected = BTreeMap<i64, (f64, f64, f64, f64, u64)>;

fn expected(ticks: &[Tick], token: &str, width_ms: i64) -> Expected {
    let mut buckets: BTreeMap<i64, Vec<(i64, usize, f64)>> = BTreeMap::new();
    for (pos, (t, ts, p)) in ticks.iter().enumerate() {
        if *t == token {
            buckets
                .entry(ts.div_euclid(width_ms) * width_ms)
                .or_default()
                .push((*ts, pos, *p));
        }
    }
    buckets
        .into_iter()
        .map(|(b, mut ticks)| {
            // Time order, ties by log position.
            ticks.sort_by_key(|&(ts, pos, _)| (ts, pos));
            let prices: Vec<f64> = ticks.iter().map(|t| t.2).collect();
            let h = prices.iter().copied().fold(f64::MIN, f64::max);
            let l = prices.iter().copied().fold(f64::MAX, f64::min);
            let (o, c) = (ticks[0].2, ticks[ticks.len() - 1].2);
            (b, (o, h, l, c, ticks.len() as u64))
        })
        .collect()
}

/// `2025-09-01T00:00:00.000Z` of Unix milliseconds, as the API writes it.
fn iso_ms(ms: i64) -> String {
    hindsight_schemas::Timestamp(ms).to_rfc3339()
}

fn candle(point: &Value) -> (f64, f64, f64, f64, u64) {
    let f = |k: &str| {
        point[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} in {point}"))
    };
    (f("o"), f("h"), f("l"), f("c"), point["n"].as_u64().unwrap())
}

/// Every page of `route` (token or market), following `next_cursor`:
/// the candles per token label (`""` on the token route), and the bodies.
async fn all_pages(
    app: &TestApp,
    route: &str,
    res: &str,
    limit: usize,
) -> (BTreeMap<String, Expected>, Vec<String>) {
    let (start, end) = (iso_ms(T0 - 3_600_000), iso_ms(T0 + 6 * 3_600_000));
    let mut out: BTreeMap<String, Expected> = BTreeMap::new();
    let mut bodies = Vec::new();
    let mut cursor = String::new();
    loop {
        let path =
            format!("{route}?start_ts={start}&end_ts={end}&resolution={res}&limit={limit}{cursor}");
        let (status, _, body) = get_as(app, Some(API_KEY), &path).await;
        assert_eq!(status, 200, "{path}: {body}");
        let series: Vec<(String, Value)> = match &body["data"] {
            Value::Array(_) => vec![(String::new(), body["data"].clone())],
            Value::Object(by_label) => by_label
                .iter()
                .map(|(label, points)| (label.clone(), points.clone()))
                .collect(),
            other => panic!("data: {other}"),
        };
        for (label, points) in series {
            for point in points.as_array().unwrap() {
                let t = point["t"].as_str().unwrap().to_string();
                let ms = hindsight_schemas::Timestamp::parse(&t).unwrap().0;
                let fresh = out
                    .entry(label.clone())
                    .or_default()
                    .insert(ms, candle(point));
                assert!(fresh.is_none(), "{t} served twice");
            }
        }
        bodies.push(body.to_string());
        match body["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return (out, bodies),
        }
    }
}

fn market_line() -> String {
    json!({"kind": "market", "id": "cdl-m", "slug": "candles-market", "event_id": null,
        "question": "Candles?", "description": null, "status": "open", "start_date": null,
        "end_date": null, "closed_at": null, "resolved_token_id": null, "resolved_token_label": null,
        "tokens": [{"id": "cdl-yes", "label": "Yes"}, {"id": "cdl-no", "label": "No"}],
        "created_at": "2025-08-01T00:00:00Z", "updated_at": "2025-08-01T00:00:00Z"})
    .to_string()
}

/// What every check reads: token candles at 1m (short pages) and 1h, and
/// the market's candles at 1m.
async fn read_everything(app: &TestApp) -> Vec<(BTreeMap<String, Expected>, Vec<String>)> {
    vec![
        all_pages(app, "/v1/tokens/cdl-yes/candles", "1m", 37).await,
        all_pages(app, "/v1/tokens/cdl-no/candles", "1h", 2).await,
        all_pages(app, "/v1/markets/candles-market/candles", "1m", 50).await,
    ]
}

fn check_against_raw(ticks: &[Tick], read: &[(BTreeMap<String, Expected>, Vec<String>)]) {
    let yes_1m = expected(ticks, "cdl-yes", 60_000);
    let no_1m = expected(ticks, "cdl-no", 60_000);
    let no_1h = expected(ticks, "cdl-no", 3_600_000);
    assert!(
        yes_1m.len() > 100 && no_1h.len() >= 3,
        "the data spans many buckets"
    );
    assert_eq!(read[0].0[""], yes_1m, "token candles at 1m");
    assert_eq!(read[1].0[""], no_1h, "token candles at 1h");
    assert_eq!(read[2].0["Yes"], yes_1m, "market candles of Yes at 1m");
    assert_eq!(read[2].0["No"], no_1m, "market candles of No at 1m");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candles_are_the_raw_ticks_ohlc_with_ties_by_log_position_and_survive_rebuild() {
    let app = spawn_app("candles").await;
    let ticks = ticks();
    let (status, body) = ingest(&app, market_line()).await;
    assert_eq!(status, 200, "{body}");
    // In several batches: log order is the order of the list.
    for chunk in ticks.chunks(61) {
        let lines: Vec<String> = chunk
            .iter()
            .map(|(token, ms, p)| {
                json!({"kind": "price", "market_id": "cdl-m", "token_id": token,
                    "ts": iso_ms(*ms), "p": p})
                .to_string()
            })
            .collect();
        let (status, body) = ingest(&app, lines.join("\n")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["accepted"], chunk.len(), "{body}");
    }
    // Everything projected: the day's candle counts every tick of the token.
    let yes_total = ticks.iter().filter(|t| t.0 == "cdl-yes").count() as u64;
    let day = format!(
        "/v1/tokens/cdl-yes/candles?start_ts={}&end_ts={}&resolution=1d",
        iso_ms(T0),
        iso_ms(T0 + 86_400_000)
    );
    wait_for(&app, &day, |b| {
        b["data"][0]["n"].as_u64() == Some(yes_total)
    })
    .await;

    let before = read_everything(&app).await;
    check_against_raw(&ticks, &before);
    // Prices are untouched by candles: the same buckets, averaged.
    let (status, prices) = get(
        &app,
        &format!(
            "/v1/tokens/cdl-no/prices?start_ts={}&end_ts={}&resolution=1h",
            iso_ms(T0),
            iso_ms(T0 + 6 * 3_600_000)
        ),
    )
    .await;
    assert_eq!(status, 200);
    let hours: Vec<&str> = prices["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["t"].as_str().unwrap())
        .collect();
    assert_eq!(hours.len(), expected(&ticks, "cdl-no", 3_600_000).len());

    // `hindsight rebuild`: drop the read tables, replay the whole log.
    let dir = app.data_dir.clone();
    app.stop().await;
    {
        let backends = Backends::connect(&BackendConfig::embedded(&dir))
            .await
            .unwrap();
        let mut projector = Projector::new(
            backends.source().unwrap(),
            backends.store().unwrap(),
            ProjectorConfig::rebuild(),
        );
        projector.reset_store().await.unwrap();
        let replayed = projector.catch_up().await.unwrap();
        assert_eq!(replayed, ticks.len() as u64 + 1, "every event replayed");
    }
    let app = spawn_app_in(&dir, Options::default()).await;
    let after = read_everything(&app).await;
    check_against_raw(&ticks, &after);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(b.1, a.1, "pages byte for byte the same after rebuild");
    }
}

#[tokio::test]
async fn candles_are_plan_gated_as_prices_and_counted_by_the_rate_limit() {
    let dir = temp_dir("candles_plans");
    let plans = dir.join("plans.json");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        &plans,
        r#"{"no_prices": {"requests_per_minute": 100, "granularity_allowed": "1m", "max_history_days": 3650,
                          "metrics": true, "prices": false, "books": true},
            "two_a_minute": {"requests_per_minute": 2, "granularity_allowed": "1m", "max_history_days": 3650,
                             "metrics": true, "prices": true, "books": true}}"#,
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
    wait_for(&app, "/v1/markets/cdl-m", |b| b["id"] == "cdl-m").await;
    let range = format!(
        "start_ts={}&end_ts={}&resolution=1m",
        iso_ms(T0),
        iso_ms(T0 + 60_000)
    );
    let token = format!("/v1/tokens/cdl-yes/candles?{range}");
    let market = format!("/v1/markets/cdl-m/candles?{range}");
    let no_prices = app.key("no_prices").await;
    for path in [&token, &market] {
        let (status, _, body) = get_as(&app, Some(&no_prices), path).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(
            body["detail"], "Your plan does not allow historical prices.",
            "{body}"
        );
    }
    let two = app.key("two_a_minute").await;
    let (status, headers, body) = get_as(&app, Some(&two), &token).await;
    assert_eq!((status, &body["data"]), (200, &json!([])), "{body}");
    assert!(
        headers.contains_key("etag"),
        "a history page with its validator"
    );
    let (status, _, body) = get_as(&app, Some(&two), &market).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"], json!({"Yes": [], "No": []}));
    let (status, _, _) = get_as(&app, Some(&two), &token).await;
    assert_eq!(status, 429, "the third request of a two-a-minute plan");
    let (status, _, _) = get_as(&app, None, &token).await;
    assert_eq!(status, 401);
}

/// Every page of a token's `kind` (prices or candles) with `fill`,
/// following cursors: `(bucket ms, value, filled)` per point, the value
/// being `p` or the candle `(o, h, l, c, n)` as text.
async fn filled_pages(
    app: &TestApp,
    route: &str,
    fill: &str,
    limit: usize,
) -> Vec<(i64, String, bool)> {
    let (start, end) = (iso_ms(T0 - 120_000), iso_ms(T0 + 20 * 60_000));
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!(
            "{route}?start_ts={start}&end_ts={end}&resolution=1m&limit={limit}&fill={fill}{cursor}"
        );
        let (status, _, body) = get_as(app, Some(API_KEY), &path).await;
        assert_eq!(status, 200, "{path}: {body}");
        for point in body["data"].as_array().unwrap() {
            let ms = hindsight_schemas::Timestamp::parse(point["t"].as_str().unwrap())
                .unwrap()
                .0;
            let value = match point.get("p") {
                Some(p) => p.to_string(),
                None => format!("{:?}", candle(point)),
            };
            let filled = match point.get("filled") {
                None => false,
                Some(Value::Bool(true)) => true,
                Some(other) => panic!("filled: {other}"),
            };
            out.push((ms, value, filled));
        }
        match body["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_previous_carries_the_last_value_into_empty_buckets_until_the_market_closed() {
    let app = spawn_app("candles_fill").await;
    let closed_at = T0 + 12 * 60_000;
    let mut market: Value = serde_json::from_str(&market_line()).unwrap();
    market["closed_at"] = json!(iso_ms(closed_at));
    let (status, body) = ingest(&app, market.to_string()).await;
    assert_eq!(status, 200, "{body}");
    // Minutes 0, 1, 5, 9 and (after closing) 15 hold ticks; two in minute 5.
    let ticks: Vec<Tick> = vec![
        ("cdl-yes", T0 + 5_000, 0.5),
        ("cdl-yes", T0 + 61_000, 0.25),
        ("cdl-yes", T0 + 5 * 60_000 + 30_000, 0.75),
        ("cdl-yes", T0 + 5 * 60_000 + 1_000, 0.125),
        ("cdl-yes", T0 + 9 * 60_000, 0.375),
        ("cdl-yes", T0 + 15 * 60_000, 0.625),
        ("cdl-no", T0 + 7 * 60_000, 0.5),
    ];
    let lines: Vec<String> = ticks
        .iter()
        .map(|(token, ms, p)| {
            json!({"kind": "price", "market_id": "cdl-m", "token_id": token, "ts": iso_ms(*ms), "p": p})
                .to_string()
        })
        .collect();
    let (status, body) = ingest(&app, lines.join("\n")).await;
    assert_eq!(status, 200, "{body}");
    let day = format!(
        "/v1/tokens/cdl-yes/candles?start_ts={}&end_ts={}&resolution=1d",
        iso_ms(T0),
        iso_ms(T0 + 86_400_000)
    );
    wait_for(&app, &day, |b| b["data"][0]["n"].as_u64() == Some(6)).await;

    // Expected, from the raw ticks: every bucket of the grid from the
    // range start, stored if it has ticks, else the last stored value if
    // there is one and the market had not closed.
    let expect = |token: &str, candles: bool| {
        let stored = expected(&ticks, token, 60_000);
        let mut out = Vec::new();
        let mut last: Option<(f64, f64, f64, f64, u64, f64)> = None;
        for minute in -2..20_i64 {
            let b = T0 + minute * 60_000;
            if let Some(&(o, h, l, c, n)) = stored.get(&b) {
                let ps: Vec<f64> = ticks
                    .iter()
                    .filter(|t| t.0 == token && t.1.div_euclid(60_000) * 60_000 == b)
                    .map(|t| t.2)
                    .collect();
                let avg = ps.iter().sum::<f64>() / ps.len() as f64;
                let value = if candles {
                    format!("{:?}", (o, h, l, c, n))
                } else {
                    json!(avg).to_string()
                };
                out.push((b, value, false));
                last = Some((o, h, l, c, n, avg));
            } else if let Some((_, _, _, c, _, avg)) = last.filter(|_| b < closed_at) {
                let value = if candles {
                    format!("{:?}", (c, c, c, c, 0_u64))
                } else {
                    json!(avg).to_string()
                };
                out.push((b, value, true));
            }
        }
        out
    };
    for limit in [3, 200] {
        assert_eq!(
            filled_pages(&app, "/v1/tokens/cdl-yes/prices", "previous", limit).await,
            expect("cdl-yes", false),
            "prices, pages of {limit}"
        );
        assert_eq!(
            filled_pages(&app, "/v1/tokens/cdl-yes/candles", "previous", limit).await,
            expect("cdl-yes", true),
            "candles, pages of {limit}"
        );
    }
    // Market pages: each token filled on its own.
    let (status, _, body) = get_as(
        &app,
        Some(API_KEY),
        &format!(
            "/v1/markets/cdl-m/candles?start_ts={}&end_ts={}&resolution=1m&fill=previous&limit=200",
            iso_ms(T0 - 120_000),
            iso_ms(T0 + 20 * 60_000)
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let no: Vec<(i64, bool)> = body["data"]["No"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ms = hindsight_schemas::Timestamp::parse(p["t"].as_str().unwrap())
                .unwrap()
                .0;
            (ms, p.get("filled").is_some())
        })
        .collect();
    let want: Vec<(i64, bool)> = expect("cdl-no", true)
        .into_iter()
        .map(|(b, _, f)| (b, f))
        .collect();
    assert_eq!(no, want);
    assert_eq!(
        body["data"]["Yes"].as_array().unwrap().len(),
        expect("cdl-yes", true).len()
    );

    // `fill=none` and no `fill` are today's answers, byte for byte.
    for route in ["/v1/tokens/cdl-yes/prices", "/v1/markets/cdl-m/prices"] {
        let base = format!(
            "{route}?start_ts={}&end_ts={}&resolution=1m&limit=2",
            iso_ms(T0 - 120_000),
            iso_ms(T0 + 20 * 60_000)
        );
        let plain = client()
            .get(app.api_url(&base))
            .header("X-API-Key", API_KEY)
            .send()
            .await
            .unwrap();
        let none = client()
            .get(app.api_url(&format!("{base}&fill=none")))
            .header("X-API-Key", API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(
            plain.bytes().await.unwrap(),
            none.bytes().await.unwrap(),
            "{route}"
        );
    }
    // Books and metrics do not fill; a bad word is a 422.
    let books = format!(
        "/v1/tokens/cdl-yes/books?start_ts={}&end_ts={}&resolution=1m&fill=previous",
        iso_ms(T0),
        iso_ms(T0 + 60_000)
    );
    let (status, _, body) = get_as(&app, Some(API_KEY), &books).await;
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = get_as(&app, Some(API_KEY), &books.replace("previous", "linear")).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["query", "fill"]));
}
