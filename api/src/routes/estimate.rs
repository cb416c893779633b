//! Estimates (beyond SPEC.md): how many points a history request would
//! return and roughly how many bytes, as Databento's `get_record_count`
//! answers, without reading the range: the store counts the rows where
//! they are (`ReadStore::count`; ticks `ReadStore::count_ticks`), and one
//! sampled point gives the size of each. Gated by the plan as the route it estimates, and rate-counted.

use super::history::candles_with_trades;
use super::path_id;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::page::{point_len, Point};
use crate::plans::DataPoint;
use crate::query::{EstimateKind, EstimateQuery, EstimateTarget, HistoryQuery, HISTORY_LIMIT_MAX};
use crate::ApiState;
use axum::extract::{Path, State};
use axum::Json;
use hindsight_contracts::{Range, Table, TickKey, TickKind, TickRange};
use hindsight_schemas::api::*;
use hindsight_schemas::{Granularity, Resolution};

/// JSON bytes of a page's head (ids, label, resolution), its metadata and
/// its `next_cursor`, near enough.
const PAGE_HEAD_BYTES: u64 = 256;

/// Points and approximate bytes of a prices, books, metrics, candles or
/// trades request over `[start_ts, end_ts)` (`limit`, `cursor` and `fill`
/// are ignored; filled points are not counted). Prices and books at
/// `resolution=tick` count ticks, trades (no `resolution`) trades.
#[utoipa::path(get, path = "/v1/estimate/{kind}", tag = "estimate",
    params(("kind" = String, Path, description = "`prices`, `books`, `metrics`, `candles` or `trades`"),
        EstimateTarget, EstimateQuery),
    responses((status = 200, body = EstimateResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn estimate(
    State(state): State<ApiState>,
    caller: Caller,
    Path(kind): Path<String>,
    target: EstimateTarget,
    EstimateQuery(q): EstimateQuery,
) -> Result<Json<EstimateResponse>, ApiError> {
    let kind = EstimateKind::parse_path(&kind)?;
    let counted = match (kind, q.resolution) {
        (EstimateKind::Trades, _) => Counted::Ticks(TickKind::Trade),
        (EstimateKind::Prices, Granularity::Tick) => Counted::Ticks(TickKind::Price),
        (EstimateKind::Books, Granularity::Tick) => Counted::Ticks(TickKind::Book),
        (EstimateKind::Prices | EstimateKind::Candles, _) => {
            Counted::Rows(Table::Prices, q.bucket()?)
        }
        (EstimateKind::Books, _) => Counted::Rows(Table::Books, q.bucket()?),
        (EstimateKind::Metrics, _) => Counted::Rows(Table::Metrics, q.bucket()?),
    };
    match kind {
        EstimateKind::Trades => {
            caller.plan.check_point(DataPoint::Trades)?;
            caller.plan.check_since(q.start, caller.now)?;
        }
        _ => {
            let point = match kind {
                EstimateKind::Books => DataPoint::Books,
                EstimateKind::Metrics => DataPoint::Metrics,
                _ => DataPoint::Prices,
            };
            caller
                .plan
                .check_history(point, q.resolution, q.start, caller.now)?;
        }
    }
    let ids = series(&state, kind, target).await?;
    let (mut records, mut sample) = (0, None);
    for id in &ids {
        let n = match counted {
            Counted::Rows(table, res) => state.store.count(table, id, range(res, &q)).await?,
            Counted::Ticks(tick) => state.store.count_ticks(tick, id, q.start, q.end).await?,
        };
        if n > 0 && sample.is_none() {
            sample = Some(sample_len(&state, kind, counted, id, &q).await?);
        }
        records += n;
    }
    let pages = records.div_ceil(HISTORY_LIMIT_MAX as u64).max(1);
    Ok(Json(EstimateResponse {
        records,
        bytes: records * sample.unwrap_or(0) + pages * PAGE_HEAD_BYTES,
    }))
}

/// What the store counts for an estimate: bucket rows at a resolution, or
/// ticks of a kind.
#[derive(Debug, Clone, Copy)]
enum Counted {
    Rows(Table, Resolution),
    Ticks(TickKind),
}

/// The first point of a series only: its size is the sample.
fn range(res: Resolution, q: &HistoryQuery) -> Range {
    Range {
        res,
        start: q.start,
        end: q.end,
        limit: 1,
    }
}

/// The series counted: the token, the market's tokens, or (metrics) the
/// market.
async fn series(
    state: &ApiState,
    kind: EstimateKind,
    target: EstimateTarget,
) -> Result<Vec<String>, ApiError> {
    match (target.token_id, target.market_id) {
        (Some(token), _) => {
            if kind == EstimateKind::Metrics {
                return Err(ApiError::BadRequest(
                    "Metrics are per market: give `market_id`, not `token_id`.".into(),
                ));
            }
            let token = path_id("token_id", token)?;
            let found = state.store.token(&token).await?;
            let found = found.ok_or_else(|| ApiError::NotFound("Token not found".into()))?;
            Ok(vec![found.token_id])
        }
        (None, Some(market)) => {
            let key = path_id("market_id", market)?;
            let found = state.store.market(&key).await?;
            let market = found.ok_or_else(|| ApiError::NotFound("Market not found".into()))?;
            Ok(match kind {
                EstimateKind::Metrics => vec![market.id],
                _ => market.tokens.into_iter().map(|t| t.id).collect(),
            })
        }
        (None, None) => unreachable!("EstimateTarget holds one of them"),
    }
}

/// Bytes of the first point of `id` in the span, as a page encodes it.
async fn sample_len(
    state: &ApiState,
    kind: EstimateKind,
    counted: Counted,
    id: &str,
    q: &HistoryQuery,
) -> Result<u64, ApiError> {
    let store = &state.store;
    let len = match counted {
        Counted::Ticks(tick) => {
            let span = TickRange {
                from: TickKey::at(q.start),
                end: q.end,
                limit: 1,
            };
            first_len(store.ticks(tick, id, span).await?)
        }
        Counted::Rows(table, res) => {
            let range = range(res, q);
            match (table, kind) {
                // With its trades, as the page serves it (the range's limit is 1).
                (Table::Prices, EstimateKind::Candles) => {
                    first_len(candles_with_trades(&**store, id, range).await?)
                }
                (Table::Prices, _) => first_len(store.prices(id, range).await?),
                (Table::Books, _) => first_len(store.books(id, range).await?),
                (Table::Metrics, _) => first_len(store.metrics(id, range).await?),
            }
        }
    };
    Ok(len as u64)
}

fn first_len<P: Point>(points: Vec<P>) -> usize {
    points.first().map_or(0, point_len)
}
