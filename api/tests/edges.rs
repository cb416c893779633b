//! The API router's answers at its edges (issue 12), in process over a
//! real (empty) SQLite store: JSON error bodies on every status, timestamp
//! range errors, and the headers every response carries.

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::Router;
use hindsight_api::{keys, router};
use hindsight_contracts::{AuthStore, ReadStore};
use hindsight_sqlite::SqliteStore;
use std::sync::Arc;
use tower::ServiceExt;

mod common;

const KEY: &str = "hsk_edges_test_key";

struct Api {
    app: Router,
    _dir: tempfile::TempDir,
}

async fn api() -> Api {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path()).unwrap());
    store
        .put_key(keys::record_for(KEY, "org", "enterprise"))
        .await
        .unwrap();
    let read: Arc<dyn ReadStore> = store.clone();
    let app = router(common::parts(read, store.clone(), store).into());
    Api { app, _dir: dir }
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, serde_json::Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{} body is not JSON ({e}): {:?}",
            parts.status,
            String::from_utf8_lossy(&bytes)
        )
    });
    (parts.status, parts.headers, json)
}

fn get(path: &str) -> axum::http::request::Builder {
    Request::get(path).header("x-api-key", KEY)
}

#[tokio::test]
async fn error_statuses_405_414_431_answer_json_detail() {
    let api = api().await;
    let post = Request::post("/v1/health")
        .header("x-api-key", KEY)
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = send(&api.app, post).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("POST is not allowed"),
        "{body}"
    );

    let long = format!("/v1/markets?search={}", "a".repeat(9000));
    let (status, _, body) = send(&api.app, get(&long).body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::URI_TOO_LONG);
    assert!(
        body["detail"].as_str().unwrap().contains("at most 8192"),
        "{body}"
    );

    let big = "x".repeat(17 * 1024);
    let request = get("/v1/health")
        .header("x-big", big)
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = send(&api.app, request).await;
    assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert!(body["detail"].is_string(), "{body}");
}

#[tokio::test]
async fn a_start_ts_of_1e20_is_reported_out_of_range_not_as_i64_max() {
    let api = api().await;
    let path = "/v1/tokens/t1/prices?start_ts=1e20&end_ts=1756684800&resolution=1h";
    let (status, _, body) = send(&api.app, get(path).body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("Invalid start_ts: 100000000000000000000 is out of range"),
        "{detail}"
    );
    assert!(!detail.contains("9223372036854775807"), "{detail}");
}

#[tokio::test]
async fn every_response_is_nosniff_and_key_bearing_ones_are_no_store() {
    let api = api().await;
    let with_key = [
        get("/v1/usage").body(Body::empty()).unwrap(),
        get("/v1/markets/nope").body(Body::empty()).unwrap(),
        Request::get("/v1/health")
            .header("x-api-key", "hsk_wrong")
            .body(Body::empty())
            .unwrap(),
    ];
    for request in with_key {
        let path = request.uri().to_string();
        let (status, headers, _) = send(&api.app, request).await;
        assert_eq!(
            headers[header::X_CONTENT_TYPE_OPTIONS],
            "nosniff",
            "{path} {status}"
        );
        assert_eq!(
            headers[header::CACHE_CONTROL],
            "no-store",
            "{path} {status}"
        );
    }
    let (_, headers, _) = send(
        &api.app,
        Request::get("/openapi.json").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert!(
        headers.get(header::CACHE_CONTROL).is_none(),
        "a keyless document may be cached"
    );
}
