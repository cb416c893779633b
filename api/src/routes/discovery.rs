//! Discovery: series, events, markets and tags, from the in-memory catalog;
//! one market by id or slug, from the store.

use super::{iso, path_id};
use crate::auth::Caller;
use crate::cursor::ListCursor;
use crate::error::ApiError;
use crate::query::{EventFilter, ListPage, ListQuery, MarketFilter};
use crate::ApiState;
use axum::extract::{Path, State};
use axum::Json;
use hindsight_schemas::api::*;
use hindsight_schemas::{EventRecord, MarketRecord, SeriesRecord};

fn tokens(m: &MarketRecord) -> Vec<TokenInfo> {
    m.tokens
        .iter()
        .map(|t| TokenInfo {
            id: t.id.clone(),
            label: t.label.clone(),
        })
        .collect()
}

pub fn market_item(m: &MarketRecord) -> MarketItem {
    MarketItem {
        id: m.id.clone(),
        slug: m.slug.clone(),
        question: m.question.clone(),
        status: m.status.clone(),
        start_date: iso(m.start_date),
        end_date: iso(m.end_date),
        tokens: tokens(m),
        event_id: m.event_id.clone(),
    }
}

fn series_item(s: &SeriesRecord) -> SeriesItem {
    SeriesItem {
        id: s.id.clone(),
        slug: s.slug.clone(),
        title: s.title.clone(),
        tags: s.tags.clone(),
        status: s.status.clone(),
        start_date: iso(s.start_date),
        end_date: iso(s.end_date),
    }
}

fn event_item(e: &EventRecord) -> EventItem {
    EventItem {
        id: e.id.clone(),
        slug: e.slug.clone(),
        title: e.title.clone(),
        series_id: e.series_id.clone(),
        tags: e.tags.clone(),
        status: e.status.clone(),
        start_date: iso(e.start_date),
        end_date: iso(e.end_date),
    }
}

fn metadata<F>(
    q: &ListQuery<F>,
    paging: &ListPage,
    count: usize,
    next: Option<ListCursor>,
) -> PageMetadata {
    PageMetadata {
        count,
        limit: q.limit,
        next_cursor: next.map(|c| paging.next_cursor(&c)),
    }
}

/// List series.
#[utoipa::path(get, path = "/v1/series", tag = "discovery", params(ListQuery),
    responses((status = 200, body = SeriesListResponse), (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse), (status = 422, body = ValidationErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn list_series(
    State(state): State<ApiState>,
    _caller: Caller,
    q: ListQuery,
) -> Result<Json<SeriesListResponse>, ApiError> {
    let paging = q.page("/v1/series")?;
    let catalog = state.catalog.snapshot();
    let (page, next) = catalog.series.page(
        q.sort,
        q.order,
        paging.after.as_ref(),
        q.search.as_deref(),
        q.limit,
        |s| {
            q.start_date().keeps(s.start_date)
                && q.end_date().keeps(s.end_date)
                && q.keeps_tags(&s.tags)
        },
    );
    let data: Vec<SeriesItem> = page.into_iter().map(|s| series_item(s)).collect();
    Ok(Json(SeriesListResponse {
        metadata: metadata(&q, &paging, data.len(), next),
        data,
    }))
}

/// List events, optionally of one series.
#[utoipa::path(get, path = "/v1/events", tag = "discovery", params(ListQuery, EventFilter),
    responses((status = 200, body = EventListResponse), (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse), (status = 422, body = ValidationErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn list_events(
    State(state): State<ApiState>,
    _caller: Caller,
    q: ListQuery<EventFilter>,
) -> Result<Json<EventListResponse>, ApiError> {
    let paging = q.page("/v1/events")?;
    let catalog = state.catalog.snapshot();
    // An unknown series slug matches nothing (rather than everything).
    let series_by_slug = q
        .filter
        .series_slug
        .as_ref()
        .map(|s| catalog.series_id_by_slug(s).unwrap_or("\0").to_string());
    let (page, next) = catalog.events.page(
        q.sort,
        q.order,
        paging.after.as_ref(),
        q.search.as_deref(),
        q.limit,
        |e| {
            let series = e.series_id.as_deref();
            q.filter
                .series_id
                .as_deref()
                .is_none_or(|id| series == Some(id))
                && series_by_slug
                    .as_deref()
                    .is_none_or(|id| series == Some(id))
                && q.start_date().keeps(e.start_date)
                && q.end_date().keeps(e.end_date)
                && q.keeps_tags(&e.tags)
        },
    );
    let data: Vec<EventItem> = page.into_iter().map(|e| event_item(e)).collect();
    Ok(Json(EventListResponse {
        metadata: metadata(&q, &paging, data.len(), next),
        data,
    }))
}

/// List markets with their tokens.
#[utoipa::path(get, path = "/v1/markets", tag = "discovery", params(ListQuery, MarketFilter),
    responses((status = 200, body = MarketListResponse), (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse), (status = 422, body = ValidationErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn list_markets(
    State(state): State<ApiState>,
    _caller: Caller,
    q: ListQuery<MarketFilter>,
) -> Result<Json<MarketListResponse>, ApiError> {
    let paging = q.page("/v1/markets")?;
    let catalog = state.catalog.snapshot();
    let event_by_slug = q
        .filter
        .event_slug
        .as_ref()
        .map(|s| catalog.event_id_by_slug(s).unwrap_or("\0").to_string());
    let no_tags: Vec<String> = Vec::new();
    let (page, next) = catalog.markets.page(
        q.sort,
        q.order,
        paging.after.as_ref(),
        q.search.as_deref(),
        q.limit,
        |m| {
            let event = m.event_id.as_deref();
            q.filter
                .event_id
                .as_deref()
                .is_none_or(|id| event == Some(id))
                && event_by_slug.as_deref().is_none_or(|id| event == Some(id))
                && q.start_date().keeps(m.start_date)
                && q.end_date().keeps(m.end_date)
                && q.keeps_tags(catalog.event_of(m).map_or(&no_tags, |e| &e.tags))
        },
    );
    let data: Vec<MarketItem> = page.into_iter().map(|m| market_item(m)).collect();
    Ok(Json(MarketListResponse {
        metadata: metadata(&q, &paging, data.len(), next),
        data,
    }))
}

/// One market with detail, by id or slug.
#[utoipa::path(get, path = "/v1/markets/{id_or_slug}", tag = "discovery",
    params(("id_or_slug" = String, Path, min_length = 1, max_length = 200, description = "Market id or slug")),
    responses((status = 200, body = MarketDetail), (status = 401, body = ErrorResponse), (status = 404, body = ErrorResponse),
        (status = 422, body = ValidationErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn get_market(
    State(state): State<ApiState>,
    _caller: Caller,
    Path(id_or_slug): Path<String>,
) -> Result<Json<MarketDetail>, ApiError> {
    let key = path_id("id_or_slug", id_or_slug)?;
    let m = state
        .store
        .market(&key)
        .await?
        .ok_or_else(|| ApiError::NotFound("Market not found".into()))?;
    Ok(Json(MarketDetail {
        market: market_item(&m),
        description: m.description.clone(),
        closed_at: iso(m.closed_at),
        resolved_token_id: m.resolved_token_id.clone(),
        resolved_token_label: m.resolved_token_label.clone(),
    }))
}

/// Unique tags of series and events, for discovery filters.
#[utoipa::path(get, path = "/v1/tags", tag = "discovery",
    responses((status = 200, body = TagListResponse), (status = 401, body = ErrorResponse), (status = 429, body = ErrorResponse)))]
pub async fn list_tags(State(state): State<ApiState>, _caller: Caller) -> Json<TagListResponse> {
    let catalog = state.catalog.snapshot();
    Json(TagListResponse {
        count: catalog.tags.len(),
        data: catalog.tags.clone(),
    })
}
