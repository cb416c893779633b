//! History: prices, books and metrics from precomputed buckets.
//!
//! Token routes page through one series of buckets. Market routes return
//! every token of the market; `limit` counts points across all tokens, so
//! each token gets `limit / tokens` per page and a page ends where the
//! first token's share runs out — the next page resumes there for all.

use super::path_id;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::plans::DataPoint;
use crate::query::{HistoryPage, HistoryQuery};
use crate::ApiState;
use axum::extract::{Path, State};
use axum::Json;
use hindsight_contracts::{self as read, TokenRef};
use hindsight_schemas::api::*;
use hindsight_schemas::{IsoTime, MarketRecord, Timestamp};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// Most tokens a market-level prices or books page returns.
pub const MAX_MARKET_TOKENS: usize = 200;

// The routes, as their cursors are bound to them.
const TOKEN_PRICES: &str = "/v1/tokens/{token_id}/prices";
const TOKEN_BOOKS: &str = "/v1/tokens/{token_id}/books";
const MARKET_PRICES: &str = "/v1/markets/{id_or_slug}/prices";
const MARKET_BOOKS: &str = "/v1/markets/{id_or_slug}/books";
const MARKET_METRICS: &str = "/v1/markets/{id_or_slug}/metrics";

fn check(caller: &Caller, point: DataPoint, q: &HistoryQuery) -> Result<(), ApiError> {
    caller
        .plan
        .check_history(point, q.resolution, q.start, caller.now)
}

async fn token(state: &ApiState, token_id: String) -> Result<TokenRef, ApiError> {
    let token_id = path_id("token_id", token_id)?;
    state
        .store
        .token(&token_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("Token not found".into()))
}

async fn market(state: &ApiState, id_or_slug: String) -> Result<MarketRecord, ApiError> {
    let key = path_id("id_or_slug", id_or_slug)?;
    state
        .store
        .market(&key)
        .await?
        .ok_or_else(|| ApiError::NotFound("Market not found".into()))
}

/// Cuts one series read with `per + 1` points to `per`; the next page's start.
fn cut<T>(rows: &mut Vec<T>, per: usize, t: impl Fn(&T) -> Timestamp) -> Option<Timestamp> {
    let next = rows.get(per).map(&t);
    rows.truncate(per);
    next
}

fn price_points(points: Vec<read::PricePoint>) -> Vec<PricePoint> {
    points
        .into_iter()
        .map(|p| PricePoint {
            t: IsoTime(p.t),
            p: p.p,
        })
        .collect()
}

fn book_points(points: Vec<read::BookPoint>) -> Result<Vec<BookPoint>, ApiError> {
    points
        .into_iter()
        .map(|b| {
            let raw = |s: String| {
                RawValue::from_string(s).map_err(|e| {
                    ApiError::invariant(format!("stored book levels are not JSON: {e}"))
                })
            };
            Ok(BookPoint {
                t: IsoTime(b.t),
                bids: raw(b.bids)?,
                asks: raw(b.asks)?,
            })
        })
        .collect()
}

fn page_meta(
    q: &HistoryQuery,
    page: &HistoryPage,
    count: usize,
    next: Option<Timestamp>,
) -> PageMetadata {
    PageMetadata {
        count,
        limit: q.limit,
        next_cursor: next.map(|t| page.next_cursor(t)),
    }
}

/// Points per token for a market-level page, or the refusal of SPEC §4.5.
fn per_token(
    market: &MarketRecord,
    q: &HistoryQuery,
    single_route: &str,
) -> Result<usize, ApiError> {
    let n = market.tokens.len();
    if n > MAX_MARKET_TOKENS {
        return Err(ApiError::BadRequest(format!(
            "Market {} has {n} tokens; market-level routes return at most {MAX_MARKET_TOKENS}. \
             Query one token at a time with {single_route}.",
            market.id
        )));
    }
    if q.limit < n {
        return Err(ApiError::BadRequest(format!(
            "limit {} is too small for market {} with {n} tokens; the minimum required is {n}.",
            q.limit, market.id
        )));
    }
    Ok(q.limit / n.max(1))
}

/// Reads every token's page and cuts all of them where the first runs out.
async fn market_page<T, F, Fut>(
    market: &MarketRecord,
    q: &HistoryQuery,
    page: &HistoryPage,
    per: usize,
    read: F,
) -> Result<(BTreeMap<String, Vec<T>>, Option<Timestamp>), ApiError>
where
    F: Fn(String, read::Range) -> Fut,
    Fut: std::future::Future<Output = hindsight_contracts::Result<Vec<T>>>,
    T: HasTime,
{
    let mut series = Vec::with_capacity(market.tokens.len());
    for token in &market.tokens {
        series.push((
            token.label.clone(),
            read(token.id.clone(), q.range(page, per)).await?,
        ));
    }
    let next = series
        .iter()
        .filter_map(|(_, rows)| rows.get(per).map(HasTime::t))
        .min();
    let data = series
        .into_iter()
        .map(|(label, mut rows)| {
            rows.truncate(per);
            if let Some(next) = next {
                rows.retain(|r| r.t() < next);
            }
            (label, rows)
        })
        .collect();
    Ok((data, next))
}

pub trait HasTime {
    fn t(&self) -> Timestamp;
}
impl HasTime for read::PricePoint {
    fn t(&self) -> Timestamp {
        self.t
    }
}
impl HasTime for read::BookPoint {
    fn t(&self) -> Timestamp {
        self.t
    }
}

fn token_map(market: &MarketRecord) -> BTreeMap<String, String> {
    market
        .tokens
        .iter()
        .map(|t| (t.label.clone(), t.id.clone()))
        .collect()
}

/// Price history of one token: the average probability per bucket.
#[utoipa::path(get, path = "/v1/tokens/{token_id}/prices", tag = "history",
    params(("token_id" = String, Path, min_length = 1, max_length = 200), HistoryQuery),
    responses((status = 200, body = TokenPricesResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn token_prices(
    State(state): State<ApiState>,
    caller: Caller,
    Path(token_id): Path<String>,
    q: HistoryQuery,
) -> Result<Json<TokenPricesResponse>, ApiError> {
    check(&caller, DataPoint::Prices, &q)?;
    let token = token(&state, token_id).await?;
    let page = q.page(TOKEN_PRICES, &token.token_id)?;
    let mut points = state
        .store
        .prices(&token.token_id, q.range(&page, q.limit))
        .await?;
    let next = cut(&mut points, q.limit, |p| p.t);
    let data = price_points(points);
    Ok(Json(TokenPricesResponse {
        market_id: token.market_id,
        token_id: token.token_id,
        token_label: token.label,
        resolution: q.resolution.as_str().into(),
        metadata: page_meta(&q, &page, data.len(), next),
        data,
    }))
}

/// Order-book history of one token: the last snapshot per bucket.
#[utoipa::path(get, path = "/v1/tokens/{token_id}/books", tag = "history",
    params(("token_id" = String, Path, min_length = 1, max_length = 200), HistoryQuery),
    responses((status = 200, body = TokenBooksResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn token_books(
    State(state): State<ApiState>,
    caller: Caller,
    Path(token_id): Path<String>,
    q: HistoryQuery,
) -> Result<Json<TokenBooksResponse>, ApiError> {
    check(&caller, DataPoint::Books, &q)?;
    let token = token(&state, token_id).await?;
    let page = q.page(TOKEN_BOOKS, &token.token_id)?;
    let mut points = state
        .store
        .books(&token.token_id, q.range(&page, q.limit))
        .await?;
    let next = cut(&mut points, q.limit, |p| p.t);
    let data = book_points(points)?;
    Ok(Json(TokenBooksResponse {
        market_id: token.market_id,
        token_id: token.token_id,
        token_label: token.label,
        resolution: q.resolution.as_str().into(),
        metadata: page_meta(&q, &page, data.len(), next),
        data,
    }))
}

/// Price history for every token of a market, keyed by token label.
#[utoipa::path(get, path = "/v1/markets/{id_or_slug}/prices", tag = "history",
    params(("id_or_slug" = String, Path, min_length = 1, max_length = 200), HistoryQuery),
    responses((status = 200, body = MarketPricesResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn market_prices(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id_or_slug): Path<String>,
    q: HistoryQuery,
) -> Result<Json<MarketPricesResponse>, ApiError> {
    check(&caller, DataPoint::Prices, &q)?;
    let market = market(&state, id_or_slug).await?;
    let per = per_token(&market, &q, TOKEN_PRICES)?;
    let page = q.page(MARKET_PRICES, &market.id)?;
    let store = &state.store;
    let (rows, next) = market_page(&market, &q, &page, per, |id, range| async move {
        store.prices(&id, range).await
    })
    .await?;
    let count = rows.values().map(Vec::len).sum();
    Ok(Json(MarketPricesResponse {
        market_id: market.id.clone(),
        resolution: q.resolution.as_str().into(),
        tokens: token_map(&market),
        data: rows
            .into_iter()
            .map(|(label, p)| (label, price_points(p)))
            .collect(),
        metadata: page_meta(&q, &page, count, next),
    }))
}

/// Order-book history for every token of a market, keyed by token label.
#[utoipa::path(get, path = "/v1/markets/{id_or_slug}/books", tag = "history",
    params(("id_or_slug" = String, Path, min_length = 1, max_length = 200), HistoryQuery),
    responses((status = 200, body = MarketBooksResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn market_books(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id_or_slug): Path<String>,
    q: HistoryQuery,
) -> Result<Json<MarketBooksResponse>, ApiError> {
    check(&caller, DataPoint::Books, &q)?;
    let market = market(&state, id_or_slug).await?;
    let per = per_token(&market, &q, TOKEN_BOOKS)?;
    let page = q.page(MARKET_BOOKS, &market.id)?;
    let store = &state.store;
    let (rows, next) = market_page(&market, &q, &page, per, |id, range| async move {
        store.books(&id, range).await
    })
    .await?;
    let count = rows.values().map(Vec::len).sum();
    let mut data = BTreeMap::new();
    for (label, points) in rows {
        data.insert(label, book_points(points)?);
    }
    Ok(Json(MarketBooksResponse {
        market_id: market.id.clone(),
        resolution: q.resolution.as_str().into(),
        tokens: token_map(&market),
        data,
        metadata: page_meta(&q, &page, count, next),
    }))
}

/// Volume, liquidity and spread history of a market (bucket averages).
#[utoipa::path(get, path = "/v1/markets/{id_or_slug}/metrics", tag = "history",
    params(("id_or_slug" = String, Path, min_length = 1, max_length = 200), HistoryQuery),
    responses((status = 200, body = MetricsResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn market_metrics(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id_or_slug): Path<String>,
    q: HistoryQuery,
) -> Result<Json<MetricsResponse>, ApiError> {
    check(&caller, DataPoint::Metrics, &q)?;
    let market = market(&state, id_or_slug).await?;
    let page = q.page(MARKET_METRICS, &market.id)?;
    let mut points = state
        .store
        .metrics(&market.id, q.range(&page, q.limit))
        .await?;
    let next = cut(&mut points, q.limit, |p| p.t);
    let data: Vec<MetricsPoint> = points
        .into_iter()
        .map(|m| MetricsPoint {
            t: IsoTime(m.t),
            volume: m.volume,
            liquidity: m.liquidity,
            spread: m.spread,
        })
        .collect();
    Ok(Json(MetricsResponse {
        market_id: market.id,
        resolution: q.resolution.as_str().into(),
        metadata: page_meta(&q, &page, data.len(), next),
        data,
    }))
}
