//! Bulk export: a whole range of one token's or one market's history as a
//! single CSV or Parquet file, instead of hundreds of 200-point pages:
//! buckets (prices, books, metrics, candles with their trades) or ticks
//! (prices and books at `resolution=tick`, trades), read by the same job.
//!
//! The handler checks the plan and the series, then answers at once with a
//! streamed body. A task reads the store [`CHUNK`] points at a time into an
//! [`Encoder`] and sends each piece of the file as it fills, through a
//! channel of [`PIECES_IN_FLIGHT`] pieces: a slow reader holds the reading
//! task back instead of letting the file pile up in memory, so an export of
//! any length costs one chunk, one piece in the encoder and the pieces in
//! flight. Each replica runs at most [`ExportSlots`] exports at once (more
//! wait for none: 503 with `Retry-After`), and a client that stops reading
//! for [`SEND_TIMEOUT`] loses its export, so neither many nor stalled
//! downloads can hold a replica.
//!
//! A failure after the status line was sent (the store fails mid-file) can
//! no longer change the status: the body is then cut without its final
//! chunk, which every HTTP client reports as an incomplete transfer, and
//! the cause is logged and counted once. An export that completes is the
//! whole range: nothing is skipped.
//!
//! An export whose estimate exceeds the replica's `max_sync_rows` is
//! refused (413) and pointed at `POST /v1/exports`: a job
//! ([`crate::jobs`]) runs the same [`Job`] producer into stored chunks
//! instead of a response body ([`Pieces`] is where the pieces go), so a
//! job's file is byte for byte the file this route would have sent.

use super::history::{candles_with_trades, market, token};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::export::{
    integer, number, optional, text, time, Cell, Column, EncodeError, Encoder, Format,
};
use crate::plans::DataPoint;
use crate::query::{ExportQuery, MarketExportQuery, TradesExportQuery};
use crate::ApiState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hindsight_contracts::{
    self as read, Range, Table, Tick, TickKey, TickKind, TickRange, TickValue,
};
use hindsight_schemas::api::ErrorResponse;
use hindsight_schemas::{Granularity, Timestamp, TradeSide};
use hindsight_telemetry as tm;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Points read from the store per query.
pub const CHUNK: usize = 10_000;
/// File pieces sent but not yet taken by the connection.
pub const PIECES_IN_FLIGHT: usize = 2;
/// How long a piece may wait for the client to read before the export is
/// dropped.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Exports one replica runs at once, by default.
pub const CONCURRENT_EXPORTS: usize = 4;
/// `Retry-After` of an export refused because every slot is taken.
const BUSY_RETRY_AFTER_SECS: u32 = 5;

const PRICES: &[Column] = &[text("market_id"), text("token_id"), time("t"), number("p")];
const BOOKS: &[Column] = &[
    text("market_id"),
    text("token_id"),
    time("t"),
    text("bids"),
    text("asks"),
];
const TRADES: &[Column] = &[
    text("market_id"),
    text("token_id"),
    time("t"),
    number("price"),
    number("size"),
    text("side"),
    optional(text("trade_id")),
];
const CANDLES: &[Column] = &[
    text("market_id"),
    text("token_id"),
    time("t"),
    number("o"),
    number("h"),
    number("l"),
    number("c"),
    integer("n"),
    optional(number("volume")),
    optional(integer("trades")),
];
const METRICS: &[Column] = &[
    text("market_id"),
    time("t"),
    number("volume"),
    number("liquidity"),
    number("spread"),
];

/// The exports a replica may run at once.
#[derive(Clone)]
pub struct ExportSlots(Arc<Semaphore>);

impl ExportSlots {
    pub fn new(n: usize) -> Self {
        ExportSlots(Arc::new(Semaphore::new(n)))
    }

    fn take(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        self.0.clone().try_acquire_owned().map_err(|_| busy())
    }
}

impl Default for ExportSlots {
    fn default() -> Self {
        ExportSlots::new(CONCURRENT_EXPORTS)
    }
}

fn busy() -> ApiError {
    ApiError::Unavailable {
        detail: format!(
            "Every export slot of this replica is taken ({CONCURRENT_EXPORTS} at once); \
             retry in {BUSY_RETRY_AFTER_SECS} seconds."
        ),
        retry_after: BUSY_RETRY_AFTER_SECS,
    }
}

/// What an export holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Prices,
    Books,
    Metrics,
    /// Every (deduplicated) trade: tick level only.
    Trades,
    /// The candles of the price buckets, with their trades' volume and
    /// count.
    Candles,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Prices,
        Kind::Books,
        Kind::Metrics,
        Kind::Trades,
        Kind::Candles,
    ];

    /// The kind a word names (`POST /v1/exports?kind=`).
    pub fn parse(word: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == word)
    }

    /// Whether the export is of a token or a market (else of a market
    /// only), as its query parser takes it.
    pub fn by_token(self) -> bool {
        !matches!(self, Kind::Metrics)
    }

    /// Whether its query takes `resolution` (trades are kept one by one:
    /// always `tick`).
    pub fn by_resolution(self) -> bool {
        !matches!(self, Kind::Trades)
    }

    /// The bucket table the store counts its rows in (a candle per price
    /// row); none for trades, kept tick by tick.
    fn table(self) -> Option<Table> {
        match self {
            Kind::Prices | Kind::Candles => Some(Table::Prices),
            Kind::Books => Some(Table::Books),
            Kind::Metrics => Some(Table::Metrics),
            Kind::Trades => None,
        }
    }

    /// Its ticks, for an export at `tick`; none for candles and metrics,
    /// kept only per bucket.
    fn ticks(self) -> Option<TickKind> {
        match self {
            Kind::Prices => Some(TickKind::Price),
            Kind::Books => Some(TickKind::Book),
            Kind::Trades => Some(TickKind::Trade),
            Kind::Metrics | Kind::Candles => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Prices => "prices",
            Kind::Books => "books",
            Kind::Metrics => "metrics",
            Kind::Trades => "trades",
            Kind::Candles => "candles",
        }
    }

    fn columns(self) -> &'static [Column] {
        match self {
            Kind::Prices => PRICES,
            Kind::Books => BOOKS,
            Kind::Metrics => METRICS,
            Kind::Trades => TRADES,
            Kind::Candles => CANDLES,
        }
    }

    /// The id a series is read by.
    fn id(self, s: &Series) -> &str {
        match self {
            Kind::Metrics => &s.market_id,
            Kind::Prices | Kind::Books | Kind::Trades | Kind::Candles => &s.token_id,
        }
    }

    fn point(self) -> DataPoint {
        match self {
            Kind::Prices | Kind::Candles => DataPoint::Prices,
            Kind::Books => DataPoint::Books,
            Kind::Metrics => DataPoint::Metrics,
            Kind::Trades => DataPoint::Trades,
        }
    }

    /// Refuses (422) `tick` for candles and metrics, kept only per bucket.
    /// (Trades take no `resolution`: their query is always `tick`.)
    fn check_granularity(self, asked: Granularity) -> Result<(), ApiError> {
        match (self, asked) {
            (Kind::Candles | Kind::Metrics, Granularity::Tick) => {
                Err(ApiError::Validation(vec![crate::error::issue(
                    "query",
                    "resolution",
                    format!(
                        "{} are kept per bucket: give a resolution from 1m to 1d \
                         (tick exports prices and books)",
                        self.as_str()
                    ),
                    "enum",
                )]))
            }
            _ => Ok(()),
        }
    }

    /// The plan's gate: the history route's (data point, finest
    /// resolution, lookback); trades as `/v1/tokens/{token_id}/trades`
    /// (their data point and lookback: a plan with trades reads them one by
    /// one whatever its finest bucket).
    fn check_plan(self, caller: &Caller, q: &ExportQuery) -> Result<(), ApiError> {
        let plan = &caller.plan;
        match self {
            Kind::Trades => {
                plan.check_point(DataPoint::Trades)?;
                plan.check_since(q.start, caller.now)
            }
            _ => plan.check_history(self.point(), q.resolution, q.start, caller.now),
        }
    }
}

/// One series of the file: a token (prices, books) or a market (metrics).
#[derive(Debug, Clone)]
pub(crate) struct Series {
    market_id: String,
    token_id: String,
}

/// A stored point as a row of the file.
trait Exported: Send + 'static {
    fn encode(&self, series: &Series, enc: &mut Encoder) -> Result<(), EncodeError>;
}

impl Exported for read::PricePoint {
    fn encode(&self, s: &Series, enc: &mut Encoder) -> Result<(), EncodeError> {
        enc.row(&[
            Cell::Text(&s.market_id),
            Cell::Text(&s.token_id),
            Cell::Time(self.t),
            Cell::Number(self.p),
        ])
    }
}

impl Exported for read::BookPoint {
    fn encode(&self, s: &Series, enc: &mut Encoder) -> Result<(), EncodeError> {
        enc.row(&[
            Cell::Text(&s.market_id),
            Cell::Text(&s.token_id),
            Cell::Time(self.t),
            Cell::Text(&self.bids),
            Cell::Text(&self.asks),
        ])
    }
}

impl Exported for read::MetricsPoint {
    fn encode(&self, s: &Series, enc: &mut Encoder) -> Result<(), EncodeError> {
        enc.row(&[
            Cell::Text(&s.market_id),
            Cell::Time(self.t),
            Cell::Number(self.volume),
            Cell::Number(self.liquidity),
            Cell::Number(self.spread),
        ])
    }
}

impl Exported for Tick {
    fn encode(&self, s: &Series, enc: &mut Encoder) -> Result<(), EncodeError> {
        let (m, tok, t) = (
            Cell::Text(&s.market_id),
            Cell::Text(&s.token_id),
            Cell::Time(self.key.ts),
        );
        match &self.value {
            TickValue::Price { p } => enc.row(&[m, tok, t, Cell::Number(*p)]),
            TickValue::Book { bids, asks } => {
                enc.row(&[m, tok, t, Cell::Text(bids), Cell::Text(asks)])
            }
            TickValue::Trade {
                price,
                size,
                side,
                trade_id,
            } => enc.row(&[
                m,
                tok,
                t,
                Cell::Number(*price),
                Cell::Number(*size),
                Cell::Text(match side {
                    TradeSide::Buy => "buy",
                    TradeSide::Sell => "sell",
                }),
                trade_id.as_deref().map_or(Cell::Null, Cell::Text),
            ]),
        }
    }
}

impl Exported for read::CandlePoint {
    /// A bucket projected before candles were stored cannot be exported
    /// (the status line is gone by then): the file is cut, and logged.
    fn encode(&self, s: &Series, enc: &mut Encoder) -> Result<(), EncodeError> {
        let c = self.candle.as_ref().ok_or_else(|| {
            EncodeError(format!(
                "the candle of the bucket at {} of {} was not stored (projected before \
                 candles were); `hindsight rebuild` fills it",
                self.t.to_rfc3339(),
                s.token_id
            ))
        })?;
        enc.row(&[
            Cell::Text(&s.market_id),
            Cell::Text(&s.token_id),
            Cell::Time(self.t),
            Cell::Number(c.open.p),
            Cell::Number(c.high),
            Cell::Number(c.low),
            Cell::Number(c.close.p),
            Cell::Integer(self.count),
            self.trades.map_or(Cell::Null, |t| Cell::Number(t.volume)),
            self.trades.map_or(Cell::Null, |t| Cell::Integer(t.count)),
        ])
    }
}

macro_rules! export_route {
    ($name:ident, $query:ty, $kind:expr, $path:literal, $what:literal) => {
        #[doc = $what]
        #[utoipa::path(get, path = $path, tag = "export",
            params($query),
            responses(
                (status = 200, description = "The whole range as one file, streamed (`format`). A body cut short (no final chunk) is an export that failed part way: retry it.",
                    content((String = "text/csv"), (Vec<u8> = "application/vnd.apache.parquet"))),
                (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
                (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse),
                (status = 413, description = "More rows than one response carries (`--export-max-sync-rows`): create the export as a job with `POST /v1/exports`", body = ErrorResponse),
                (status = 422, body = hindsight_schemas::api::ValidationErrorResponse),
                (status = 429, body = ErrorResponse), (status = 503, body = ErrorResponse)))]
        pub async fn $name(
            State(state): State<ApiState>,
            caller: Caller,
            q: $query,
        ) -> Result<Response, ApiError> {
            export(state, caller, q.into(), $kind).await
        }
    };
}

export_route!(
    export_prices,
    ExportQuery,
    Kind::Prices,
    "/v1/export/prices",
    "Price history of a token, or of every token of a market, as one file: \
     columns `market_id, token_id, t, p`, by token, then time; with `resolution=tick`, \
     every price tick as ingested (`t` its exact time; ticks sharing one in log order)."
);
export_route!(
    export_books,
    ExportQuery,
    Kind::Books,
    "/v1/export/books",
    "Order-book history of a token, or of every token of a market, as one file: \
     columns `market_id, token_id, t, bids, asks` (levels as JSON text `[[price,size],…]`), \
     by token, then time; with `resolution=tick`, every snapshot as ingested."
);
export_route!(
    export_trades,
    TradesExportQuery,
    Kind::Trades,
    "/v1/export/trades",
    "Trades of a token, or of every token of a market, as one file: columns \
     `market_id, token_id, t, price, size, side, trade_id` (`trade_id` empty/null when the \
     trade had none), by token, then time (ties in log order); a repeated trade id once, \
     at its first arrival. Trades are exported one by one (no `resolution`), gated as \
     `/v1/tokens/{token_id}/trades`: the plan's trades and lookback."
);
export_route!(
    export_candles,
    ExportQuery,
    Kind::Candles,
    "/v1/export/candles",
    "Candles of a token, or of every token of a market, as one file: columns \
     `market_id, token_id, t, o, h, l, c, n, volume, trades` (`volume` and `trades` empty/null \
     for a bucket without trades), by token, then time."
);
export_route!(
    export_metrics,
    MarketExportQuery,
    Kind::Metrics,
    "/v1/export/metrics",
    "Metrics history of a market as one file: columns `market_id, t, volume, liquidity, spread`."
);

async fn export(
    state: ApiState,
    caller: Caller,
    q: ExportQuery,
    kind: Kind,
) -> Result<Response, ApiError> {
    let export = prepare(&state, &caller, &q, kind).await?;
    let rows = export.rows(&state).await?;
    let max = state.jobs.config.max_sync_rows;
    if rows > max {
        return Err(ApiError::TooLarge(format!(
            "This export holds {rows} rows, more than the {max} one response may carry: \
             create it as a job with POST /v1/exports?kind={} and the same parameters, \
             then download it when it is done.",
            kind.as_str()
        )));
    }
    let slot = state.exports.take()?;
    let encoder = export.encoder()?;
    let (tx, rx) = mpsc::channel(PIECES_IN_FLIGHT);
    let filename = format!("attachment; filename=\"{}\"", export.filename());
    let format = export.format;
    let (job, series) = Job::new(state, export, Sink { tx, sent: 0 });
    tokio::spawn(job.run(series, encoder, slot));
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    }));
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    // The name is ids the store resolved, restricted to what a filename
    // and a header may hold.
    if let Ok(value) = HeaderValue::from_str(&filename) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    Ok(response)
}

/// An export checked and resolved: what its file holds, ready to produce.
pub(crate) struct Export {
    pub kind: Kind,
    pub format: Format,
    span: Span,
    series: Vec<Series>,
    /// Ids the store resolved, made safe for a filename and a header.
    name: String,
}

/// Checks `q` against the caller's plan, then resolves it: one mechanism
/// for the streamed route and for export jobs.
pub(crate) async fn prepare(
    state: &ApiState,
    caller: &Caller,
    q: &ExportQuery,
    kind: Kind,
) -> Result<Export, ApiError> {
    kind.check_granularity(q.resolution)?;
    kind.check_plan(caller, q)?;
    resolve(state, q, kind).await
}

/// The series and range of an export the plan allowed (a job resolves its
/// stored query again when it runs, without the caller).
pub(crate) async fn resolve(
    state: &ApiState,
    q: &ExportQuery,
    kind: Kind,
) -> Result<Export, ApiError> {
    let (series, name) = series(state, q, kind).await?;
    Ok(Export {
        kind,
        format: q.format,
        span: Span {
            granularity: q.resolution,
            start: q.start,
            end: q.end,
        },
        series,
        name,
    })
}

impl Export {
    /// Rows the file will hold, as the store counts them (bucket rows at a
    /// resolution, ticks at `tick`), without reading them.
    pub(crate) async fn rows(&self, state: &ApiState) -> Result<u64, ApiError> {
        let Span { start, end, .. } = self.span;
        let mut rows = 0;
        for s in &self.series {
            let id = self.kind.id(s);
            rows += match (self.span.granularity, self.kind.table(), self.kind.ticks()) {
                (Granularity::Bucket(res), Some(table), _) => {
                    let range = Range {
                        res,
                        start,
                        end,
                        limit: CHUNK,
                    };
                    state.store.count(table, id, range).await?
                }
                (Granularity::Tick, _, Some(kind)) => {
                    state.store.count_ticks(kind, id, start, end).await?
                }
                // `Kind::check_granularity` and the trades query let no
                // other pair through.
                (granularity, ..) => {
                    return Err(ApiError::invariant(format!(
                        "{} exported at {}",
                        self.kind.as_str(),
                        granularity.as_str()
                    )))
                }
            };
        }
        Ok(rows)
    }

    pub(crate) fn filename(&self) -> String {
        format!(
            "{}-{}-{}.{}",
            self.kind.as_str(),
            self.name,
            self.span.granularity.as_str(),
            self.format.as_str()
        )
    }

    pub(crate) fn encoder(&self) -> Result<Encoder, ApiError> {
        Encoder::new(self.format, self.kind.columns())
            .map_err(|e| ApiError::invariant(e.to_string()))
    }
}

/// The series an export reads, in file order, and a name for the file.
async fn series(
    state: &ApiState,
    q: &ExportQuery,
    kind: Kind,
) -> Result<(Vec<Series>, String), ApiError> {
    let safe = |id: &str| -> String {
        id.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect()
    };
    match (&q.token_id, &q.market_id, kind) {
        (Some(token_id), _, Kind::Prices | Kind::Books | Kind::Trades | Kind::Candles) => {
            let t = token(state, token_id.clone()).await?;
            let name = safe(&t.token_id);
            Ok((
                vec![Series {
                    market_id: t.market_id,
                    token_id: t.token_id,
                }],
                name,
            ))
        }
        (None, Some(market_id), Kind::Prices | Kind::Books | Kind::Trades | Kind::Candles) => {
            let m = market(state, market_id.clone()).await?;
            let series = m
                .tokens
                .iter()
                .map(|t| Series {
                    market_id: m.id.clone(),
                    token_id: t.id.clone(),
                })
                .collect();
            Ok((series, safe(&m.id)))
        }
        (_, Some(market_id), Kind::Metrics) => {
            let m = market(state, market_id.clone()).await?;
            Ok((
                vec![Series {
                    market_id: m.id.clone(),
                    token_id: String::new(),
                }],
                safe(&m.id),
            ))
        }
        // The extractor lets through only what some kind accepts.
        _ => Err(ApiError::Validation(vec![crate::error::issue(
            "query",
            "market_id",
            "Metrics are per market: give `market_id`",
            "missing",
        )])),
    }
}

/// Why an export stopped before its end.
pub(crate) enum Stop {
    /// The client went away (or a job's lease was taken over by another
    /// claim): nothing to report to anyone.
    Gone,
    /// The client stopped reading for [`SEND_TIMEOUT`].
    Stalled,
    Store(read::Error),
    Encode(EncodeError),
}

impl From<read::Error> for Stop {
    fn from(e: read::Error) -> Self {
        Stop::Store(e)
    }
}

impl From<EncodeError> for Stop {
    fn from(e: EncodeError) -> Self {
        Stop::Encode(e)
    }
}

/// Where the pieces of a file go, in order: a response body ([`Sink`]) or
/// a job's stored chunks. `rows` is how many rows the file holds so far.
pub(crate) trait Pieces: Send {
    async fn send(&mut self, piece: Vec<u8>, rows: u64) -> Result<(), Stop>;
}

/// The pieces of a streamed response body.
struct Sink {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    sent: u64,
}

impl Pieces for Sink {
    async fn send(&mut self, piece: Vec<u8>, _rows: u64) -> Result<(), Stop> {
        if piece.is_empty() {
            return Ok(());
        }
        let len = piece.len() as u64;
        match tokio::time::timeout(SEND_TIMEOUT, self.tx.send(Ok(Bytes::from(piece)))).await {
            Ok(Ok(())) => {
                self.sent += len;
                Ok(())
            }
            Ok(Err(_)) => Err(Stop::Gone),
            Err(_) => Err(Stop::Stalled),
        }
    }
}

/// What an export covers: `start <= t < end`, per bucket or tick by tick.
#[derive(Debug, Clone, Copy)]
struct Span {
    granularity: Granularity,
    start: Timestamp,
    end: Timestamp,
}

/// One running export: reads, encodes and sends until the span is done.
pub(crate) struct Job<S> {
    state: ApiState,
    kind: Kind,
    format: Format,
    span: Span,
    pub sink: S,
    /// Rows encoded so far.
    pub rows: u64,
}

impl<S: Pieces> Job<S> {
    /// The producer of `export`'s file into `sink`, and the series it reads.
    pub(crate) fn new(state: ApiState, export: Export, sink: S) -> (Self, Vec<Series>) {
        let job = Job {
            state,
            kind: export.kind,
            format: export.format,
            span: export.span,
            sink,
            rows: 0,
        };
        (job, export.series)
    }

    /// The whole file, piece by piece, into the sink.
    pub(crate) async fn produce(
        &mut self,
        series: &[Series],
        mut encoder: Encoder,
    ) -> Result<(), Stop> {
        self.write(series, &mut encoder).await?;
        let rest = encoder.finish()?;
        self.sink.send(rest, self.rows).await
    }
}

impl Job<Sink> {
    async fn run(mut self, series: Vec<Series>, encoder: Encoder, _slot: OwnedSemaphorePermit) {
        let outcome = self.produce(&series, encoder).await;
        let (kind, format) = (self.kind.as_str(), self.format.as_str());
        metrics::counter!(tm::API_EXPORT_BYTES, "kind" => kind, "format" => format)
            .increment(self.sink.sent);
        let cause = match outcome {
            Ok(()) => return,
            Err(Stop::Gone) => {
                tracing::debug!(
                    kind,
                    format,
                    sent = self.sink.sent,
                    "export abandoned by the client"
                );
                "client_gone"
            }
            Err(Stop::Stalled) => {
                tracing::warn!(
                    kind,
                    format,
                    sent = self.sink.sent,
                    timeout_secs = SEND_TIMEOUT.as_secs(),
                    "export dropped: the client stopped reading"
                );
                "client_stalled"
            }
            Err(Stop::Store(e)) => {
                tracing::error!(kind, format, sent = self.sink.sent, error = %e, "export cut short: the store failed");
                self.cut().await;
                "store"
            }
            Err(Stop::Encode(e)) => {
                tracing::error!(kind, format, sent = self.sink.sent, error = %e, "export cut short");
                self.cut().await;
                "encode"
            }
        };
        metrics::counter!(tm::API_EXPORTS_CUT, "kind" => kind, "cause" => cause).increment(1);
    }

    /// Ends the body with an error, so the connection drops it without its
    /// final chunk: the client sees an incomplete transfer, never a file
    /// that looks whole.
    async fn cut(&mut self) {
        let error = std::io::Error::other("export cut short");
        let _ = tokio::time::timeout(SEND_TIMEOUT, self.sink.tx.send(Err(error))).await;
    }
}

impl<S: Pieces> Job<S> {
    async fn write(&mut self, series: &[Series], enc: &mut Encoder) -> Result<(), Stop> {
        let store = self.state.store.clone();
        let store = &*store;
        let Span { start, end, .. } = self.span;
        for s in series {
            let Granularity::Bucket(res) = self.span.granularity else {
                // `Kind::check_granularity` lets no other kind through at tick.
                let Some(kind) = self.kind.ticks() else {
                    return Err(Stop::Encode(EncodeError(format!(
                        "{} exported at tick",
                        self.kind.as_str()
                    ))));
                };
                let read = |id: String, from| async move {
                    let range = TickRange {
                        from,
                        end,
                        limit: CHUNK,
                    };
                    store.ticks(kind, &id, range).await
                };
                let next = |t: &Tick| TickKey {
                    offset: t.key.offset + 1,
                    ..t.key
                };
                self.drain(s, enc, TickKey::at(start), read, next).await?;
                continue;
            };
            let range = move |start| Range {
                res,
                start,
                end,
                limit: CHUNK,
            };
            let width = res.width_ms();
            match self.kind {
                Kind::Prices => {
                    let read = |id: String, t| async move { store.prices(&id, range(t)).await };
                    let next = |p: &read::PricePoint| Timestamp(p.t.0 + width);
                    self.drain(s, enc, start, read, next).await?
                }
                Kind::Books => {
                    let read = |id: String, t| async move { store.books(&id, range(t)).await };
                    let next = |p: &read::BookPoint| Timestamp(p.t.0 + width);
                    self.drain(s, enc, start, read, next).await?
                }
                Kind::Metrics => {
                    let read = |id: String, t| async move { store.metrics(&id, range(t)).await };
                    let next = |p: &read::MetricsPoint| Timestamp(p.t.0 + width);
                    self.drain(s, enc, start, read, next).await?
                }
                Kind::Candles => {
                    let read = |id: String, t| async move {
                        candles_with_trades(store, &id, range(t)).await
                    };
                    let next = |p: &read::CandlePoint| Timestamp(p.t.0 + width);
                    self.drain(s, enc, start, read, next).await?
                }
                // Trades are always queried at tick (`TradesExportQuery`).
                Kind::Trades => {
                    return Err(Stop::Encode(EncodeError(
                        "trades exported per bucket".into(),
                    )))
                }
            }
        }
        Ok(())
    }

    /// Every point of one series in the span, [`CHUNK`] at a time: `read`
    /// reads from a place, `next` is the place after a point.
    async fn drain<P, K, F, Fut>(
        &mut self,
        s: &Series,
        enc: &mut Encoder,
        mut from: K,
        read: F,
        next: impl Fn(&P) -> K,
    ) -> Result<(), Stop>
    where
        P: Exported,
        F: Fn(String, K) -> Fut,
        Fut: std::future::Future<Output = read::Result<Vec<P>>>,
    {
        let id = self.kind.id(s);
        loop {
            let points = read(id.to_string(), from).await?;
            for p in &points {
                p.encode(s, enc)?;
                self.rows += 1;
                if let Some(piece) = enc.ready()? {
                    self.sink.send(piece, self.rows).await?;
                }
            }
            match points.last() {
                Some(last) if points.len() == CHUNK => from = next(last),
                _ => return Ok(()),
            }
        }
    }
}
