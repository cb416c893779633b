//! Bulk exports through the real router, over a store that serves as many
//! deterministic points as a test asks for: the file holds every point of
//! the range however many store reads it takes, a store that fails part
//! way cuts the body short instead of ending it like a whole file, and a
//! replica runs at most its export slots at once.

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use hindsight_api::routes::export::{ExportSlots, CHUNK, CONCURRENT_EXPORTS};
use hindsight_api::{keys, router, ApiParts};
use hindsight_contracts::*;
use hindsight_schemas::{MarketRecord, Timestamp};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tower::ServiceExt;

mod common;

const KEY: &str = "hsk_export_stream_test";
/// 2025-09-01T00:00:00Z
const T0: i64 = 1_756_684_800_000;
const MINUTE: i64 = 60_000;

/// The price of the `i`-th minute: distinct, and not round in decimal.
fn price(i: i64) -> f64 {
    (i % 9_973) as f64 / 9_973.0
}

/// Token `tok` of market `mkt` has one price per minute for `points`
/// minutes from T0; reads after the first `fail_after` fail.
struct Minutes {
    points: i64,
    fail_after: usize,
    reads: AtomicUsize,
}

impl Minutes {
    fn new(points: i64) -> Self {
        Minutes {
            points,
            fail_after: usize::MAX,
            reads: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl ReadStore for Minutes {
    async fn prices(&self, token_id: &str, range: Range) -> Result<Vec<PricePoint>> {
        assert_eq!(token_id, "tok");
        if self.reads.fetch_add(1, Ordering::SeqCst) >= self.fail_after {
            return Err(Error::unavailable("test", "node down"));
        }
        let first = (range.start.0 - T0).div_euclid(MINUTE).max(0);
        let end = ((range.end.0 - T0 + MINUTE - 1).div_euclid(MINUTE)).min(self.points);
        Ok((first..end)
            .take(range.limit)
            .map(|i| PricePoint {
                t: Timestamp(T0 + i * MINUTE),
                p: price(i),
            })
            .collect())
    }
    async fn candles(&self, _: &str, _: Range) -> Result<Vec<CandlePoint>> {
        Ok(Vec::new())
    }
    async fn count(&self, _: Table, _: &str, _: Range) -> Result<u64> {
        Ok(0)
    }
    async fn count_ticks(&self, _: TickKind, _: &str, _: Timestamp, _: Timestamp) -> Result<u64> {
        Ok(0)
    }
    async fn ticks(&self, _: TickKind, _: &str, _: TickRange) -> Result<Vec<Tick>> {
        Ok(Vec::new())
    }
    async fn book_at(&self, _: &str, _: Timestamp, _: Timestamp) -> Result<Option<Tick>> {
        Ok(None)
    }
    async fn metrics(&self, _: &str, _: Range) -> Result<Vec<MetricsPoint>> {
        Ok(Vec::new())
    }
    async fn books(&self, _: &str, _: Range) -> Result<Vec<BookPoint>> {
        Ok(Vec::new())
    }
    async fn token(&self, token_id: &str) -> Result<Option<TokenRef>> {
        Ok((token_id == "tok").then(|| TokenRef {
            token_id: "tok".into(),
            market_id: "mkt".into(),
            label: "Yes".into(),
        }))
    }
    async fn market(&self, _: &str) -> Result<Option<MarketRecord>> {
        Ok(None)
    }
    async fn catalog_changes(
        &self,
        _: Option<&CatalogCursor>,
    ) -> Result<(Vec<hindsight_schemas::Event>, CatalogCursor)> {
        Ok((Vec::new(), CatalogCursor::default()))
    }
}

/// One enterprise key: unlimited, so no rate window is consulted.
struct Keys(ApiKeyRecord);

#[async_trait]
impl AuthStore for Keys {
    async fn put_key(&self, _: ApiKeyRecord) -> Result<()> {
        Ok(())
    }
    async fn key_by_hash(&self, hash: [u8; 32]) -> Result<Option<ApiKeyRecord>> {
        Ok((hash == self.0.hash).then(|| self.0.clone()))
    }
    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>> {
        Ok(vec![self.0.clone()])
    }
    async fn take_hit(&self, _: &str, _: Timestamp, _: u32) -> Result<RateHits> {
        unreachable!("the key's plan is unlimited")
    }
    async fn rate_hits(&self, _: &str, _: Timestamp) -> Result<Vec<Timestamp>> {
        unreachable!("the key's plan is unlimited")
    }
}

fn app(store: Minutes, slots: ExportSlots) -> axum::Router {
    let store: Arc<dyn ReadStore> = Arc::new(store);
    // The dashboard's usage counts need an account store: a real one, in a
    // directory that outlives the router.
    let accounts = Arc::new(
        hindsight_sqlite::SqliteStore::open(&tempfile::tempdir().unwrap().keep()).unwrap(),
    );
    let auth = Arc::new(Keys(keys::record_for(KEY, "org", "enterprise")));
    router(
        ApiParts {
            exports: slots,
            ..common::parts(store, auth, accounts)
        }
        .into(),
    )
}

fn export_path(format: &str, minutes: i64) -> String {
    format!(
        "/v1/export/prices?token_id=tok&start_ts={}&end_ts={}&resolution=1m&format={format}",
        T0 / 1000,
        (T0 + minutes * MINUTE) / 1000
    )
}

async fn send(app: &axum::Router, path: &str) -> Response {
    app.clone()
        .oneshot(
            Request::get(path)
                .header("x-api-key", KEY)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap()
}

/// The whole body, or the error that cut it short.
async fn body(response: Response) -> std::result::Result<Vec<u8>, axum::Error> {
    let mut out = Vec::new();
    let mut stream = response.into_body().into_data_stream();
    while let Some(piece) = stream.next().await {
        out.extend_from_slice(&piece?);
    }
    Ok(out)
}

#[tokio::test]
async fn a_csv_export_holds_every_point_of_a_range_longer_than_many_store_reads() {
    let points = 2 * CHUNK as i64 + 1_234;
    let app = app(Minutes::new(points + 500), ExportSlots::default());
    let response = send(&app, &export_path("csv", points)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/csv; charset=utf-8");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"prices-tok-1m.csv\""
    );
    assert_eq!(headers["cache-control"], "no-store");
    let text = String::from_utf8(body(response).await.unwrap()).unwrap();
    let mut lines = text.split("\r\n");
    assert_eq!(lines.next(), Some("market_id,token_id,t,p"));
    let rows: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    assert_eq!(
        rows.len() as i64,
        points,
        "every minute of the range, none past it"
    );
    for (i, row) in rows.iter().enumerate() {
        let fields: Vec<&str> = row.split(',').collect();
        let i = i as i64;
        assert_eq!(fields[..2], ["mkt", "tok"]);
        assert_eq!(
            Timestamp::parse(fields[2]).unwrap(),
            Timestamp(T0 + i * MINUTE)
        );
        assert_eq!(
            fields[3].parse::<f64>().unwrap().to_bits(),
            price(i).to_bits()
        );
    }
}

#[tokio::test]
async fn a_parquet_export_reads_back_as_the_same_points_with_typed_columns() {
    let points = CHUNK as i64 + 7;
    let app = app(Minutes::new(points), ExportSlots::default());
    let response = send(&app, &export_path("parquet", points)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "application/vnd.apache.parquet"
    );
    let bytes = bytes::Bytes::from(body(response).await.unwrap());
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
    let schema = reader.schema().clone();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["market_id", "token_id", "t", "p"]);
    assert_eq!(
        schema.field(2).data_type().to_string(),
        "Timestamp(ms, \"UTC\")"
    );
    let mut i = 0i64;
    for batch in reader.build().unwrap() {
        let batch = batch.unwrap();
        let t = batch
            .column(2)
            .as_any()
            .downcast_ref::<arrow_array::TimestampMillisecondArray>()
            .unwrap();
        let p = batch
            .column(3)
            .as_any()
            .downcast_ref::<arrow_array::Float64Array>()
            .unwrap();
        for row in 0..batch.num_rows() {
            assert_eq!(t.value(row), T0 + i * MINUTE);
            assert_eq!(p.value(row).to_bits(), price(i).to_bits());
            i += 1;
        }
    }
    assert_eq!(i, points);
}

#[tokio::test]
async fn a_store_failure_part_way_cuts_the_body_short_instead_of_ending_it() {
    let points = 3 * CHUNK as i64;
    let mut store = Minutes::new(points);
    store.fail_after = 1; // the second read of the range fails
    let app = app(store, ExportSlots::default());
    let response = send(&app, &export_path("csv", points)).await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "the status went out first"
    );
    assert!(
        body(response).await.is_err(),
        "a failed export never ends like a whole file"
    );
}

#[tokio::test]
async fn exports_beyond_the_replicas_slots_are_refused_503_until_one_ends() {
    let points = 4 * CHUNK as i64;
    let app = app(Minutes::new(points), ExportSlots::default());
    // Bodies nobody reads: each export fills its pieces in flight and waits.
    let mut held = Vec::new();
    for _ in 0..CONCURRENT_EXPORTS {
        let response = send(&app, &export_path("csv", points)).await;
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response);
    }
    let refused = send(&app, &export_path("csv", points)).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "5");
    let detail: serde_json::Value = serde_json::from_slice(&body(refused).await.unwrap()).unwrap();
    assert!(
        detail["detail"]
            .as_str()
            .unwrap()
            .contains("Every export slot of this replica is taken"),
        "{detail}"
    );
    // A client that goes away gives its slot back.
    drop(held.pop());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let response = send(&app, &export_path("csv", 10)).await;
        if response.status() == StatusCode::OK {
            assert!(body(response).await.is_ok());
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_export_names_the_parameter_it_cannot_use() {
    let app = app(Minutes::new(10), ExportSlots::default());
    let range = format!(
        "start_ts={}&end_ts={}&resolution=1m",
        T0 / 1000,
        T0 / 1000 + 600
    );
    for (query, status, field) in [
        (format!("/v1/export/prices?{range}"), 422, "token_id"),
        (
            format!("/v1/export/prices?{range}&token_id=tok&market_id=mkt"),
            422,
            "market_id",
        ),
        (
            format!("/v1/export/prices?{range}&token_id=tok&format=xml"),
            422,
            "format",
        ),
        (
            format!("/v1/export/metrics?{range}&token_id=tok"),
            422,
            "market_id",
        ),
        (
            "/v1/export/prices?token_id=tok&resolution=1m&end_ts=1756684800".to_string(),
            422,
            "start_ts",
        ),
    ] {
        let response = send(&app, &query).await;
        assert_eq!(response.status().as_u16(), status, "{query}");
        let detail: serde_json::Value =
            serde_json::from_slice(&body(response).await.unwrap()).unwrap();
        assert_eq!(detail["detail"][0]["loc"][1], field, "{query}: {detail}");
    }
    let response = send(&app, &format!("/v1/export/prices?{range}&token_id=nope")).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}
