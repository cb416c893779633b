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
