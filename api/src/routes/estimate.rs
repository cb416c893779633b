//! Estimates (beyond SPEC.md): how many points a history request would
//! return and roughly how many bytes, as Databento's `get_record_count`
//! answers, without reading the range: the store counts the rows where
//! they are (`ReadStore::count`), and one sampled point gives the size of
//! each. Gated by the plan as the route it estimates, and rate-counted.

use super::history::candles_with_trades;
use super::path_id;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::page::{point_len, Point};
use crate::plans::DataPoint;
use crate::query::{EstimateKind, EstimateTarget, HistoryQuery, HISTORY_LIMIT_MAX};
use crate::ApiState;
use axum::extract::{Path, State};
use axum::Json;
use hindsight_contracts::{Range, Table};
use hindsight_schemas::api::*;

/// JSON bytes of a page's head (ids, label, resolution), its metadata and
/// its `next_cursor`, near enough.
const PAGE_HEAD_BYTES: u64 = 256;

/// Points and approximate bytes of a prices, books, metrics or candles
/// request over `[start_ts, end_ts)` (`limit`, `cursor` and `fill` are
/// ignored; filled points are not counted).
#[utoipa::path(get, path = "/v1/estimate/{kind}", tag = "estimate",
    params(("kind" = String, Path, description = "`prices`, `books`, `metrics` or `candles`"),
        EstimateTarget, HistoryQuery),
    responses((status = 200, body = EstimateResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn estimate(
    State(state): State<ApiState>,
    caller: Caller,
    Path(kind): Path<String>,
    target: EstimateTarget,
    q: HistoryQuery,
) -> Result<Json<EstimateResponse>, ApiError> {
    let kind = EstimateKind::parse_path(&kind)?;
    let (point, table) = match kind {
        EstimateKind::Prices | EstimateKind::Candles => (DataPoint::Prices, Table::Prices),
        EstimateKind::Books => (DataPoint::Books, Table::Books),
        EstimateKind::Metrics => (DataPoint::Metrics, Table::Metrics),
    };
    let res = q.bucket()?;
    caller
        .plan
        .check_history(point, q.resolution, q.start, caller.now)?;
    let ids = series(&state, kind, target).await?;
    let range = Range {
        res,
        start: q.start,
        end: q.end,
        limit: 1,
    };
    let (mut records, mut sample) = (0, None);
    for id in &ids {
        let n = state.store.count(table, id, range).await?;
        if n > 0 && sample.is_none() {
            sample = Some(sample_len(&state, kind, id, range).await?);
        }
        records += n;
    }
    let pages = records.div_ceil(HISTORY_LIMIT_MAX as u64).max(1);
    Ok(Json(EstimateResponse {
        records,
        bytes: records * sample.unwrap_or(0) + pages * PAGE_HEAD_BYTES,
    }))
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

/// Bytes of the first point of `id` in `range`, as a page encodes it.
async fn sample_len(
    state: &ApiState,
    kind: EstimateKind,
    id: &str,
    range: Range,
) -> Result<u64, ApiError> {
    let store = &state.store;
    let len = match kind {
        EstimateKind::Prices => first_len(store.prices(id, range).await?),
        // With its trades, as the page serves it (the range's limit is 1).
        EstimateKind::Candles => first_len(candles_with_trades(&**store, id, range).await?),
        EstimateKind::Books => first_len(store.books(id, range).await?),
        EstimateKind::Metrics => first_len(store.metrics(id, range).await?),
    };
    Ok(len as u64)
}

fn first_len<P: Point>(points: Vec<P>) -> usize {
    points.first().map_or(0, point_len)
}
