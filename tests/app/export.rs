//! Bulk export on the embedded default: ticks, books and metrics ingested
//! over HTTP come back from `/v1/export/*` as every bucket of the range,
//! checked against values computed here from the raw input, in CSV and in
//! Parquet, gated by the plan like the history pages.

use crate::helpers::*;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::collections::BTreeMap;

/// 2025-09-01T00:00:00Z
pub(crate) const DAY: i64 = 1_756_684_800;
pub(crate) const HOURS: i64 = 3;

/// A book snapshot as ingested: `(ts, bids, asks)`.
type Book = (i64, Vec<[f64; 2]>, Vec<[f64; 2]>);

/// Deterministic inputs over three hours: a price per token every 20 s
/// (one late), a book for `m1-yes` every 45 s, metrics every 30 s.
pub(crate) struct Input {
    prices: Vec<(&'static str, i64, f64)>,
    books: Vec<Book>,
    metrics: Vec<(i64, [f64; 3])>,
}

pub(crate) fn input() -> Input {
    let mut x: u64 = 7;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) % 10_000) as f64 / 10_000.0
    };
    let end = DAY + HOURS * 3600;
    let mut prices = Vec::new();
    for t in (DAY..end).step_by(20) {
        prices.push(("m1-yes", t, next()));
        prices.push(("m1-no", t + 3, next()));
    }
    prices.push(("m1-yes", DAY + 65, 0.99)); // late: folds into its own minute
    let books = (DAY..end)
        .step_by(45)
        .map(|t| {
            (
                t,
                vec![[0.1 + next() * 0.4, 10.0], [0.01, 2.5]],
                vec![[0.55 + next() * 0.4, 3.0]],
            )
        })
        .collect();
    let metrics = (DAY..end)
        .step_by(30)
        .map(|t| (t, [next() * 1e6, next() * 1e5, next()]))
        .collect();
    Input {
        prices,
        books,
        metrics,
    }
}

fn body(input: &Input) -> String {
    let mut lines = vec![market_line("m1")];
    for (token, t, p) in &input.prices {
        lines.push(price_line("m1", token, *t, *p));
    }
    for (t, bids, asks) in &input.books {
        lines.push(format!(
            r#"{{"kind":"book","market_id":"m1","token_id":"m1-yes","ts":{t},"bids":{},"asks":{}}}"#,
            serde_json::to_string(bids).unwrap(),
            serde_json::to_string(asks).unwrap()
        ));
    }
    for (t, [v, l, s]) in &input.metrics {
        lines.push(format!(
            r#"{{"kind":"metrics","market_id":"m1","ts":{t},"volume":{v},"liquidity":{l},"spread":{s}}}"#
        ));
    }
    lines.join("\n")
}

/// Average per bucket of `values`, as `(bucket start secs, average)`.
fn averages<const N: usize>(values: &[(i64, [f64; N])], width: i64) -> BTreeMap<i64, [f64; N]> {
    let mut sums: BTreeMap<i64, ([f64; N], u32)> = BTreeMap::new();
    for (t, v) in values {
        let e = sums
            .entry(t.div_euclid(width) * width)
            .or_insert(([0.0; N], 0));
        for (sum, x) in e.0.iter_mut().zip(v) {
            *sum += x;
        }
        e.1 += 1;
    }
    sums.into_iter()
        .map(|(b, (s, n))| (b, s.map(|x| x / n as f64)))
        .collect()
}

/// Splits CSV text into records (RFC 4180: quoted fields may hold commas).
fn csv_records(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => fields.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                fields.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut fields));
            }
            (false, c) => field.push(c),
        }
    }
    records
}

async fn export(
    app: &TestApp,
    key: &str,
    path: &str,
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let r = client()
        .get(app.api_url(path))
        .header("X-API-Key", key)
        .send()
        .await
        .unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.bytes().await.unwrap().to_vec())
}

fn secs(iso: &str) -> i64 {
    hindsight_schemas::Timestamp::parse(iso).unwrap().millis() / 1000
}

pub(crate) async fn ingested(app: &TestApp, input: &Input) {
    let (status, ack) = ingest(app, body(input)).await;
    assert_eq!(status, 200, "{ack}");
    assert_eq!(ack["rejected_count"], 0, "{ack}");
    // The last events of each kind are visible once their 1m buckets are.
    let last = DAY + HOURS * 3600 - 60;
    for path in [
        format!(
            "/v1/tokens/m1-no/prices?start_ts={last}&end_ts={}&resolution=1m",
            last + 60
        ),
        format!(
            "/v1/tokens/m1-yes/books?start_ts={}&end_ts={}&resolution=1m",
            last - 60,
            last + 60
        ),
        format!(
            "/v1/markets/m1/metrics?start_ts={last}&end_ts={}&resolution=1m",
            last + 60
        ),
    ] {
        wait_for(app, &path, |b| {
            b["data"].as_array().is_some_and(|d| !d.is_empty())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_prices_books_and_metrics_are_every_bucket_as_computed_from_the_raw_input() {
    let app = spawn_app("export").await;
    let input = input();
    ingested(&app, &input).await;
    let key = app.key("enterprise").await;
    let range = format!("start_ts={DAY}&end_ts={}", DAY + HOURS * 3600);

    for (res, width) in [("1m", 60), ("1h", 3600)] {
        // Prices of the market: every token, by token then time.
        let (status, headers, bytes) = export(
            &app,
            &key,
            &format!("/v1/export/prices?market_id=m1-slug&{range}&resolution={res}"),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(headers["content-type"], "text/csv; charset=utf-8");
        let records = csv_records(&String::from_utf8(bytes).unwrap());
        assert_eq!(records[0], ["market_id", "token_id", "t", "p"]);
        let mut want = Vec::new();
        for token in ["m1-yes", "m1-no"] {
            let ticks: Vec<(i64, [f64; 1])> = input
                .prices
                .iter()
                .filter(|(t, _, _)| *t == token)
                .map(|(_, t, p)| (*t, [*p]))
                .collect();
            for (bucket, [p]) in averages(&ticks, width) {
                want.push((token, bucket, p));
            }
        }
        assert_eq!(
            records.len() - 1,
            want.len(),
            "{res}: one row per bucket with ticks"
        );
        for (row, (token, bucket, p)) in records[1..].iter().zip(&want) {
            assert_eq!(row[0], "m1");
            assert_eq!(row[1], *token);
            assert_eq!(secs(&row[2]), *bucket, "{res} {token}");
            let got: f64 = row[3].parse().unwrap();
            assert!(
                (got - p).abs() < 1e-12,
                "{res} {token} {}: got {got}, want {p}",
                row[2]
            );
        }

        // Books: the last snapshot of each bucket, levels as JSON text.
        let (status, _, bytes) = export(
            &app,
            &key,
            &format!("/v1/export/books?token_id=m1-yes&{range}&resolution={res}"),
        )
        .await;
        assert_eq!(status, 200);
        let records = csv_records(&String::from_utf8(bytes).unwrap());
        assert_eq!(records[0], ["market_id", "token_id", "t", "bids", "asks"]);
        let mut last: BTreeMap<i64, &Book> = BTreeMap::new();
        for book in &input.books {
            last.insert(book.0.div_euclid(width) * width, book);
        }
        assert_eq!(records.len() - 1, last.len(), "{res}: one book per bucket");
        for (row, (bucket, (_, bids, asks))) in records[1..].iter().zip(&last) {
            assert_eq!(secs(&row[2]), *bucket);
            let got: Vec<[f64; 2]> = serde_json::from_str(&row[3]).unwrap();
            assert_eq!(&got, bids);
            let got: Vec<[f64; 2]> = serde_json::from_str(&row[4]).unwrap();
            assert_eq!(&got, asks);
        }

        // Metrics, as Parquet: typed columns, bucket averages.
        let (status, headers, bytes) = export(
            &app,
            &key,
            &format!("/v1/export/metrics?market_id=m1&{range}&resolution={res}&format=parquet"),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(headers["content-type"], "application/vnd.apache.parquet");
        let want = averages(&input.metrics, width);
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap();
        let mut got = Vec::new();
        for batch in reader.build().unwrap() {
            let batch = batch.unwrap();
            let column = |i: usize| {
                batch
                    .column(i)
                    .as_any()
                    .downcast_ref::<arrow_array::Float64Array>()
                    .unwrap()
                    .clone()
            };
            let t = batch
                .column(1)
                .as_any()
                .downcast_ref::<arrow_array::TimestampMillisecondArray>()
                .unwrap();
            let (v, l, s) = (column(2), column(3), column(4));
            for i in 0..batch.num_rows() {
                got.push((t.value(i) / 1000, [v.value(i), l.value(i), s.value(i)]));
            }
        }
        assert_eq!(got.len(), want.len(), "{res}: one metrics row per bucket");
        for ((t, values), (bucket, avg)) in got.iter().zip(&want) {
            assert_eq!(t, bucket);
            for i in 0..3 {
                let tolerance = 1e-12 * avg[i].abs().max(1.0);
                assert!(
                    (values[i] - avg[i]).abs() < tolerance,
                    "{res} {t}: {values:?} vs {avg:?}"
                );
            }
        }
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_gated_by_the_plan_like_the_history_pages() {
    let app = spawn_app("export-plans").await;
    ingested(&app, &input()).await;
    let free = app.key("free").await;
    // Within the free plan's 30 days of lookback.
    app.clock
        .set(hindsight_schemas::Timestamp((DAY + 10 * 86_400) * 1000));
    let range = format!("start_ts={DAY}&end_ts={}", DAY + 3600);
    // The free plan has no books, and nothing finer than 1h.
    for (path, reason) in [
        (
            format!("/v1/export/books?token_id=m1-yes&{range}&resolution=1h"),
            "order books",
        ),
        (
            format!("/v1/export/prices?token_id=m1-yes&{range}&resolution=1m"),
            "resolution 1m",
        ),
    ] {
        let (status, _, bytes) = export(&app, &free, &path).await;
        assert_eq!(status, 403, "{path}");
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(body["detail"].as_str().unwrap().contains(reason), "{body}");
    }
    let (status, _, _) = export(
        &app,
        &free,
        &format!("/v1/export/prices?token_id=m1-yes&{range}&resolution=1h"),
    )
    .await;
    assert_eq!(status, 200);
    app.stop().await;
}

/// A trade as ingested: `(token, ts secs, price, size, buy, trade_id)`.
type Trade = (&'static str, i64, f64, f64, bool, Option<String>);

/// Trades of both tokens every 50 s over the three hours, in two batches:
/// ids `tr{i % 30}` repeat within and across the batches (every fourth
/// trade has none), so repeated ids arrive in later requests.
fn trades() -> (Vec<Trade>, Vec<Trade>) {
    let (mut first, mut second) = (Vec::new(), Vec::new());
    let end = DAY + HOURS * 3600;
    for (i, t) in (DAY..end).step_by(50).enumerate() {
        let token = if i % 3 == 0 { "m1-no" } else { "m1-yes" };
        let id = (i % 4 != 0).then(|| format!("tr{}", i % 30));
        let trade = (
            token,
            t + 1,
            (i % 97) as f64 / 100.0,
            (i % 7) as f64 + 0.25 + (i % 3) as f64 / 10.0,
            i % 2 == 0,
            id,
        );
        if i % 2 == 0 { &mut first } else { &mut second }.push(trade);
    }
    (first, second)
}

fn trade_line((token, t, price, size, buy, id): &Trade) -> String {
    let side = if *buy { "buy" } else { "sell" };
    let id = id
        .as_ref()
        .map_or(String::new(), |id| format!(r#","trade_id":"{id}""#));
    format!(
        r#"{{"kind":"trade","market_id":"m1","token_id":"{token}","ts":{t},"price":{price},"size":{size},"side":"{side}"{id}}}"#
    )
}

fn iso(secs: i64) -> String {
    hindsight_schemas::Timestamp(secs * 1000).to_rfc3339()
}

/// A number as both formats' readers print it here.
fn num(x: f64) -> String {
    format!("{x}")
}

/// The trades of `token` kept, from the raw input: a repeated id only at
/// its first arrival; in (time, arrival) order.
fn kept_trades<'a>(all: &'a [Trade], token: &str) -> Vec<&'a Trade> {
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<(usize, &Trade)> = all
        .iter()
        .enumerate()
        .filter(|(_, t)| t.0 == token)
        .filter(|(_, t)| t.5.as_ref().is_none_or(|id| seen.insert(id.clone())))
        .collect();
    kept.sort_by_key(|(arrival, t)| (t.1, *arrival));
    kept.into_iter().map(|(_, t)| t).collect()
}

/// Rows of the trades export of `tokens`, from the raw input.
fn trade_rows(all: &[Trade], tokens: &[&str]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for token in tokens {
        for (token, t, price, size, buy, id) in kept_trades(all, token) {
            rows.push(vec![
                "m1".into(),
                token.to_string(),
                iso(*t),
                num(*price),
                num(*size),
                if *buy { "buy" } else { "sell" }.into(),
                id.clone().unwrap_or_default(),
            ]);
        }
    }
    rows
}

/// Rows of the candles export of `tokens` at `width` secs: per bucket
/// with price ticks, OHLC by (time, arrival), the tick count, and the kept
/// trades' summed size (in time, then arrival, order) and number — empty
/// for a bucket without trades.
fn candle_rows(input: &Input, all: &[Trade], tokens: &[&str], width: i64) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for token in tokens {
        let mut buckets: BTreeMap<i64, Vec<(i64, usize, f64)>> = BTreeMap::new();
        for (arrival, (tok, t, p)) in input.prices.iter().enumerate() {
            if tok == token {
                buckets
                    .entry(t.div_euclid(width) * width)
                    .or_default()
                    .push((*t, arrival, *p));
            }
        }
        let mut volumes: BTreeMap<i64, (f64, u64)> = BTreeMap::new();
        for (_, t, _, size, _, _) in kept_trades(all, token) {
            let e = volumes.entry(t.div_euclid(width) * width).or_default();
            e.0 += size;
            e.1 += 1;
        }
        for (bucket, mut ticks) in buckets {
            ticks.sort_by_key(|&(t, arrival, _)| (t, arrival));
            let ps: Vec<f64> = ticks.iter().map(|t| t.2).collect();
            let (volume, count) = volumes
                .get(&bucket)
                .map_or((String::new(), String::new()), |(v, n)| {
                    (num(*v), n.to_string())
                });
            rows.push(vec![
                "m1".into(),
                token.to_string(),
                iso(bucket),
                num(ps[0]),
                num(ps.iter().copied().fold(f64::MIN, f64::max)),
                num(ps.iter().copied().fold(f64::MAX, f64::min)),
                num(ps[ps.len() - 1]),
                ps.len().to_string(),
                volume,
                count,
            ]);
        }
    }
    rows
}

/// A file's rows, each cell as text.
type Rows = Vec<Vec<String>>;

/// Each column's name, Arrow type and nullability.
type Columns = Vec<(String, String, bool)>;

/// Every row of a Parquet file as text, as CSV writes it (an empty field
/// for a null), with its columns.
fn parquet_rows(bytes: Vec<u8>) -> (Columns, Rows) {
    use arrow_array::{Array, Float64Array, Int64Array, StringArray, TimestampMillisecondArray};
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap();
    let schema: Columns = reader
        .schema()
        .fields()
        .iter()
        .map(|f| {
            (
                f.name().clone(),
                format!("{}", f.data_type()),
                f.is_nullable(),
            )
        })
        .collect();
    let mut rows = Vec::new();
    for batch in reader.build().unwrap() {
        let batch = batch.unwrap();
        for i in 0..batch.num_rows() {
            let row = batch
                .columns()
                .iter()
                .map(|c| {
                    let any = c.as_any();
                    if c.is_null(i) {
                        String::new()
                    } else if let Some(a) = any.downcast_ref::<StringArray>() {
                        a.value(i).to_string()
                    } else if let Some(a) = any.downcast_ref::<TimestampMillisecondArray>() {
                        hindsight_schemas::Timestamp(a.value(i)).to_rfc3339()
                    } else if let Some(a) = any.downcast_ref::<Float64Array>() {
                        num(a.value(i))
                    } else if let Some(a) = any.downcast_ref::<Int64Array>() {
                        a.value(i).to_string()
                    } else {
                        panic!("a column of type {}", c.data_type())
                    }
                })
                .collect();
            rows.push(row);
        }
    }
    (schema, rows)
}

/// Book levels as the test sent them, whatever spacing the store keeps.
fn levels(text: &str) -> String {
    let levels: Vec<[f64; 2]> = serde_json::from_str(text).unwrap();
    serde_json::to_string(&levels).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_trades_candles_and_ticks_equal_the_raw_input_in_csv_and_parquet_across_a_rebuild()
{
    let app = spawn_app("export-ticks").await;
    let input = input();
    ingested(&app, &input).await;
    let (first, second) = trades();
    for batch in [&first, &second] {
        let lines: Vec<String> = batch.iter().map(trade_line).collect();
        let (status, ack) = ingest(&app, lines.join("\n")).await;
        assert_eq!(
            (status, &ack["rejected_count"]),
            (200, &serde_json::json!(0)),
            "{ack}"
        );
    }
    let all: Vec<Trade> = first.iter().chain(&second).cloned().collect();
    // The second batch is projected once its last trade kept is served.
    let last = kept_trades(&all, "m1-yes")
        .into_iter()
        .chain(kept_trades(&all, "m1-no"))
        .filter(|t| second.contains(t))
        .max_by_key(|t| t.1)
        .unwrap();
    wait_for(
        &app,
        &format!(
            "/v1/tokens/{}/trades?start_ts={}&end_ts={}",
            last.0,
            last.1,
            last.1 + 1
        ),
        |b| b["data"].as_array().is_some_and(|d| !d.is_empty()),
    )
    .await;
    assert!(
        kept_trades(&all, "m1-yes").len() < all.iter().filter(|t| t.0 == "m1-yes").count(),
        "some trade ids repeat"
    );
    let key = app.key("enterprise").await;
    let range = format!("start_ts={DAY}&end_ts={}", DAY + HOURS * 3600);
    let both = ["m1-yes", "m1-no"];

    // Tick-level prices and books: every tick with its exact time.
    let mut tick_prices = Vec::new();
    for token in both {
        let mut ticks: Vec<(i64, usize, f64)> = input
            .prices
            .iter()
            .enumerate()
            .filter(|(_, (t, _, _))| *t == token)
            .map(|(arrival, (_, t, p))| (*t, arrival, *p))
            .collect();
        ticks.sort_by_key(|&(t, arrival, _)| (t, arrival));
        for (t, _, p) in ticks {
            tick_prices.push(vec!["m1".into(), token.into(), iso(t), num(p)]);
        }
    }
    let tick_books: Vec<Vec<String>> = input
        .books
        .iter()
        .map(|(t, bids, asks)| {
            vec![
                "m1".into(),
                "m1-yes".into(),
                iso(*t),
                serde_json::to_string(bids).unwrap(),
                serde_json::to_string(asks).unwrap(),
            ]
        })
        .collect();
    let candles_1m = candle_rows(&input, &all, &both, 60);
    assert!(
        candles_1m.iter().any(|r| r[9].is_empty()) && candles_1m.iter().any(|r| !r[9].is_empty()),
        "buckets with and without trades"
    );
    // Path, header, rows computed from the raw input.
    let cases: Vec<(String, Vec<&str>, Rows)> = vec![
        (
            format!("/v1/export/trades?market_id=m1&{range}"),
            vec![
                "market_id",
                "token_id",
                "t",
                "price",
                "size",
                "side",
                "trade_id",
            ],
            trade_rows(&all, &both),
        ),
        (
            // Trades take no `resolution`: one given is ignored.
            format!("/v1/export/trades?token_id=m1-no&{range}&resolution=1h"),
            vec![
                "market_id",
                "token_id",
                "t",
                "price",
                "size",
                "side",
                "trade_id",
            ],
            trade_rows(&all, &["m1-no"]),
        ),
        (
            format!("/v1/export/candles?market_id=m1&{range}&resolution=1m"),
            vec![
                "market_id",
                "token_id",
                "t",
                "o",
                "h",
                "l",
                "c",
                "n",
                "volume",
                "trades",
            ],
            candles_1m,
        ),
        (
            format!("/v1/export/candles?token_id=m1-yes&{range}&resolution=1h"),
            vec![
                "market_id",
                "token_id",
                "t",
                "o",
                "h",
                "l",
                "c",
                "n",
                "volume",
                "trades",
            ],
            candle_rows(&input, &all, &["m1-yes"], 3600),
        ),
        (
            format!("/v1/export/prices?market_id=m1&{range}&resolution=tick"),
            vec!["market_id", "token_id", "t", "p"],
            tick_prices,
        ),
        (
            format!("/v1/export/books?token_id=m1-yes&{range}&resolution=tick"),
            vec!["market_id", "token_id", "t", "bids", "asks"],
            tick_books,
        ),
    ];
    let read_all = |app: TestApp| {
        let (key, cases) = (key.clone(), &cases);
        async move {
            let mut files = Vec::new();
            for (path, header, want) in cases {
                let is_books = path.contains("/books");
                for format in ["csv", "parquet"] {
                    let url = format!("{path}&format={format}");
                    let (status, _, bytes) = export(&app, &key, &url).await;
                    assert_eq!(status, 200, "{url}: {}", String::from_utf8_lossy(&bytes));
                    files.push(bytes.clone());
                    let (names, mut rows) = if format == "csv" {
                        let mut records = csv_records(&String::from_utf8(bytes).unwrap());
                        let names = records.remove(0);
                        (names, records)
                    } else {
                        let (schema, rows) = parquet_rows(bytes);
                        for (name, ty, nullable) in &schema {
                            let want_ty = match name.as_str() {
                                "t" => "Timestamp(ms, \"UTC\")",
                                "n" | "trades" => "Int64",
                                "p" | "o" | "h" | "l" | "c" | "volume" | "price" | "size" => {
                                    "Float64"
                                }
                                _ => "Utf8",
                            };
                            assert_eq!(ty, want_ty, "{url}: column {name}");
                            let optional =
                                matches!(name.as_str(), "volume" | "trades" | "trade_id");
                            assert_eq!(*nullable, optional, "{url}: {name} nullable");
                        }
                        (schema.into_iter().map(|c| c.0).collect(), rows)
                    };
                    assert_eq!(names, *header, "{url}");
                    if is_books {
                        for row in &mut rows {
                            row[3] = levels(&row[3]);
                            row[4] = levels(&row[4]);
                        }
                    }
                    assert_eq!(rows.len(), want.len(), "{url}: rows");
                    assert!(rows == *want, "{url}: rows differ from the raw input's");
                }
            }
            (app, files)
        }
    };
    let (app, before) = read_all(app).await;
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
    let (app, after) = read_all(app).await;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        // Parquet files carry no time of writing: both formats compare.
        assert!(b == a, "file {i} changed across the rebuild");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trades_and_tick_exports_are_gated_by_the_plan() {
    let app = spawn_app("export-tick-plans").await;
    ingested(&app, &input()).await;
    let pro = app.key("pro").await;
    let free = app.key("free").await;
    app.clock
        .set(hindsight_schemas::Timestamp((DAY + 10 * 86_400) * 1000));
    let range = format!("start_ts={DAY}&end_ts={}", DAY + 3600);
    for (key, path, status, reason) in [
        (
            &free,
            format!("/v1/export/trades?token_id=m1-yes&{range}"),
            403,
            "historical trades",
        ),
        (
            &pro,
            format!("/v1/export/prices?token_id=m1-yes&{range}&resolution=tick"),
            403,
            "resolution tick",
        ),
        (
            &pro,
            format!("/v1/export/candles?token_id=m1-yes&{range}&resolution=tick"),
            422,
            "per bucket",
        ),
        (
            &pro,
            format!("/v1/export/metrics?market_id=m1&{range}&resolution=tick"),
            422,
            "per bucket",
        ),
    ] {
        let (got, _, bytes) = export(&app, key, &path).await;
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(got, status, "{path}: {body}");
        assert!(
            body["detail"].to_string().contains(reason),
            "{path}: {body}"
        );
    }
    // A plan with trades exports them whatever its finest bucket.
    for path in [
        format!("/v1/export/trades?token_id=m1-yes&{range}"),
        format!("/v1/export/candles?market_id=m1&{range}&resolution=1m"),
    ] {
        let (status, _, bytes) = export(&app, &pro, &path).await;
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&bytes));
    }
    app.stop().await;
}
