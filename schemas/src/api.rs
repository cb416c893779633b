//! API wire types: the JSON bodies `/v1` returns.
//!
//! Shapes follow docs/SPEC.md §2; where SPEC says "not shown" they follow the
//! official Python client's models (`polymarketdata-sdk`). Each type derives
//! `ToSchema`, so `/openapi.json` is generated from what handlers serialize.

use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use utoipa::ToSchema;

use crate::time::IsoTime;

/// `metadata` of history pages and discovery lists.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct PageMetadata {
    /// Items in this page.
    #[schema(minimum = 0)]
    pub count: usize,
    /// The requested maximum for the page.
    #[schema(minimum = 1)]
    pub limit: usize,
    /// Opaque cursor of the next page; null when there are no more results.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct TokenInfo {
    pub id: String,
    pub label: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct MarketItem {
    pub id: String,
    pub slug: String,
    pub question: Option<String>,
    pub status: String,
    /// ISO 8601 date-time.
    pub start_date: Option<String>,
    pub end_date: Option<String>,
    pub tokens: Vec<TokenInfo>,
    pub event_id: Option<String>,
}

/// One market with detail. Returned at top level (SPEC.md §4.2); the
/// official client wraps it as `{"market": …}` itself.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct MarketDetail {
    #[serde(flatten)]
    pub market: MarketItem,
    pub description: Option<String>,
    pub closed_at: Option<String>,
    pub resolved_token_id: Option<String>,
    pub resolved_token_label: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct SeriesItem {
    pub id: String,
    pub slug: String,
    pub title: String,
    pub tags: Vec<String>,
    pub status: Option<String>,
    pub start_date: Option<String>,
    pub end_date: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct EventItem {
    pub id: String,
    pub slug: String,
    pub title: String,
    pub series_id: Option<String>,
    pub tags: Vec<String>,
    pub status: Option<String>,
    pub start_date: Option<String>,
    pub end_date: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct MarketListResponse {
    pub metadata: PageMetadata,
    pub data: Vec<MarketItem>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct SeriesListResponse {
    pub metadata: PageMetadata,
    pub data: Vec<SeriesItem>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct EventListResponse {
    pub metadata: PageMetadata,
    pub data: Vec<EventItem>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct TagListResponse {
    pub count: usize,
    pub data: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct PricePoint {
    /// Bucket start, ISO 8601 UTC.
    #[schema(value_type = String)]
    pub t: IsoTime,
    /// Average probability in the bucket, 0.0 to 1.0.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub p: f64,
    /// `true` on a point `fill=previous` carried into a bucket without
    /// ticks (beyond SPEC.md); absent on every stored bucket.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub filled: bool,
}

/// The candle of one price bucket: the probability of its earliest tick
/// (`o`), greatest (`h`), least (`l`) and latest (`c`), ties on time
/// going by log position, and its number of ticks (`n`); where the bucket
/// holds trades, their summed size (`volume`) and number (`trades`), a
/// repeated trade id counted once.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct CandlePoint {
    /// Bucket start, ISO 8601 UTC.
    #[schema(value_type = String)]
    pub t: IsoTime,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub o: f64,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub h: f64,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub l: f64,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub c: f64,
    /// Price ticks in the bucket.
    #[schema(minimum = 0)]
    pub n: u64,
    /// Sum of the sizes of the bucket's trades; absent when it holds none
    /// (and on filled candles).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0)]
    pub volume: Option<f64>,
    /// Number of the bucket's trades (a repeated trade id once); absent
    /// when it holds none (and on filled candles).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub trades: Option<u64>,
    /// `true` on a candle `fill=previous` made for a bucket without ticks
    /// (the previous close as `o`, `h`, `l` and `c`; `n` 0); absent on
    /// every stored bucket.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub filled: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct MetricsPoint {
    /// Bucket start, ISO 8601 UTC.
    #[schema(value_type = String)]
    pub t: IsoTime,
    /// Averages over the bucket.
    pub volume: f64,
    pub liquidity: f64,
    pub spread: f64,
}

/// The last snapshot in the bucket. Levels are `[price, size]`, best first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BookPoint {
    /// Bucket start, ISO 8601 UTC.
    #[schema(value_type = String)]
    pub t: IsoTime,
    #[schema(value_type = Vec<Vec<f64>>)]
    pub bids: Box<RawValue>,
    #[schema(value_type = Vec<Vec<f64>>)]
    pub asks: Box<RawValue>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct TokenPricesResponse {
    pub market_id: String,
    pub token_id: String,
    pub token_label: String,
    pub resolution: String,
    pub data: Vec<PricePoint>,
    pub metadata: PageMetadata,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenBooksResponse {
    pub market_id: String,
    pub token_id: String,
    pub token_label: String,
    pub resolution: String,
    pub data: Vec<BookPoint>,
    pub metadata: PageMetadata,
}

/// One trade, as ingested. `trade_id` is null when the trade came without one.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct TradePoint {
    #[schema(value_type = String)]
    pub t: IsoTime,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub price: f64,
    #[schema(minimum = 0.0)]
    pub size: f64,
    #[schema(pattern = "^(buy|sell)$")]
    pub side: String,
    pub trade_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct TokenTradesResponse {
    pub market_id: String,
    pub token_id: String,
    pub token_label: String,
    pub data: Vec<TradePoint>,
    pub metadata: PageMetadata,
}

/// The book at a moment: the latest snapshot at or before it, with its
/// exact time `t`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BookAtResponse {
    pub token_id: String,
    #[schema(value_type = String)]
    pub t: IsoTime,
    #[schema(value_type = Vec<Vec<f64>>)]
    pub bids: Box<RawValue>,
    #[schema(value_type = Vec<Vec<f64>>)]
    pub asks: Box<RawValue>,
}

/// The book at a moment of every token of a market: `tokens` (label → id,
/// every token) and `data` (label → the token's book; a token without a
/// snapshot at or before the moment is absent).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MarketBookAtResponse {
    pub market_id: String,
    pub tokens: BTreeMap<String, String>,
    pub data: BTreeMap<String, BookAtResponse>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct MarketPricesResponse {
    pub market_id: String,
    pub resolution: String,
    /// Token label → token id, for every token of the market.
    pub tokens: BTreeMap<String, String>,
    /// Token label → chronological points.
    pub data: BTreeMap<String, Vec<PricePoint>>,
    pub metadata: PageMetadata,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct TokenCandlesResponse {
    pub market_id: String,
    pub token_id: String,
    pub token_label: String,
    pub resolution: String,
    pub data: Vec<CandlePoint>,
    pub metadata: PageMetadata,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct MarketCandlesResponse {
    pub market_id: String,
    pub resolution: String,
    /// Token label → token id, for every token of the market.
    pub tokens: BTreeMap<String, String>,
    /// Token label → chronological candles.
    pub data: BTreeMap<String, Vec<CandlePoint>>,
    pub metadata: PageMetadata,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MarketBooksResponse {
    pub market_id: String,
    pub resolution: String,
    pub tokens: BTreeMap<String, String>,
    pub data: BTreeMap<String, Vec<BookPoint>>,
    pub metadata: PageMetadata,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct MetricsResponse {
    pub market_id: String,
    pub resolution: String,
    pub data: Vec<MetricsPoint>,
    pub metadata: PageMetadata,
}

/// An export job (beyond SPEC.md): a bulk export run in the background,
/// its progress, and where to download its file once it is done.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct ExportJobResponse {
    pub id: String,
    /// `prices`, `books` or `metrics`.
    pub kind: String,
    /// `csv` or `parquet`.
    pub format: String,
    /// `queued`, `running`, `done` or `failed`.
    pub status: String,
    /// Rows written so far (the file's, when done).
    #[schema(minimum = 0)]
    pub rows: u64,
    /// Bytes written so far (the file's, when done).
    #[schema(minimum = 0)]
    pub bytes: u64,
    /// Rows the export was estimated to hold when it was created.
    #[schema(minimum = 0)]
    pub total_rows: u64,
    /// `rows / total_rows`, from 0 to 1 (1 when done).
    pub progress: f64,
    /// ISO 8601.
    pub created_at: String,
    /// When it became `done` or `failed` (ISO 8601).
    pub finished_at: Option<String>,
    /// Until when the file is kept (ISO 8601), once finished.
    pub expires_at: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// The name the download carries.
    pub filename: String,
    /// `/v1/exports/{id}/download` once done, else null.
    pub download_url: Option<String>,
}

/// The caller's export jobs, newest first.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct ExportJobList {
    pub data: Vec<ExportJobResponse>,
}

/// What a history request would return, without reading it (beyond
/// SPEC.md): its points and the approximate bytes of its pages.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct EstimateResponse {
    /// Points the range holds (market routes: across every token), as
    /// counted by the store.
    #[schema(minimum = 0)]
    pub records: u64,
    /// Approximate JSON bytes of every page at `limit=200`: one sampled
    /// point's encoding times `records`, plus each page's head.
    #[schema(minimum = 0)]
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct HealthResponse {
    pub status: String,
    /// Server time, ISO 8601 UTC.
    pub timestamp: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct DataPoints {
    pub metrics: bool,
    pub prices: bool,
    pub books: bool,
    pub trades: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct UsageLimits {
    /// Requests allowed per minute; -1 on unlimited plans.
    pub requests_per_minute: i64,
    /// Requests left in the current window; -1 on unlimited plans.
    pub requests_remaining: i64,
    /// Finest resolution allowed.
    pub granularity_allowed: String,
    /// Rolling lookback window in days.
    pub max_history_days: i64,
    pub data_points: DataPoints,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct UsageResponse {
    pub plan: String,
    pub organization: String,
    pub limits: UsageLimits,
    /// Unix seconds when the rate window resets; null on unlimited plans.
    pub reset_at: Option<i64>,
}

/// Error body: a human-readable `detail`.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct ErrorResponse {
    pub detail: String,
}

/// One failed parameter of a 422, in FastAPI's shape.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct ValidationIssue {
    /// Path to the parameter, e.g. `["query", "limit"]`.
    pub loc: Vec<String>,
    pub msg: String,
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct ValidationErrorResponse {
    pub detail: Vec<ValidationIssue>,
}
