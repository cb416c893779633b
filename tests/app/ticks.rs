//! Tick-level history, the book at a moment and trades, end to end: raw
//! lines go through ingest, the log and the projector into the tick-level
//! tables; the API's answers (candles with their trades' volume and count
//! among them) are compared exactly with what this file computes from the
//! same raw lines, before and after `hindsight rebuild`.

use crate::helpers::*;
use hindsight_schemas::{IsoTime, Timestamp};
use serde_json::{json, Value};

/// 2025-09-01T00:00:00Z, in ms.
const T0: i64 = 1_756_684_800_000;
const MARKET: &str = "tk";
const YES: &str = "tk-yes";
const NO: &str = "tk-no";
/// The range every read asks for: the test day.
const RANGE: &str = "start_ts=2025-09-01T00:00:00Z&end_ts=2025-09-02T00:00:00Z";

fn iso(ms: i64) -> Value {
    serde_json::to_value(IsoTime(Timestamp(ms))).unwrap()
}

fn secs(ms: i64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// One raw line as sent, with what this test expects of it.
#[derive(Clone)]
enum Raw {
    Price {
        token: &'static str,
        ms: i64,
        p: f64,
    },
    Book {
        token: &'static str,
        ms: i64,
        bid: f64,
    },
    Trade {
        token: &'static str,
        ms: i64,
        price: f64,
        size: f64,
        buy: bool,
        id: Option<String>,
    },
}

impl Raw {
    fn line(&self) -> String {
        match self {
            Raw::Price { token, ms, p } => format!(
                r#"{{"kind":"price","market_id":"{MARKET}","token_id":"{token}","ts":{},"p":{p}}}"#,
                secs(*ms)
            ),
            Raw::Book { token, ms, bid } => format!(
                r#"{{"kind":"book","market_id":"{MARKET}","token_id":"{token}","ts":"{}","bids":[[{bid},10.0],[0.01,5.5]],"asks":[[0.99,2.0]]}}"#,
                iso(*ms).as_str().unwrap()
            ),
            Raw::Trade {
                token,
                ms,
                price,
                size,
                buy,
                id,
            } => {
                let side = if *buy { "buy" } else { "sell" };
                let id = id
                    .as_ref()
                    .map_or(String::new(), |id| format!(r#","trade_id":"{id}""#));
                format!(
                    r#"{{"kind":"trade","market_id":"{MARKET}","token_id":"{token}","ts":{},"price":{price},"size":{size},"side":"{side}"{id}}}"#,
                    secs(*ms)
                )
            }
        }
    }
}

/// The raw input, in ingest order, as two batches: ticks out of time order
/// and several sharing a millisecond, snapshots likewise, trades whose ids
/// repeat within a batch and across the two.
fn batches() -> (Vec<Raw>, Vec<Raw>) {
    let mut first = Vec::new();
    let mut second = Vec::new();
    for i in 0..180i64 {
        // Every third tick shares its millisecond with the one before.
        let ms = T0 + (i - i % 3 / 2) * 7_919 % 80_000_000;
        let p = ((i * 37) % 100) as f64 / 100.0;
        let token = if i % 4 == 0 { NO } else { YES };
        let into = if i % 2 == 0 { &mut first } else { &mut second };
        into.push(Raw::Price { token, ms, p });
        if i % 6 == 0 {
            into.push(Raw::Book {
                token,
                ms: ms - ms % 60_000,
                bid: ((i % 50) + 2) as f64 / 100.0,
            });
        }
        if i % 5 != 4 {
            // Ids repeat: `t{i % 40}`, across both batches; every tenth
            // trade has none.
            let id = (i % 10 != 0).then(|| format!("t{}", i % 40));
            into.push(Raw::Trade {
                token,
                ms: ms + 1,
                price: p,
                size: (i % 13) as f64 + 0.5,
                buy: i % 3 == 0,
                id,
            });
        }
    }
    (first, second)
}

/// What the tick routes must serve for `token`, computed from the raw
/// lines alone: ticks in (time, arrival) order; trades with a repeated id
/// kept at their first arrival only (per token).
struct Expected {
    prices: Vec<Value>,
    books: Vec<Value>,
    trades: Vec<Value>,
}

fn expected(all: &[Raw], token: &str) -> Expected {
    let mut prices: Vec<(i64, usize, Value)> = Vec::new();
    let mut books: Vec<(i64, usize, Value)> = Vec::new();
    let mut trades: Vec<(i64, usize, Value)> = Vec::new();
    let mut ids_seen = std::collections::HashSet::new();
    for (arrival, raw) in all.iter().enumerate() {
        match raw {
            Raw::Price { token: t, ms, p } if *t == token => {
                prices.push((*ms, arrival, json!({"t": iso(*ms), "p": p})))
            }
            Raw::Book { token: t, ms, bid } if *t == token => books.push((
                *ms,
                arrival,
                json!({"t": iso(*ms), "bids": [[bid, 10.0], [0.01, 5.5]], "asks": [[0.99, 2.0]]}),
            )),
            Raw::Trade {
                token: t,
                ms,
                price,
                size,
                buy,
                id,
            } if *t == token => {
                if let Some(id) = id {
                    if !ids_seen.insert(id.clone()) {
                        continue;
                    }
                }
                let side = if *buy { "buy" } else { "sell" };
                trades.push((
                    *ms,
                    arrival,
                    json!({"t": iso(*ms), "price": price, "size": size, "side": side, "trade_id": id}),
                ));
            }
            _ => {}
        }
    }
    let ordered = |mut v: Vec<(i64, usize, Value)>| {
        v.sort_by_key(|(ms, arrival, _)| (*ms, *arrival));
        v.into_iter().map(|(_, _, value)| value).collect()
    };
    Expected {
        prices: ordered(prices),
        books: ordered(books),
        trades: ordered(trades),
    }
}

/// The candles `token` must serve at `width_ms`, from the raw lines alone:
/// per bucket holding price ticks, open and close by (time, arrival), high,
/// low and the number of ticks; and where the bucket holds trades (a
/// repeated id counted at its first arrival only), their summed size as
/// `volume` (added in time, then arrival, order) and their number as
/// `trades`. Trades of a bucket without price ticks have no candle.
fn expected_candles(all: &[Raw], token: &str, width_ms: i64) -> Vec<Value> {
    use std::collections::BTreeMap;
    let bucket = |ms: i64| ms.div_euclid(width_ms) * width_ms;
    let mut prices: BTreeMap<i64, Vec<(i64, usize, f64)>> = BTreeMap::new();
    let mut trades: BTreeMap<i64, Vec<(i64, usize, f64)>> = BTreeMap::new();
    let mut ids_seen = std::collections::HashSet::new();
    for (arrival, raw) in all.iter().enumerate() {
        match raw {
            Raw::Price { token: t, ms, p } if *t == token => prices
                .entry(bucket(*ms))
                .or_default()
                .push((*ms, arrival, *p)),
            Raw::Trade {
                token: t,
                ms,
                size,
                id,
                ..
            } if *t == token && id.as_ref().is_none_or(|id| ids_seen.insert(id.clone())) => {
                trades
                    .entry(bucket(*ms))
                    .or_default()
                    .push((*ms, arrival, *size));
            }
            _ => {}
        }
    }
    prices
        .into_iter()
        .map(|(b, mut ticks)| {
            ticks.sort_by_key(|&(ms, arrival, _)| (ms, arrival));
            let ps: Vec<f64> = ticks.iter().map(|t| t.2).collect();
            let mut point = json!({
                "t": iso(b),
                "o": ps[0],
                "h": ps.iter().copied().fold(f64::MIN, f64::max),
                "l": ps.iter().copied().fold(f64::MAX, f64::min),
                "c": ps[ps.len() - 1],
                "n": ps.len(),
            });
            if let Some(mut bucket_trades) = trades.remove(&b) {
                bucket_trades.sort_by_key(|&(ms, arrival, _)| (ms, arrival));
                let volume = bucket_trades.iter().fold(0.0, |v, t| v + t.2);
                point["volume"] = json!(volume);
                point["trades"] = json!(bucket_trades.len());
            }
            point
        })
        .collect()
}

/// The book at `at` computed from the raw lines: the snapshot with the
/// greatest (time, arrival) at or before it.
fn book_at(all: &[Raw], token: &str, at: i64) -> Option<Value> {
    all.iter()
        .enumerate()
        .filter_map(|(arrival, raw)| match raw {
            Raw::Book { token: t, ms, bid } if *t == token && *ms <= at => Some((*ms, arrival, *bid)),
            _ => None,
        })
        .max_by_key(|(ms, arrival, _)| (*ms, *arrival))
        .map(|(ms, _, bid)| {
            json!({"token_id": token, "t": iso(ms), "bids": [[bid, 10.0], [0.01, 5.5]], "asks": [[0.99, 2.0]]})
        })
}

/// Every point of a paged route, following `next_cursor`; also returns the
/// raw bodies (compared byte for byte across the rebuild).
async fn page_through(app: &TestApp, path: &str) -> (Vec<Value>, Vec<String>) {
    let (mut points, mut bodies) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}&cursor={c}"),
            None => path.to_string(),
        };
        let r = client()
            .get(app.api_url(&url))
            .header("X-API-Key", API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{url}");
        let text = r.text().await.unwrap();
        let body: Value = serde_json::from_str(&text).unwrap();
        bodies.push(text);
        let data = body["data"].as_array().unwrap();
        assert!(data.len() <= 7, "a page holds at most its limit");
        points.extend(data.iter().cloned());
        match body["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return (points, bodies),
        }
    }
}

/// Everything the tick routes answer for the test data, as raw bodies.
async fn answers(app: &TestApp, all: &[Raw]) -> Vec<String> {
    let mut out = Vec::new();
    for token in [YES, NO] {
        let want = expected(all, token);
        for (route, want) in [
            ("prices?resolution=tick&", &want.prices),
            ("books?resolution=tick&", &want.books),
            ("trades?", &want.trades),
        ] {
            let path = format!("/v1/tokens/{token}/{route}{RANGE}&limit=7");
            let (got, bodies) = page_through(app, &path).await;
            assert_eq!(&got, want, "{path}");
            out.extend(bodies);
        }
        // Candles with their trades' volume and count; with
        // `fill=previous` the same stored candles, and filled ones without.
        for (res, width) in [("1m", 60_000), ("1h", 3_600_000)] {
            let want = expected_candles(all, token, width);
            assert!(
                want.iter().filter(|c| c.get("trades").is_some()).count() >= 3 || res == "1h",
                "{token}: buckets with trades"
            );
            assert!(
                want.iter().any(|c| c.get("trades").is_none()) || res == "1h",
                "{token}: a bucket without trades keeps today's shape"
            );
            let path = format!("/v1/tokens/{token}/candles?resolution={res}&{RANGE}&limit=7");
            let (got, bodies) = page_through(app, &path).await;
            assert_eq!(got, want, "{path}");
            out.extend(bodies);
            let (filled, _) = page_through(app, &format!("{path}&fill=previous")).await;
            let (made_up, stored): (Vec<Value>, Vec<Value>) =
                filled.into_iter().partition(|c| c.get("filled").is_some());
            assert_eq!(stored, want, "{path}&fill=previous");
            assert!(
                res == "1h" || !made_up.is_empty(),
                "{token}: some bucket was filled"
            );
            for c in made_up {
                assert!(
                    c.get("volume").is_none() && c.get("trades").is_none(),
                    "a filled candle has no trades: {c}"
                );
            }
        }
    }
    // The market's candles: each token's, keyed by label.
    let path = format!("/v1/markets/{MARKET}/candles?resolution=1m&{RANGE}&limit=200");
    let (status, body) = get(app, &path).await;
    assert_eq!(status, 200, "{path}: {body}");
    assert_eq!(
        body["data"]["Yes"],
        json!(expected_candles(all, YES, 60_000))
    );
    assert_eq!(body["data"]["No"], json!(expected_candles(all, NO, 60_000)));
    out.push(body.to_string());
    // The book at a moment: before the first snapshot, on one, between,
    // after the last; per token and per market.
    for at in [
        T0 - 1,
        T0,
        T0 + 60_000,
        T0 + 1_234_567,
        T0 + 40_000_000,
        T0 + 86_400_000,
    ] {
        let ts = secs(at);
        let mut market_data = serde_json::Map::new();
        for (label, token) in [("Yes", YES), ("No", NO)] {
            let (status, body) = get(app, &format!("/v1/tokens/{token}/book?ts={ts}")).await;
            match book_at(all, token, at) {
                Some(want) => {
                    assert_eq!((status, &body), (200, &want), "{token} at {ts}");
                    market_data.insert(label.into(), want);
                }
                None => assert_eq!(status, 404, "{token} at {ts}: {body}"),
            }
            out.push(body.to_string());
        }
        let (status, body) = get(app, &format!("/v1/markets/{MARKET}/book?ts={ts}")).await;
        if market_data.is_empty() {
            assert_eq!(status, 404, "market at {ts}: {body}");
        } else {
            let want =
                json!({"market_id": MARKET, "tokens": {"No": NO, "Yes": YES}, "data": market_data});
            assert_eq!((status, &body), (200, &want), "market at {ts}");
        }
        out.push(body.to_string());
    }
    out
}

#[tokio::test]
async fn tick_reads_books_at_a_moment_trades_and_candle_volumes_equal_the_raw_input_across_a_rebuild(
) {
    let app = spawn_app("ticks").await;
    let (first, second) = batches();
    let mut body: Vec<String> = vec![market_line(MARKET)];
    body.extend(first.iter().map(Raw::line));
    let (status, answer) = ingest(&app, body.join("\n")).await;
    assert_eq!(
        (status, &answer["rejected_count"]),
        (200, &json!(0)),
        "{answer}"
    );
    // The second batch ends with a sentinel tick, last in the log.
    let sentinel = Raw::Price {
        token: NO,
        ms: T0 + 86_000_000,
        p: 0.5,
    };
    let mut lines: Vec<String> = second.iter().map(Raw::line).collect();
    lines.push(sentinel.line());
    let (status, answer) = ingest(&app, lines.join("\n")).await;
    assert_eq!(
        (status, &answer["rejected_count"]),
        (200, &json!(0)),
        "{answer}"
    );
    let mut all = first.clone();
    all.extend(second.iter().cloned());
    all.push(sentinel);
    wait_for(
        &app,
        &format!("/v1/tokens/{NO}/prices?resolution=tick&start_ts=2025-09-01T23:53:20Z&end_ts=2025-09-02T00:00:00Z"),
        |b| b["data"].as_array().is_some_and(|d| !d.is_empty()),
    )
    .await;
    let before = answers(&app, &all).await;
    let dir = app.data_dir.clone();
    app.stop().await;

    let out = hindsight()
        .args(["rebuild", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let app = spawn_app_in(&dir, Options::default()).await;
    let after = answers(&app, &all).await;
    assert!(before == after, "the answers changed across the rebuild");
    app.stop().await;
}

#[tokio::test]
async fn tick_routes_are_gated_by_plans_and_refused_where_not_served() {
    let app = spawn_app("ticks-plans").await;
    let line = Raw::Trade {
        token: YES,
        ms: T0,
        price: 0.4,
        size: 1.0,
        buy: true,
        id: Some("x".into()),
    };
    let book = Raw::Book {
        token: YES,
        ms: T0,
        bid: 0.3,
    };
    let body = [market_line(MARKET), line.line(), book.line()].join("\n");
    assert_eq!(ingest(&app, body).await.0, 200);
    wait_for(&app, &format!("/v1/tokens/{YES}/trades?{RANGE}"), |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    let pro = app.key("pro").await;
    let free = app.key("free").await;
    let tick_prices = format!("/v1/tokens/{YES}/prices?resolution=tick&{RANGE}");
    let (status, _, body) = get_as(&app, Some(&pro), &tick_prices).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["detail"],
        "Your plan does not allow resolution tick; the finest allowed is 1m."
    );
    let (status, _, _) = get_as(
        &app,
        Some(&pro),
        &format!("/v1/tokens/{YES}/trades?{RANGE}"),
    )
    .await;
    assert_eq!(status, 200, "pro has trades");
    let (status, _, body) = get_as(
        &app,
        Some(&free),
        &format!("/v1/tokens/{YES}/trades?{RANGE}"),
    )
    .await;
    assert_eq!(
        (status, &body["detail"]),
        (403, &json!("Your plan does not allow historical trades."))
    );
    let (status, _, body) = get_as(
        &app,
        Some(&free),
        &format!("/v1/tokens/{YES}/book?ts=2025-10-20T00:00:00Z"),
    )
    .await;
    assert_eq!(
        (status, &body["detail"]),
        (
            403,
            &json!("Your plan does not allow historical order books.")
        )
    );
    // Market routes and candles serve buckets only: `tick` there is refused
    // as a request no plan can have answered (422), not as a plan limit
    // (403), whatever the key's plan.
    let bucket_routes = ["prices", "books", "metrics", "candles"]
        .map(|kind| format!("/v1/markets/{MARKET}/{kind}"))
        .into_iter()
        .chain([format!("/v1/tokens/{YES}/candles")]);
    for (route, key) in bucket_routes.flat_map(|r| [(r.clone(), API_KEY), (r, pro.as_str())]) {
        let (status, _, body) =
            get_as(&app, Some(key), &format!("{route}?resolution=tick&{RANGE}")).await;
        assert_eq!(status, 422, "{route} with {key}: {body}");
        assert_eq!(body["detail"][0]["loc"], json!(["query", "resolution"]));
        assert!(
            body["detail"][0]["msg"]
                .as_str()
                .unwrap()
                .contains("/v1/tokens/{token_id}/prices"),
            "{body}"
        );
    }
    let (status, body) = get(&app, &format!("/v1/tokens/{YES}/book")).await;
    assert_eq!(
        (status, &body["detail"][0]["loc"]),
        (422, &json!(["query", "ts"]))
    );
    let (status, body) = get(&app, "/v1/tokens/nope/book?ts=1756684800").await;
    assert_eq!((status, &body["detail"]), (404, &json!("Token not found")));
    let (status, body) = get(&app, "/v1/usage").await;
    assert_eq!(status, 200);
    assert_eq!(body["limits"]["granularity_allowed"], "tick");
    assert_eq!(body["limits"]["data_points"]["trades"], true);
    // A trade line naming its bad field.
    let bad = format!(
        r#"{{"kind":"trade","market_id":"{MARKET}","token_id":"{YES}","ts":1756684800,"price":0.5,"size":1,"side":"hold"}}"#
    );
    let (status, answer) = ingest(&app, bad).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(
        answer["rejected"][0]["reason"],
        "field `side`: `hold` is neither `buy` nor `sell`"
    );
    app.stop().await;
}
