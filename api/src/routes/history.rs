//! History: prices, books and metrics from precomputed buckets; with
//! `resolution=tick`, token prices and books tick by tick from the
//! tick-level tables, as are trades; and the book at a moment.
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
use crate::query::{BookAtQuery, HistoryPage, HistoryQuery, TradesQuery};
use crate::ApiState;
use axum::extract::{Path, State};
use axum::Json;
use hindsight_contracts::{self as read, Tick, TickKind, TickValue, TokenRef};
use hindsight_schemas::api::*;
use hindsight_schemas::{Granularity, IsoTime, MarketRecord, Resolution, Timestamp};
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
const TOKEN_TRADES: &str = "/v1/tokens/{token_id}/trades";
const TOKEN_BOOK: &str = "/v1/tokens/{token_id}/book";

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

/// Cuts one series, read by `HistoryQuery::range` with `per + 1` points,
/// to the page: at most `per` points, all before `end`. Returns where the
/// next page starts (the `key` of the first point cut off, if before
/// `end`), and whether the series had a point after the page's (every
/// point cut off is later than every point kept).
fn cut<P: Point, K>(
    rows: &mut Vec<P>,
    per: usize,
    end: Timestamp,
    key: impl Fn(&P) -> K,
) -> (Option<K>, bool) {
    let read = rows.len();
    let next = rows.get(per).filter(|p| p.t() < end).map(key);
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

/// SPEC §4.5: a market of more than [`MAX_MARKET_TOKENS`] tokens is
/// queried one token at a time, with `single_route`.
fn check_token_count(market: &MarketRecord, single_route: &str) -> Result<(), ApiError> {
    let n = market.tokens.len();
    if n > MAX_MARKET_TOKENS {
        return Err(ApiError::BadRequest(format!(
            "Market {} has {n} tokens; market-level routes return at most {MAX_MARKET_TOKENS}. \
             Query one token at a time with {single_route}.",
            market.id
        )));
    }
    Ok(())
}

/// Points per token for a market-level page, or the refusal of SPEC §4.5.
fn per_token(
    market: &MarketRecord,
    q: &HistoryQuery,
    single_route: &str,
) -> Result<usize, ApiError> {
    let n = market.tokens.len();
    check_token_count(market, single_route)?;
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
    res: Resolution,
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
    let mut points = read(token.token_id.clone(), q.range(res, &page, q.limit)).await?;
    let (next, closed) = cut(&mut points, q.limit, q.end, P::t);
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
    res: Resolution,
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
            points: read(token.id.clone(), q.range(res, &page, per)).await?,
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
        closed |= cut(&mut s.points, per, page_end, P::t).1;
        count += s.points.len();
    }
    let head = [
        ("market_id", market.id.as_str()),
        ("resolution", q.resolution.as_str()),
    ];
    page::market(&head, &mut series, &meta(q, &page, count, next), closed)
}

/// Price history of one token: the average probability per bucket, or
/// with `resolution=tick` every tick as ingested (its exact time as `t`).
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
    let Granularity::Bucket(res) = q.resolution else {
        return tick_page(&state, &q, TOKEN_PRICES, token, TickKind::Price).await;
    };
    let store = &state.store;
    token_page(&q, res, TOKEN_PRICES, token, |id, range| async move {
        store.prices(&id, range).await
    })
    .await
}

/// Order-book history of one token: the last snapshot per bucket, or with
/// `resolution=tick` every snapshot as ingested (its exact time as `t`).
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
    let Granularity::Bucket(res) = q.resolution else {
        return tick_page(&state, &q, TOKEN_BOOKS, token, TickKind::Book).await;
    };
    let store = &state.store;
    token_page(&q, res, TOKEN_BOOKS, token, |id, range| async move {
        store.books(&id, range).await
    })
    .await
}

/// Price history for every token of a market, keyed by token label
/// (`resolution=tick`: 422, served by the token route).
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
    let res = q.bucket()?;
    check(&caller, DataPoint::Prices, &q)?;
    let market = market(&state, id_or_slug).await?;
    let store = &state.store;
    market_page(
        &market,
        &q,
        res,
        MARKET_PRICES,
        TOKEN_PRICES,
        |id, range| async move { store.prices(&id, range).await },
    )
    .await
}

/// Order-book history for every token of a market, keyed by token label
/// (`resolution=tick`: 422, served by the token route).
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
    let res = q.bucket()?;
    check(&caller, DataPoint::Books, &q)?;
    let market = market(&state, id_or_slug).await?;
    let store = &state.store;
    market_page(
        &market,
        &q,
        res,
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
    let res = q.bucket()?;
    check(&caller, DataPoint::Metrics, &q)?;
    let market = market(&state, id_or_slug).await?;
    let page = q.page(MARKET_METRICS, &market.id)?;
    let mut points = state
        .store
        .metrics(&market.id, q.range(res, &page, q.limit))
        .await?;
    let (next, closed) = cut(&mut points, q.limit, q.end, read::MetricsPoint::t);
    let head = [
        ("market_id", market.id.as_str()),
        ("resolution", q.resolution.as_str()),
    ];
    page::series(&head, &points, &meta(&q, &page, points.len(), next), closed)
}

/// One token's tick-level page of `kind`, paged by the ticks' keys. The
/// read reaches past `end_ts` as bucket pages do: a tick after the page
/// closes it. Trades pages carry no `resolution`.
async fn tick_page(
    state: &ApiState,
    q: &HistoryQuery,
    route: &str,
    token: TokenRef,
    kind: TickKind,
) -> Result<Page, ApiError> {
    let page = q.tick_page(route, &token.token_id)?;
    let mut ticks = state
        .store
        .ticks(kind, &token.token_id, q.tick_range(&page, q.limit))
        .await?;
    let (next, closed) = cut(&mut ticks, q.limit, q.end, |t: &Tick| t.key);
    let mut head = vec![
        ("market_id", token.market_id.as_str()),
        ("token_id", token.token_id.as_str()),
        ("token_label", token.label.as_str()),
    ];
    if kind != TickKind::Trade {
        head.push(("resolution", q.resolution.as_str()));
    }
    let meta = Meta {
        count: ticks.len(),
        limit: q.limit,
        next_cursor: next.map(|k| page.next_cursor(k)),
    };
    page::series(&head, &ticks, &meta, closed)
}

/// Trades of one token, chronological (ties in log order), each as
/// ingested; a trade id sent more than once is served once, at its first
/// arrival. Paged by cursor like the other history routes.
#[utoipa::path(get, path = "/v1/tokens/{token_id}/trades", tag = "history",
    params(("token_id" = String, Path, min_length = 1, max_length = 200), TradesQuery),
    responses((status = 200, body = TokenTradesResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn token_trades(
    State(state): State<ApiState>,
    caller: Caller,
    Path(token_id): Path<String>,
    TradesQuery(q): TradesQuery,
) -> Result<Page, ApiError> {
    caller.plan.check_point(DataPoint::Trades)?;
    caller.plan.check_since(q.start, caller.now)?;
    let token = token(&state, token_id).await?;
    tick_page(&state, &q, TOKEN_TRADES, token, TickKind::Trade).await
}

/// The book at a moment, for the plan: the `ts` asked must lie within its
/// lookback (and coverage), and so must the snapshot answered.
async fn book_at(
    state: &ApiState,
    caller: &Caller,
    token_id: &str,
    at: Timestamp,
) -> Result<Option<BookAtResponse>, ApiError> {
    let since = caller.plan.earliest(caller.now);
    let Some(tick) = state.store.book_at(token_id, since, at).await? else {
        return Ok(None);
    };
    let TickValue::Book { bids, asks } = tick.value else {
        return Err(ApiError::invariant(
            "book_at answered a tick that is not a snapshot",
        ));
    };
    let levels = |text: String| {
        RawValue::from_string(text)
            .map_err(|e| ApiError::invariant(format!("stored book levels are not JSON: {e}")))
    };
    Ok(Some(BookAtResponse {
        token_id: tick.token_id,
        t: IsoTime(tick.key.ts),
        bids: levels(bids)?,
        asks: levels(asks)?,
    }))
}

fn check_book_at(caller: &Caller, q: &BookAtQuery) -> Result<(), ApiError> {
    caller.plan.check_point(DataPoint::Books)?;
    caller.plan.check_since(q.ts, caller.now)
}

/// The book of one token at a moment: its latest snapshot at or before
/// `ts`, with the snapshot's exact time `t`; 404 when there is none.
#[utoipa::path(get, path = "/v1/tokens/{token_id}/book", tag = "snapshots",
    params(("token_id" = String, Path, min_length = 1, max_length = 200), BookAtQuery),
    responses((status = 200, body = BookAtResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn token_book(
    State(state): State<ApiState>,
    caller: Caller,
    Path(token_id): Path<String>,
    q: BookAtQuery,
) -> Result<Json<BookAtResponse>, ApiError> {
    check_book_at(&caller, &q)?;
    let token = token(&state, token_id).await?;
    book_at(&state, &caller, &token.token_id, q.ts)
        .await?
        .map(Json)
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "No book snapshot of token {} at or before {}",
                token.token_id,
                q.ts.to_rfc3339()
            ))
        })
}

/// The book of every token of a market at a moment, keyed by token label
/// (a token without a snapshot then is absent from `data`); 404 when no
/// token has one.
#[utoipa::path(get, path = "/v1/markets/{id_or_slug}/book", tag = "snapshots",
    params(("id_or_slug" = String, Path, min_length = 1, max_length = 200), BookAtQuery),
    responses((status = 200, body = MarketBookAtResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn market_book(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id_or_slug): Path<String>,
    q: BookAtQuery,
) -> Result<Json<MarketBookAtResponse>, ApiError> {
    check_book_at(&caller, &q)?;
    let market = market(&state, id_or_slug).await?;
    check_token_count(&market, TOKEN_BOOK)?;
    let mut tokens = BTreeMap::new();
    let mut data = BTreeMap::new();
    for t in &market.tokens {
        tokens.insert(t.label.clone(), t.id.clone());
        if let Some(book) = book_at(&state, &caller, &t.id, q.ts).await? {
            data.insert(t.label.clone(), book);
        }
    }
    if data.is_empty() {
        return Err(ApiError::NotFound(format!(
            "No book snapshot of market {} at or before {}",
            market.id,
            q.ts.to_rfc3339()
        )));
    }
    Ok(Json(MarketBookAtResponse {
        market_id: market.id,
        tokens,
        data,
    }))
}
