//! History: prices, books and metrics from precomputed buckets.
//!
//! Token routes page through one series of buckets. Market routes return
//! every token of the market; `limit` counts points across all tokens, so
//! each token gets `limit / tokens` per page and a page ends where the
//! first token's share runs out — the next page resumes there for all.
//!
//! Every read looks a little past the page (`HistoryQuery::range`): a
//! bucket of the series after the page's last one means the projector has
//! passed the page, which is then closed and cached longer
//! (docs/DESIGN.md, "Caching history"). Pages are encoded by [`page`]
//! straight from the rows the store returned.

use super::path_id;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::page::{self, Meta, Page, Point, TokenSeries};
use crate::plans::DataPoint;
use crate::query::{HistoryPage, HistoryQuery};
use crate::ApiState;
use axum::extract::{Path, State};
use hindsight_contracts::{self as read, TokenRef};
use hindsight_schemas::api::*;
use hindsight_schemas::{MarketRecord, Timestamp};

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

pub(super) async fn token(state: &ApiState, token_id: String) -> Result<TokenRef, ApiError> {
    let token_id = path_id("token_id", token_id)?;
    state
        .store
        .token(&token_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("Token not found".into()))
}

pub(super) async fn market(state: &ApiState, id_or_slug: String) -> Result<MarketRecord, ApiError> {
    let key = path_id("id_or_slug", id_or_slug)?;
    state
        .store
        .market(&key)
        .await?
        .ok_or_else(|| ApiError::NotFound("Market not found".into()))
}

/// Cuts one series, read by `HistoryQuery::range` with `per + 1` points,
/// to the page: at most `per` points, all before `end`. Returns where the
/// next page starts, and whether the series had a bucket after the page's
/// (every point cut off is later than every point kept).
fn cut<P: Point>(rows: &mut Vec<P>, per: usize, end: Timestamp) -> (Option<Timestamp>, bool) {
    let read = rows.len();
    let next = rows.get(per).map(P::t).filter(|t| *t < end);
    let in_range = rows.partition_point(|p| p.t() < end);
    rows.truncate(in_range.min(per));
    (next, read > rows.len())
}

fn meta(q: &HistoryQuery, page: &HistoryPage, count: usize, next: Option<Timestamp>) -> Meta {
    Meta {
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

/// One token's page of a series: `read` the series, cut it, encode it
/// with the token's head fields.
async fn token_page<P, F, Fut>(
    q: &HistoryQuery,
    route: &str,
    token: TokenRef,
    read: F,
) -> Result<Page, ApiError>
where
    P: Point,
    F: FnOnce(String, read::Range) -> Fut,
    Fut: std::future::Future<Output = hindsight_contracts::Result<Vec<P>>>,
{
    let page = q.page(route, &token.token_id)?;
    let mut points = read(token.token_id.clone(), q.range(&page, q.limit)).await?;
    let (next, closed) = cut(&mut points, q.limit, q.end);
    let head = [
        ("market_id", token.market_id.as_str()),
        ("token_id", token.token_id.as_str()),
        ("token_label", token.label.as_str()),
        ("resolution", q.resolution.as_str()),
    ];
    page::series(&head, &points, &meta(q, &page, points.len(), next), closed)
}

/// Every token's page of a market, cut where the first token's share runs
/// out, and encoded. Closed when any token has a bucket after the page:
/// a market's events share one log partition, so the projector has then
/// passed the page for all of its tokens.
async fn market_page<P, F, Fut>(
    market: &MarketRecord,
    q: &HistoryQuery,
    route: &str,
    single_route: &str,
    read: F,
) -> Result<Page, ApiError>
where
    P: Point,
    F: Fn(String, read::Range) -> Fut,
    Fut: std::future::Future<Output = hindsight_contracts::Result<Vec<P>>>,
{
    let per = per_token(market, q, single_route)?;
    let page = q.page(route, &market.id)?;
    let mut series = Vec::with_capacity(market.tokens.len());
    for token in &market.tokens {
        series.push(TokenSeries {
            label: &token.label,
            id: &token.id,
            points: read(token.id.clone(), q.range(&page, per)).await?,
        });
    }
    let next = series
        .iter()
        .filter_map(|s| s.points.get(per).map(P::t))
        .filter(|t| *t < q.end)
        .min();
    let page_end = next.unwrap_or(q.end);
    let mut closed = false;
    let mut count = 0;
    for s in &mut series {
        closed |= cut(&mut s.points, per, page_end).1;
        count += s.points.len();
    }
    let head = [
        ("market_id", market.id.as_str()),
        ("resolution", q.resolution.as_str()),
    ];
    page::market(&head, &mut series, &meta(q, &page, count, next), closed)
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
) -> Result<Page, ApiError> {
    check(&caller, DataPoint::Prices, &q)?;
    let token = token(&state, token_id).await?;
    let store = &state.store;
    token_page(&q, TOKEN_PRICES, token, |id, range| async move {
        store.prices(&id, range).await
    })
    .await
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
) -> Result<Page, ApiError> {
    check(&caller, DataPoint::Books, &q)?;
    let token = token(&state, token_id).await?;
    let store = &state.store;
    token_page(&q, TOKEN_BOOKS, token, |id, range| async move {
        store.books(&id, range).await
    })
    .await
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
) -> Result<Page, ApiError> {
    check(&caller, DataPoint::Prices, &q)?;
    let market = market(&state, id_or_slug).await?;
    let store = &state.store;
    market_page(
        &market,
        &q,
        MARKET_PRICES,
        TOKEN_PRICES,
        |id, range| async move { store.prices(&id, range).await },
    )
    .await
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
) -> Result<Page, ApiError> {
    check(&caller, DataPoint::Books, &q)?;
    let market = market(&state, id_or_slug).await?;
    let store = &state.store;
    market_page(
        &market,
        &q,
        MARKET_BOOKS,
        TOKEN_BOOKS,
        |id, range| async move { store.books(&id, range).await },
    )
    .await
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
) -> Result<Page, ApiError> {
    check(&caller, DataPoint::Metrics, &q)?;
    let market = market(&state, id_or_slug).await?;
    let page = q.page(MARKET_METRICS, &market.id)?;
    let mut points = state
        .store
        .metrics(&market.id, q.range(&page, q.limit))
        .await?;
    let (next, closed) = cut(&mut points, q.limit, q.end);
    let head = [
        ("market_id", market.id.as_str()),
        ("resolution", q.resolution.as_str()),
    ];
    page::series(&head, &points, &meta(&q, &page, points.len(), next), closed)
}
