//! The ingest router's answers at its edges (issue 12), driven in process
//! over a real SQLite event log: encodings, error bodies, limits, headers.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use flate2::write::GzEncoder;
use flate2::Compression;
use hindsight_contracts::EventLog;
use hindsight_ingest::catalog::CatalogView;
use hindsight_ingest::http::{router, IngestLimits, IngestState};
use hindsight_sqlite::{SqliteLog, SqliteStore};
use std::io::Write;
use std::sync::Arc;
use tower::ServiceExt;

const TOKEN: &str = "ingest-edges-token";
const MAX_BODY: usize = 1 << 20;
const TICK: &str =
    r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":"2025-09-01T00:00:30Z","p":0.42}"#;

/// The catalog of the embedded store in `dir`.
fn catalog_of(dir: &std::path::Path) -> Arc<CatalogView> {
    let store = Arc::new(SqliteStore::open(dir).unwrap());
    Arc::new(CatalogView::new(
        store,
        IngestLimits::default().catalog_max_age,
    ))
}

struct Ingest {
    app: Router,
    _dir: tempfile::TempDir,
}

fn ingest() -> Ingest {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> = Arc::new(SqliteLog::open(dir.path()).unwrap());
    let app = router(IngestState {
        log,
        token: TOKEN.into(),
        max_body_bytes: MAX_BODY,
        limits: IngestLimits::default(),
        catalog: catalog_of(dir.path()),
    });
    Ingest { app, _dir: dir }
}

fn post() -> axum::http::request::Builder {
    Request::post("/ingest/v1/events").header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
}

async fn send(
    app: &Router,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
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

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[tokio::test]
async fn unknown_content_encodings_are_refused_with_415_and_a_detail() {
    let ingest = ingest();
    for coding in ["br", "deflate", "gzip, br", "compress"] {
        let request = post()
            .header(header::CONTENT_ENCODING, coding)
            .body(Body::from(TICK))
            .unwrap();
        let (status, _, body) = send(&ingest.app, request).await;
        assert_eq!(
            status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{coding}: {body}"
        );
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("is not supported"),
            "{body}"
        );
    }
    let identity = post()
        .header(header::CONTENT_ENCODING, "identity")
        .body(Body::from(TICK))
        .unwrap();
    assert_eq!(send(&ingest.app, identity).await.2["accepted"], 1);
}

#[tokio::test]
async fn a_body_gzipped_twice_and_labelled_gzip_gzip_is_decoded_twice() {
    let ingest = ingest();
    let request = post()
        .header(header::CONTENT_ENCODING, "gzip, gzip")
        .body(Body::from(gzip(&gzip(TICK.as_bytes()))))
        .unwrap();
    let (status, _, body) = send(&ingest.app, request).await;
    assert_eq!(
        (status, &body["accepted"]),
        (StatusCode::OK, &1.into()),
        "{body}"
    );
    // Three layers is refused: each could cost a full body of copying.
    let request = post()
        .header(header::CONTENT_ENCODING, "gzip, gzip, gzip")
        .body(Body::from(gzip(&gzip(&gzip(TICK.as_bytes())))))
        .unwrap();
    let (status, _, body) = send(&ingest.app, request).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
}

#[tokio::test]
async fn a_utf8_bom_before_the_first_line_is_skipped() {
    let ingest = ingest();
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend_from_slice(format!("{TICK}\n{TICK}\n").as_bytes());
    let (status, _, body) =
        send(&ingest.app, post().body(Body::from(bytes.clone())).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["accepted"], &body["rejected_count"]),
        (&2.into(), &0.into()),
        "{body}"
    );
    // And under gzip too.
    let request = post()
        .header(header::CONTENT_ENCODING, "gzip")
        .body(Body::from(gzip(&bytes)))
        .unwrap();
    assert_eq!(send(&ingest.app, request).await.2["accepted"], 2);
}

#[tokio::test]
async fn error_statuses_405_413_414_431_answer_json_detail() {
    let ingest = ingest();
    let get = Request::get("/ingest/v1/events")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = send(&ingest.app, get).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("method GET is not allowed"),
        "{body}"
    );

    let big = vec![b' '; MAX_BODY + 1];
    let (status, _, body) = send(&ingest.app, post().body(Body::from(big)).unwrap()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        body["detail"].as_str().unwrap().contains("split the batch"),
        "{body}"
    );

    let long = format!("/ingest/v1/events?{}", "a".repeat(9000));
    let (status, _, body) = send(
        &ingest.app,
        Request::post(long).body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::URI_TOO_LONG);
    assert!(
        body["detail"].as_str().unwrap().contains("at most 8192"),
        "{body}"
    );

    let mut many = post();
    for i in 0..70 {
        many = many.header(format!("x-filler-{i}"), "1");
    }
    let (status, _, body) = send(&ingest.app, many.body(Body::from(TICK)).unwrap()).await;
    assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert!(body["detail"].is_string(), "{body}");
}

#[tokio::test]
async fn an_all_invalid_batch_lists_at_most_1000_rejects_and_counts_them_all() {
    let ingest = ingest();
    let body = "{oops\n".repeat(5000);
    let (status, _, body) = send(&ingest.app, post().body(Body::from(body)).unwrap()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["rejected_count"], 5000);
    assert_eq!(body["rejected"].as_array().unwrap().len(), 1000);
    assert_eq!(body["rejected_truncated"], true);
    assert_eq!(
        body["note"],
        "only the first 1000 of 5000 rejected lines are listed"
    );
}

#[tokio::test]
async fn every_response_is_nosniff_and_no_store() {
    let ingest = ingest();
    let ok = send(&ingest.app, post().body(Body::from(TICK)).unwrap()).await;
    let unauthorized = send(
        &ingest.app,
        Request::post("/ingest/v1/events")
            .body(Body::from(TICK))
            .unwrap(),
    )
    .await;
    for (status, headers, _) in [ok, unauthorized] {
        assert_eq!(
            headers[header::X_CONTENT_TYPE_OPTIONS],
            "nosniff",
            "{status}"
        );
        assert_eq!(headers[header::CACHE_CONTROL], "no-store", "{status}");
    }
}

#[tokio::test]
async fn a_tick_from_2099_is_refused_as_in_the_future() {
    let ingest = ingest();
    let line =
        r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":"2099-12-31T00:00:00Z","p":0.5}"#;
    let (status, _, body) = send(&ingest.app, post().body(Body::from(line)).unwrap()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["rejected"][0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("field `ts`: 2099-12-31"),
        "{body}"
    );
}

#[tokio::test]
async fn backfill_refuses_future_ticks_like_http_and_lists_them_in_the_rejects_file() {
    use hindsight_ingest::backfill::{backfill_file, rejects_path, Progress, Target};
    use hindsight_ingest::catalog::BatchClaims;
    let dir = tempfile::tempdir().unwrap();
    let log = SqliteLog::open(&dir.path().join("log")).unwrap();
    let file = dir.path().join("ticks.ndjson");
    let future =
        r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":"2099-12-31T00:00:00Z","p":0.5}"#;
    // A BOM first, as some exporters write it: skipped, not a reject.
    std::fs::write(&file, format!("\u{FEFF}{TICK}\n{future}\n")).unwrap();
    let catalog = catalog_of(dir.path());
    let target = Target {
        log: &log,
        catalog: &catalog,
        limits: Default::default(),
    };
    let mut claims = BatchClaims::default();
    let report = backfill_file(&target, &mut claims, &file, &mut Progress::new(false))
        .await
        .unwrap();
    assert_eq!((report.accepted, report.rejected), (1, 1), "{report:?}");
    let rejects = std::fs::read_to_string(rejects_path(&file)).unwrap();
    let reject: serde_json::Value = serde_json::from_str(rejects.trim()).unwrap();
    assert_eq!(reject["line"], 2);
    assert!(
        reject["reason"]
            .as_str()
            .unwrap()
            .contains("allowed clock skew"),
        "{reject}"
    );
}

/// Three chunks of ticks (the chunk is 20 000 lines), read and validated
/// each while the last is appended, on a runtime of two workers as the
/// binary's. Run again with the keys as a build before 2026-11-27 recorded
/// them (each chunk's SHA-256), the chunks are skipped all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_run_again_skips_its_chunks_and_refuses_one_whose_lines_changed() {
    use hindsight_ingest::backfill::{backfill_file, Progress, Target};
    use hindsight_ingest::catalog::BatchClaims;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ticks.ndjson");
    let line = |i: u64, p: &str| {
        format!(
            r#"{{"kind":"price","market_id":"m1","token_id":"t1","ts":{},"p":{p}}}"#,
            1_756_684_800 + i
        )
    };
    let lines: Vec<String> = (0..45_000).map(|i| line(i, "0.42")).collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let log = SqliteLog::open(&dir.path().join("log")).unwrap();
    let target = Target {
        log: &log,
        catalog: &catalog_of(dir.path()),
        limits: Default::default(),
    };
    let run = || async {
        backfill_file(
            &target,
            &mut BatchClaims::default(),
            &file,
            &mut Progress::new(false),
        )
        .await
    };
    let first = run().await.unwrap();
    assert_eq!(
        (first.accepted, first.already_appended),
        (45_000, 0),
        "{first:?}"
    );
    let again = run().await.unwrap();
    assert_eq!(
        (again.accepted, again.already_appended),
        (0, 45_000),
        "{again:?}"
    );

    // Keys `backfill:{file}:{chunk}` in chunk order, each with its chunk's
    // lines' SHA-256, as earlier builds kept them.
    {
        use sha2::{Digest, Sha256};
        let db = rusqlite::Connection::open(dir.path().join("log").join("log.db")).unwrap();
        let keys: Vec<String> = db
            .prepare("SELECT key FROM idempotency ORDER BY first_offset")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(keys.len(), 3, "{keys:?}");
        for (key, chunk) in keys.iter().zip(lines.chunks(20_000)) {
            assert!(key.starts_with("backfill:"), "{key}");
            let digest: [u8; 32] = Sha256::digest(chunk.join("\n") + "\n").into();
            let set = "UPDATE idempotency SET body_sha256 = ?1 WHERE key = ?2";
            assert_eq!(db.execute(set, rusqlite::params![digest, key]).unwrap(), 1);
        }
    }
    let after_upgrade = run().await.unwrap();
    assert_eq!(
        (after_upgrade.accepted, after_upgrade.already_appended),
        (0, 45_000),
        "{after_upgrade:?}"
    );

    // The same length and modification time (so the same keys), another
    // price on the third chunk's last line: its digest differs.
    let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
    let mut changed = lines;
    changed[44_999] = line(44_999, "0.43");
    std::fs::write(&file, changed.join("\n") + "\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    let refused = run().await.unwrap_err();
    assert!(
        refused.contains("lines 40001.. were appended before with other content"),
        "{refused}"
    );
}
