//! History: prices, candles, books and metrics from precomputed buckets;
//! with `resolution=tick`, token prices and books tick by tick from the
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
use crate::page::{self, Carry, Gap, Meta, Page, Point, Sealed, TokenSeries};
use crate::plans::DataPoint;
use crate::query::{BookAtQuery, Fill, FillParam, HistoryPage, HistoryQuery, TradesQuery};
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
const TOKEN_CANDLES: &str = "/v1/tokens/{token_id}/candles";
const MARKET_CANDLES: &str = "/v1/markets/{id_or_slug}/candles";
const TOKEN_TRADES: &str = "/v1/tokens/{token_id}/trades";
const TOKEN_BOOK: &str = "/v1/tokens/{token_id}/book";

fn check(caller: &Caller, point: DataPoint, q: &HistoryQuery) -> Result<(), ApiError> {
    caller
        .plan
        .check_history(point, q.resolution, q.start, caller.now)
}

/// Serves the page `build` makes through the page cache, kept under this
/// request's key: the handler has checked the plan, so only the reads and
/// the encoding are skipped on a hit.
async fn cached(
    state: &ApiState,
    q: &HistoryQuery,
    (route, id): (&str, &str),
    build: impl std::future::Future<Output = Result<Page, ApiError>>,
) -> Result<Sealed, ApiError> {
    // `serve` reads the stamp before it runs `build`, whose reads it vouches for.
    let key = q.cache_key(route, id).map(String::into_bytes);
    let build = async { build.await.map(Page::seal) };
    state
        .pages
        .serve(|| state.store.version(), key, build)
        .await
}

pub(super) async fn token(state: &ApiState, token_id: String) -> Result<TokenRef, ApiError> {
    let token_id = path_id("token_id", token_id)?;
    let read = || state.store.token(&token_id);
    state
        .tokens
        .known(|| state.store.version(), token_id.as_bytes(), read)
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
/// next page starts (the `key` of the first point cut off, if before
/// `end`), and whether the series had a stored point after the page's
/// (every point cut off is later than every point kept; a filled one says
/// nothing of the projector).
fn cut<P: Point, K>(
    rows: &mut Vec<P>,
    per: usize,
    end: Timestamp,
    key: impl Fn(&P) -> K,
) -> (Option<K>, bool) {
    let next = rows.get(per).filter(|p| p.t() < end).map(key);
    let in_range = rows.partition_point(|p| p.t() < end);
    let kept = in_range.min(per);
    let closed = rows[kept..].iter().any(P::stored);
    rows.truncate(kept);
    (next, closed)
}

/// How far back `fill=previous` carries a stored value, in buckets: a
/// day at `1m`. A page starting on an empty bucket reads at most this
/// many buckets before it for the value to carry; an empty bucket further
/// than this from the last stored one stays empty, on every page alike.
pub const FILL_LOOKBACK_BUCKETS: i64 = 1_440;

/// Where `fill=previous` may make up points: not in the future, and not
/// after the market closed.
#[derive(Debug, Clone, Copy)]
struct FillBound {
    now: Timestamp,
    closed_at: Option<Timestamp>,
}

impl FillBound {
    fn allows(&self, bucket: Timestamp) -> bool {
        bucket <= self.now && self.closed_at.is_none_or(|c| bucket < c)
    }
}

/// The first bucket starting at or after `t`.
fn first_bucket(t: Timestamp, width: i64) -> Timestamp {
    let start = t.0.div_euclid(width) * width;
    Timestamp(if start == t.0 { start } else { start + width })
}

/// A page's points of one series with `fill=previous`: the stored points
/// `stored` (read for the page by `HistoryQuery::range`, from `from`), and
/// between them, from the first bucket at or after `from` until `end`,
/// every empty bucket the last stored point before it (`carry` for the
/// page's first, read by the caller) may be carried into: at most
/// [`FILL_LOOKBACK_BUCKETS`] after it, within `bound`. Made-up points stop
/// at `per + 1` (all `cut` needs); stored ones are all kept, for `cut` to
/// see the stored buckets after the page.
fn fill_previous<P: Carry>(
    stored: Vec<P>,
    mut carry: Option<P>,
    (from, end, width): (Timestamp, Timestamp, i64),
    per: usize,
    bound: FillBound,
) -> Vec<Gap<P>> {
    let mut out = Vec::with_capacity(per + 1);
    let mut bucket = first_bucket(from, width);
    let fill_until =
        |out: &mut Vec<Gap<P>>, bucket: &mut Timestamp, until: Timestamp, carry: &Option<P>| {
            let Some(from) = carry else { return };
            while *bucket < until
                && *bucket < end
                && out.len() <= per
                && bucket.0 - from.t().0 <= FILL_LOOKBACK_BUCKETS * width
                && bound.allows(*bucket)
            {
                out.push(Gap::Filled {
                    t: *bucket,
                    from: from.clone(),
                });
                bucket.0 += width;
            }
        };
    for point in stored {
        fill_until(&mut out, &mut bucket, point.t(), &carry);
        bucket = Timestamp(point.t().0 + width);
        carry = Some(point.clone());
        out.push(Gap::Stored(point));
    }
    fill_until(&mut out, &mut bucket, end, &carry);
    out
}

/// Reads one series for a page of a prices or candles route: the stored
/// points (`reads.0`), and with `fill=previous` the filled gaps between
/// them, carrying the last point before the page read by `reads.1` (a
/// carried point needs only its value: candles skip their trades there).
async fn series<P, F, Fut, G, GFut>(
    q: &HistoryQuery,
    bound: FillBound,
    (read, read_carry): (F, G),
    id: String,
    range: read::Range,
) -> Result<Vec<Gap<P>>, ApiError>
where
    P: Carry,
    F: Fn(String, read::Range) -> Fut,
    Fut: std::future::Future<Output = hindsight_contracts::Result<Vec<P>>>,
    G: Fn(String, read::Range) -> GFut,
    GFut: std::future::Future<Output = hindsight_contracts::Result<Vec<P>>>,
{
    let stored = read(id.clone(), range).await?;
    if q.fill == Fill::None {
        return Ok(stored.into_iter().map(Gap::Stored).collect());
    }
    let width = range.res.width_ms();
    let first = first_bucket(range.start, width);
    let carry = if stored.first().is_some_and(|p| p.t() == first) {
        None
    } else {
        let before = read::Range {
            res: range.res,
            start: Timestamp(first.0.saturating_sub(FILL_LOOKBACK_BUCKETS * width)),
            end: first,
            limit: FILL_LOOKBACK_BUCKETS as usize,
        };
        read_carry(id, before).await?.pop()
    };
    let per = range.limit - 1;
    Ok(fill_previous(
        stored,
        carry,
        (range.start, q.end, width),
        per,
        bound,
    ))
}

/// The stored candles of `range` with their buckets' trades joined in
/// ([`ReadStore::trade_totals`](read::ReadStore::trade_totals) over the
/// buckets the candles span): what the candle routes and the candles
/// export serve. Trades of a bucket without price ticks have no candle to
/// sit in.
pub(crate) async fn candles_with_trades(
    store: &dyn read::ReadStore,
    id: &str,
    range: read::Range,
) -> hindsight_contracts::Result<Vec<read::CandlePoint>> {
    let mut points = store.candles(id, range).await?;
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return Ok(points);
    };
    let width = range.res.width_ms();
    let span = read::Range {
        res: range.res,
        start: first.t,
        end: Timestamp(last.t.0 + width),
        limit: usize::try_from((last.t.0 - first.t.0) / width + 1).unwrap_or(usize::MAX),
    };
    let mut totals = store.trade_totals(id, span).await?.into_iter().peekable();
    for p in &mut points {
        while totals.next_if(|(t, _)| *t < p.t).is_some() {}
        if let Some((_, bucket)) = totals.next_if(|(t, _)| *t == p.t) {
            p.trades = Some(bucket);
        }
    }
    Ok(points)
}

/// A token page of a prices-like series (prices, candles) at `res`, gaps
/// filled when asked.
async fn filled_token_page<P, F, Fut, G, GFut>(
    state: &ApiState,
    caller: &Caller,
    (token_id, res): (String, Resolution),
    q: &HistoryQuery,
    route: &str,
    reads: (F, G),
) -> Result<Page, ApiError>
where
    P: Carry,
    F: Fn(String, read::Range) -> Fut + Copy,
    Fut: std::future::Future<Output = hindsight_contracts::Result<Vec<P>>>,
    G: Fn(String, read::Range) -> GFut + Copy,
    GFut: std::future::Future<Output = hindsight_contracts::Result<Vec<P>>>,
{
    let token = token(state, token_id).await?;
    let bound = token_bound(state, caller, q, &token).await?;
    token_page(q, res, route, token, |id, range| {
        series(q, bound, reads, id, range)
    })
    .await
}

/// A market page of a prices-like series at `res` (`routes`: the market
/// route and its token route).
async fn filled_market_page<P, F, Fut, G, GFut>(
    state: &ApiState,
    caller: &Caller,
    (id_or_slug, res): (String, Resolution),
    q: &HistoryQuery,
    (route, single_route): (&str, &str),
    reads: (F, G),
) -> Result<Page, ApiError>
where
    P: Carry,
    F: Fn(String, read::Range) -> Fut + Copy,
    Fut: std::future::Future<Output = hindsight_contracts::Result<Vec<P>>>,
    G: Fn(String, read::Range) -> GFut + Copy,
    GFut: std::future::Future<Output = hindsight_contracts::Result<Vec<P>>>,
{
    let market = market(state, id_or_slug).await?;
    let bound = bound(caller, &market);
    market_page(&market, q, res, route, single_route, |id, range| {
        series(q, bound, reads, id, range)
    })
    .await
}

/// Where a token's pages may fill: its market's `closed_at` (read only
/// when filling), now.
async fn token_bound(
    state: &ApiState,
    caller: &Caller,
    q: &HistoryQuery,
    token: &TokenRef,
) -> Result<FillBound, ApiError> {
    let closed_at = match q.fill {
        Fill::None => None,
        Fill::Previous => state
            .store
            .market(&token.market_id)
            .await?
            .and_then(|m| m.closed_at),
    };
    Ok(FillBound {
        now: caller.now,
        closed_at,
    })
}

/// Where a market's pages may fill (its `closed_at`), now.
fn bound(caller: &Caller, market: &MarketRecord) -> FillBound {
    FillBound {
        now: caller.now,
        closed_at: market.closed_at,
    }
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
async fn token_page<P, F, Fut, E>(
    q: &HistoryQuery,
    res: Resolution,
    route: &str,
    token: TokenRef,
    read: F,
) -> Result<Page, ApiError>
where
    P: Point,
    F: FnOnce(String, read::Range) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<P>, E>>,
    ApiError: From<E>,
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
async fn market_page<P, F, Fut, E>(
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
    Fut: std::future::Future<Output = Result<Vec<P>, E>>,
    ApiError: From<E>,
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
    params(("token_id" = String, Path, min_length = 1, max_length = 200), HistoryQuery, FillParam),
    responses((status = 200, body = TokenPricesResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn token_prices(
    State(state): State<ApiState>,
    caller: Caller,
    Path(token_id): Path<String>,
    q: HistoryQuery,
) -> Result<Sealed, ApiError> {
    check(&caller, DataPoint::Prices, &q)?;
    let id = token_id.clone();
    cached(&state, &q, (TOKEN_PRICES, &id), async {
        let Granularity::Bucket(res) = q.resolution else {
            q.no_fill()?;
            let token = token(&state, token_id).await?;
            return tick_page(&state, &q, TOKEN_PRICES, token, TickKind::Price).await;
        };
        let store = &state.store;
        let prices = |id: String, range| async move { store.prices(&id, range).await };
        let series = (token_id, res);
        filled_token_page(&state, &caller, series, &q, TOKEN_PRICES, (prices, prices)).await
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
) -> Result<Sealed, ApiError> {
    check(&caller, DataPoint::Books, &q)?;
    q.no_fill()?;
    let id = token_id.clone();
    cached(&state, &q, (TOKEN_BOOKS, &id), async {
        let token = token(&state, token_id).await?;
        let Granularity::Bucket(res) = q.resolution else {
            return tick_page(&state, &q, TOKEN_BOOKS, token, TickKind::Book).await;
        };
        let store = &state.store;
        token_page(&q, res, TOKEN_BOOKS, token, |id, range| async move {
            store.books(&id, range).await
        })
        .await
    })
    .await
}

/// Price history for every token of a market, keyed by token label
/// (`resolution=tick`: 422, served by the token route).
#[utoipa::path(get, path = "/v1/markets/{id_or_slug}/prices", tag = "history",
    params(("id_or_slug" = String, Path, min_length = 1, max_length = 200), HistoryQuery, FillParam),
    responses((status = 200, body = MarketPricesResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 422, body = ValidationErrorResponse),
        (status = 429, body = ErrorResponse)))]
pub async fn market_prices(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id_or_slug): Path<String>,
    q: HistoryQuery,
) -> Result<Sealed, ApiError> {
    let res = q.bucket()?;
    check(&caller, DataPoint::Prices, &q)?;
    let id = id_or_slug.clone();
    cached(&state, &q, (MARKET_PRICES, &id), async {
        let store = &state.store;
        let prices = |id: String, range| async move { store.prices(&id, range).await };
        let (routes, series) = ((MARKET_PRICES, TOKEN_PRICES), (id_or_slug, res));
        filled_market_page(&state, &caller, series, &q, routes, (prices, prices)).await
    })
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
) -> Result<Sealed, ApiError> {
    let res = q.bucket()?;
    check(&caller, DataPoint::Books, &q)?;
    q.no_fill()?;
    let id = id_or_slug.clone();
    cached(&state, &q, (MARKET_BOOKS, &id), async {
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
    })
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
) -> Result<Sealed, ApiError> {
    let res = q.bucket()?;
    check(&caller, DataPoint::Metrics, &q)?;
    q.no_fill()?;
    let id = id_or_slug.clone();
    cached(&state, &q, (MARKET_METRICS, &id), async {
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
    })
    .await
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
) -> Result<Sealed, ApiError> {
    caller.plan.check_point(DataPoint::Trades)?;
    caller.plan.check_since(q.start, caller.now)?;
    let id = token_id.clone();
    cached(&state, &q, (TOKEN_TRADES, &id), async {
        let token = token(&state, token_id).await?;
        tick_page(&state, &q, TOKEN_TRADES, token, TickKind::Trade).await
    })
    .await
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
    let levels = |text: Box<str>| {
        RawValue::from_string(text.into())
            .map_err(|e| ApiError::invariant(format!("stored book levels are not JSON: {e}")))
    };
    Ok(Some(BookAtResponse {
        token_id: tick.token_id.to_string(),
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

/// Candles of one token: open, high, low and close of the price ticks per
/// bucket, and their number; where the bucket holds trades, their volume
/// and number (a repeated trade id once). Plan-gated as prices.
#[utoipa::path(get, path = "/v1/tokens/{token_id}/candles", tag = "history",
    params(("token_id" = String, Path, min_length = 1, max_length = 200), HistoryQuery, FillParam),
    responses((status = 200, body = TokenCandlesResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 409, body = ErrorResponse,
        description = "A bucket in the page was projected before candles were stored; `hindsight rebuild` fills it"),
        (status = 422, body = ValidationErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn token_candles(
    State(state): State<ApiState>,
    caller: Caller,
    Path(token_id): Path<String>,
    q: HistoryQuery,
) -> Result<Sealed, ApiError> {
    let res = q.bucket()?;
    check(&caller, DataPoint::Prices, &q)?;
    let id = token_id.clone();
    cached(&state, &q, (TOKEN_CANDLES, &id), async {
        let store = &*state.store;
        let reads = (
            |id: String, range| async move { candles_with_trades(store, &id, range).await },
            |id: String, range| async move { store.candles(&id, range).await },
        );
        let series = (token_id, res);
        filled_token_page(&state, &caller, series, &q, TOKEN_CANDLES, reads).await
    })
    .await
}

/// Candles of every token of a market, keyed by token label (paged as the
/// market's prices are). Plan-gated as prices.
#[utoipa::path(get, path = "/v1/markets/{id_or_slug}/candles", tag = "history",
    params(("id_or_slug" = String, Path, min_length = 1, max_length = 200), HistoryQuery, FillParam),
    responses((status = 200, body = MarketCandlesResponse), (status = 400, body = ErrorResponse), (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse), (status = 404, body = ErrorResponse), (status = 409, body = ErrorResponse,
        description = "A bucket in the page was projected before candles were stored; `hindsight rebuild` fills it"),
        (status = 422, body = ValidationErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn market_candles(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id_or_slug): Path<String>,
    q: HistoryQuery,
) -> Result<Sealed, ApiError> {
    let res = q.bucket()?;
    check(&caller, DataPoint::Prices, &q)?;
    let id = id_or_slug.clone();
    cached(&state, &q, (MARKET_CANDLES, &id), async {
        let store = &*state.store;
        let reads = (
            |id: String, range| async move { candles_with_trades(store, &id, range).await },
            |id: String, range| async move { store.candles(&id, range).await },
        );
        let (routes, series) = ((MARKET_CANDLES, TOKEN_CANDLES), (id_or_slug, res));
        filled_market_page(&state, &caller, series, &q, routes, reads).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_contracts::PricePoint;

    const W: i64 = 60_000;

    fn p(bucket: i64, p: f64) -> PricePoint {
        PricePoint {
            t: Timestamp(bucket * W),
            p,
        }
    }

    /// `(bucket, p, filled)` of each point.
    fn shape(points: &[Gap<PricePoint>]) -> Vec<(i64, f64, bool)> {
        points
            .iter()
            .map(|g| match g {
                Gap::Stored(s) => (s.t.0 / W, s.p, false),
                Gap::Filled { t, from } => (t.0 / W, from.p, true),
            })
            .collect()
    }

    const OPEN: FillBound = FillBound {
        now: Timestamp(i64::MAX),
        closed_at: None,
    };

    #[test]
    fn gaps_take_the_last_stored_value_from_the_first_bucket_to_the_end() {
        let out = fill_previous(
            vec![p(3, 0.3), p(5, 0.5)],
            Some(p(0, 0.1)),
            (Timestamp(W + 1), Timestamp(8 * W), W),
            100,
            OPEN,
        );
        assert_eq!(
            shape(&out),
            vec![
                (2, 0.1, true),
                (3, 0.3, false),
                (4, 0.3, true),
                (5, 0.5, false),
                (6, 0.5, true),
                (7, 0.5, true)
            ]
        );
    }

    #[test]
    fn nothing_is_carried_without_a_value_past_the_lookback_now_or_closing() {
        let none = fill_previous(
            vec![p(3, 0.3)],
            None,
            (Timestamp(0), Timestamp(5 * W), W),
            100,
            FillBound {
                now: Timestamp(10 * W),
                closed_at: Some(Timestamp(4 * W)),
            },
        );
        assert_eq!(shape(&none), vec![(3, 0.3, false)], "closed at bucket 4");
        let now = fill_previous(
            vec![p(3, 0.3)],
            None,
            (Timestamp(0), Timestamp(9 * W), W),
            100,
            FillBound {
                now: Timestamp(5 * W + 7),
                closed_at: None,
            },
        );
        assert_eq!(
            shape(&now),
            vec![(3, 0.3, false), (4, 0.3, true), (5, 0.3, true)],
            "not past now"
        );
        let far = FILL_LOOKBACK_BUCKETS;
        let lookback = fill_previous(
            vec![p(far + 5, 0.9)],
            Some(p(0, 0.1)),
            (Timestamp((far - 1) * W), Timestamp((far + 6) * W), W),
            100,
            OPEN,
        );
        assert_eq!(
            shape(&lookback),
            vec![
                (far - 1, 0.1, true),
                (far, 0.1, true),
                (far + 5, 0.9, false)
            ],
            "carried at most FILL_LOOKBACK_BUCKETS"
        );
    }

    #[test]
    fn made_up_points_stop_after_one_past_the_page_and_only_stored_ones_close_it() {
        let mut out = fill_previous(
            vec![p(0, 0.5)],
            None,
            (Timestamp(0), Timestamp(1_000 * W), W),
            3,
            OPEN,
        );
        assert_eq!(out.len(), 4, "per + 1 points");
        let (next, closed) = cut(&mut out, 3, Timestamp(1_000 * W), Point::t);
        assert_eq!((next, closed), (Some(Timestamp(3 * W)), false));
        let mut out = fill_previous(
            vec![p(0, 0.5), p(9, 0.7)],
            None,
            (Timestamp(0), Timestamp(5 * W), W),
            3,
            OPEN,
        );
        let (next, closed) = cut(&mut out, 3, Timestamp(5 * W), Point::t);
        assert_eq!((next, closed), (Some(Timestamp(3 * W)), true));
    }
}
