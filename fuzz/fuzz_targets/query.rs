//! The query parsers of `api/src/query.rs` (history routes and the three
//! discovery lists, with their cursors) on arbitrary query strings. Every string either parses
//! to values within the documented bounds or is refused with a 400 or 422
//! whose body is JSON with a `detail`: never a panic, never a 5xx.
#![no_main]

use axum::extract::FromRequestParts;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use hindsight_api::error::ApiError;
use hindsight_api::query::{
    EventFilter, HistoryQuery, ListFilter, ListQuery, MarketFilter, NoFilter, HISTORY_LIMIT_MAX,
    LIST_LIMIT_MAX, SEARCH_MAX,
};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}

async fn extract<T: FromRequestParts<(), Rejection = ApiError>>(
    query: &str,
) -> Option<Result<T, ApiError>> {
    // A query the HTTP layer could not parse never reaches the extractor.
    let request = Request::get(format!("/x?{query}")).body(()).ok()?;
    let (mut parts, ()) = request.into_parts();
    Some(T::from_request_parts(&mut parts, &()).await)
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

/// A discovery list's query (with the list's own filter `F`), and its
/// cursor checked against the list.
async fn check_list<F: ListFilter>(query: &str, list: &str) {
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
    if let Err(e) = q.cursor(list) {
        check_refusal(e).await;
    }
}

fuzz_target!(|query: &str| {
    runtime().block_on(async {
        match extract::<HistoryQuery>(query).await {
            None => return,
            Some(Ok(q)) => {
                assert!(q.start <= q.end);
                assert!(q.start <= q.from() && q.from() <= q.end);
                assert!((1..=HISTORY_LIMIT_MAX).contains(&q.limit), "{}", q.limit);
                assert_eq!(q.range(q.limit).limit, q.limit + 1);
            }
            Some(Err(e)) => check_refusal(e).await,
        }
        check_list::<MarketFilter>(query, "markets").await;
        check_list::<EventFilter>(query, "events").await;
        check_list::<NoFilter>(query, "series").await;
    });
});
