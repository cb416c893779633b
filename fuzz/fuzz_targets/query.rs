//! The query parsers of `api/src/query.rs` (history routes and the three
//! discovery lists, with their cursors) on arbitrary query strings. Every
//! string either parses to values within the documented bounds or is
//! refused with a 400 or 422 whose body is JSON with a `detail`: never a
//! panic, never a 5xx. A query that parses gets its page: from its cursor
//! only if the API signed that cursor for this route, series (or list) and
//! query; and a cursor the page writes, added to the query, continues
//! there and is refused on another route or series.
#![no_main]

use axum::extract::FromRequestParts;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use hindsight_api::cursor::{CursorKeys, ListCursor};
use hindsight_api::error::ApiError;
use hindsight_api::query::{
    EventFilter, HistoryQuery, ListFilter, ListQuery, MarketFilter, NoFilter, HISTORY_LIMIT_MAX,
    LIST_LIMIT_MAX, LOOKAHEAD_BUCKETS, SEARCH_MAX,
};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// The API's cursor secret (the seed corpus's cursors are signed with it).
const SECRET: &str = "hindsight-fuzz-cursor-secret-0123456789abcdef";
const PRICES: &str = "/v1/tokens/{token_id}/prices";
const BOOKS: &str = "/v1/tokens/{token_id}/books";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}

fn keys() -> &'static CursorKeys {
    static KEYS: OnceLock<CursorKeys> = OnceLock::new();
    KEYS.get_or_init(|| CursorKeys::new(&[SECRET]).unwrap())
}

async fn extract<T: FromRequestParts<CursorKeys, Rejection = ApiError>>(
    query: &str,
) -> Option<Result<T, ApiError>> {
    // A query the HTTP layer could not parse never reaches the extractor.
    let request = Request::get(format!("/x?{query}")).body(()).ok()?;
    let (mut parts, ()) = request.into_parts();
    Some(T::from_request_parts(&mut parts, keys()).await)
}

/// `query` with `cursor` as its last (so its effective) `cursor`, unless
/// the query has a fragment that would swallow it.
fn with_cursor(query: &str, cursor: &str) -> Option<String> {
    (!query.contains('#')).then(|| format!("{query}&cursor={cursor}"))
}

/// A refusal is a 400 or 422 with a JSON `detail`.
async fn check_refusal(e: ApiError) {
    let response = e.into_response();
    let status = response.status();
    assert!(
        status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY,
        "{status}"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
    assert!(!json["detail"].is_null(), "{json}");
}

async fn check_history(query: &str) {
    let q = match extract::<HistoryQuery>(query).await {
        None => return,
        Some(Err(e)) => return check_refusal(e).await,
        Some(Ok(q)) => q,
    };
    assert!(q.start <= q.end);
    assert!((1..=HISTORY_LIMIT_MAX).contains(&q.limit), "{}", q.limit);
    let page = match q.page(PRICES, "t1") {
        Err(e) => return check_refusal(e).await,
        Ok(page) => page,
    };
    assert!(q.start <= page.from && page.from <= q.end);
    // `tick` is paged by tick keys, not bucket ranges: a route that serves
    // only buckets refuses it (422), and the bucket checks stop there.
    let res = match q.bucket() {
        Err(e) => return check_refusal(e).await,
        Ok(res) => res,
    };
    let range = q.range(res, &page, q.limit);
    // The store read reaches past `end_ts` to see whether a later bucket
    // closes the page (points past `end_ts` are never served).
    let lookahead = res.width_ms() * LOOKAHEAD_BUCKETS;
    assert_eq!(range.start, page.from);
    assert_eq!(range.end.0, q.end.0.saturating_add(lookahead));
    assert_eq!(range.limit, q.limit + 1);
    // The next page's cursor continues this query, and nothing else.
    let Some(next) = with_cursor(query, &page.next_cursor(q.end)) else {
        return;
    };
    let q = extract::<HistoryQuery>(&next).await.unwrap().unwrap();
    assert_eq!(q.page(PRICES, "t1").unwrap().from, q.end);
    for (route, id) in [(BOOKS, "t1"), (PRICES, "t2")] {
        check_refusal(q.page(route, id).unwrap_err()).await;
    }
}

/// A discovery list's query (with the list's own filter `F`) at `route`.
async fn check_list<F: ListFilter>(query: &str, route: &str) {
    let q = match extract::<ListQuery<F>>(query).await {
        None => return,
        Some(Err(e)) => return check_refusal(e).await,
        Some(Ok(q)) => q,
    };
    assert!((1..=LIST_LIMIT_MAX).contains(&q.limit), "{}", q.limit);
    assert!(q
        .search
        .as_ref()
        .is_none_or(|s| s.chars().count() <= SEARCH_MAX));
    for range in [q.start_date(), q.end_date()] {
        if let (Some(min), Some(max)) = (range.min, range.max) {
            assert!(min <= max);
        }
    }
    let page = match q.page(route) {
        Err(e) => return check_refusal(e).await,
        Ok(page) => page,
    };
    let last = ListCursor {
        key: Some(1_756_684_800_000),
        id: "m-1".into(),
    };
    let Some(next) = with_cursor(query, &page.next_cursor(&last)) else {
        return;
    };
    let q = extract::<ListQuery<F>>(&next).await.unwrap().unwrap();
    assert_eq!(q.page(route).unwrap().after, Some(last));
    let elsewhere = if route == "/v1/series" {
        "/v1/events"
    } else {
        "/v1/series"
    };
    check_refusal(q.page(elsewhere).unwrap_err()).await;
}

fuzz_target!(|query: &str| {
    runtime().block_on(async {
        check_history(query).await;
        check_list::<MarketFilter>(query, "/v1/markets").await;
        check_list::<EventFilter>(query, "/v1/events").await;
        check_list::<NoFilter>(query, "/v1/series").await;
    });
});
