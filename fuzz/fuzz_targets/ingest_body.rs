//! Ingest body handling (`ingest/src/http.rs`): `Content-Encoding` and gzip
//! layers in front of the NDJSON parser and the catalog check, through the
//! real ingest router, the embedded SQLite log, and a catalog view of an
//! embedded store holding market `m1` (tokens `t1`, `t2`, slug `will-it`),
//! so that lines contradicting it (another market's tick on `t1`, a market
//! listing `t2` or taking `will-it`) are refused; all in
//! `HINDSIGHT_FUZZ_SCRATCH`, else the temporary directory.
//!
//! An input is a first line, then the body. Two shapes:
//! - `layers=N` (N = 0..3): the harness gzips the body N times and says so
//!   in `Content-Encoding`, so the fuzzer explores NDJSON behind valid gzip.
//!   The answer must be what validating the plain body against the same
//!   catalog gives: the same accepted and rejected counts, 413 when the plain body is over the
//!   limit, 415 for three layers (at most two are undone).
//! - anything else: the line is `Content-Encoding` values, one header each,
//!   split at `|` (empty: no header), sent with the body as is (corrupt
//!   gzip, bombs, unknown codings). The answer must be one of the documented statuses
//!   with a JSON body: never a 5xx, a panic or an unbounded allocation.
#![no_main]

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::Router;
use flate2::write::GzEncoder;
use flate2::Compression;
use hindsight_contracts::{Position, ProjectionStore, ProjectionWrite};
use hindsight_ingest::batch;
use hindsight_ingest::catalog::{BatchClaims, CatalogView};
use hindsight_ingest::http::{router, IngestLimits, IngestState, MAX_GZIP_LAYERS};
use hindsight_schemas::claims::Claims;
use hindsight_schemas::wire::parse_line;
use hindsight_schemas::Timestamp;
use hindsight_sqlite::{SqliteLog, SqliteStore};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower::ServiceExt;

const TOKEN: &str = "hsi_fuzz";
/// Small, so that bodies and gzip bombs over the limit are within reach.
const MAX_BODY: usize = 2048;
/// The market the store's catalog holds (as the seed corpus writes it).
const STORED_MARKET: &str = r#"{"kind":"market","id":"m1","slug":"will-it","event_id":"e1","question":"Will it?","status":"open","tokens":[{"id":"t1","label":"Yes"},{"id":"t2","label":"No"}],"updated_at":"2025-09-01T00:00:00Z"}"#;

enum Input<'a> {
    Layered {
        layers: usize,
        plain: &'a [u8],
    },
    Raw {
        encodings: Vec<&'a [u8]>,
        body: &'a [u8],
    },
}

fn parse(data: &[u8]) -> Input<'_> {
    let (head, body) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    match head.strip_prefix(b"layers=") {
        Some([n]) if n.is_ascii_digit() => Input::Layered {
            layers: usize::from(n - b'0') % 4,
            plain: body,
        },
        _ => Input::Raw {
            encodings: head
                .split(|b| *b == b'|')
                .filter(|v| !v.is_empty())
                .collect(),
            body,
        },
    }
}

struct Harness {
    rt: tokio::runtime::Runtime,
    router: Router,
    catalog: Arc<CatalogView>,
    _dir: std::path::PathBuf,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // scripts/fuzz.sh names a scratch directory (on tmpfs) it removes.
        let base = std::env::var_os("HINDSIGHT_FUZZ_SCRATCH")
            .map_or_else(std::env::temp_dir, std::path::PathBuf::from);
        let dir = base.join(format!("ingest-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log = Arc::new(SqliteLog::open(&dir).unwrap());
        let store = Arc::new(SqliteStore::open(&dir).unwrap());
        // Read once and never again (nothing projects here): every input
        // is checked against the same catalog.
        let catalog = Arc::new(CatalogView::new(store.clone(), Duration::MAX));
        rt.block_on(async {
            let market = parse_line(STORED_MARKET, Timestamp::now()).unwrap();
            let write = ProjectionWrite {
                catalog: vec![(
                    Position {
                        partition: 0,
                        offset: 0,
                    },
                    market,
                )],
                ..Default::default()
            };
            let applied = store.apply(write).await.unwrap();
            assert!(applied.refused.is_empty(), "{applied:?}");
            catalog.refresh().await;
            assert_eq!(catalog.read().token_market("t2"), Some("m1"));
        });
        let router = router(IngestState {
            log,
            token: TOKEN.into(),
            max_body_bytes: MAX_BODY,
            limits: IngestLimits::default(),
            catalog: catalog.clone(),
        });
        Harness {
            rt,
            router,
            catalog,
            _dir: dir,
        }
    })
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

async fn post(
    router: &Router,
    encodings: &[HeaderValue],
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let mut request = Request::post("/ingest/v1/events")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::from(body))
        .unwrap();
    for value in encodings {
        request
            .headers_mut()
            .append(header::CONTENT_ENCODING, value.clone());
    }
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{status}: body is not JSON ({e}): {bytes:?}"));
    (status, json)
}

fn counts(json: &serde_json::Value) -> (u64, u64) {
    (
        json["accepted"].as_u64().unwrap(),
        json["rejected_count"].as_u64().unwrap(),
    )
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    h.rt.block_on(async {
        match parse(data) {
            Input::Layered { layers, plain } => {
                let mut body = plain.to_vec();
                // Every layer, once undone, must fit the limit too.
                let mut largest = body.len();
                for _ in 0..layers {
                    body = gzip(&body);
                    largest = largest.max(body.len());
                }
                let coding = vec!["gzip"; layers].join(", ");
                let encodings: Vec<HeaderValue> = if layers == 0 {
                    vec![]
                } else {
                    vec![HeaderValue::from_str(&coding).unwrap()]
                };
                let (status, json) = post(&h.router, &encodings, body).await;
                let expected = if layers > MAX_GZIP_LAYERS {
                    StatusCode::UNSUPPORTED_MEDIA_TYPE
                } else if largest > MAX_BODY {
                    StatusCode::PAYLOAD_TOO_LARGE
                } else {
                    let v = batch::validate(
                        plain,
                        1,
                        Timestamp::now(),
                        &Default::default(),
                        usize::MAX,
                        &*h.catalog.read(),
                        &mut BatchClaims::default(),
                    );
                    let want = (v.events.len() as u64, v.rejected_count as u64);
                    assert_eq!(counts(&json), want, "{json}");
                    if v.events.is_empty() && v.rejected_count > 0 {
                        StatusCode::UNPROCESSABLE_ENTITY
                    } else {
                        StatusCode::OK
                    }
                };
                assert_eq!(status, expected, "{json}");
            }
            Input::Raw { encodings, body } => {
                let encodings: Vec<HeaderValue> = encodings
                    .iter()
                    .filter_map(|v| HeaderValue::from_bytes(v).ok())
                    .collect();
                let (status, json) = post(&h.router, &encodings, body.to_vec()).await;
                match status {
                    StatusCode::OK | StatusCode::UNPROCESSABLE_ENTITY => {
                        let (accepted, rejected) = counts(&json);
                        assert!(status == StatusCode::OK || (accepted == 0 && rejected > 0));
                    }
                    StatusCode::BAD_REQUEST
                    | StatusCode::PAYLOAD_TOO_LARGE
                    | StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                        assert!(json["detail"].is_string(), "{status}: {json}");
                    }
                    // More `Content-Encoding` lines (and the token's) than a
                    // request may carry, or more bytes of them.
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => {
                        let bytes: usize = encodings
                            .iter()
                            .map(|v| header::CONTENT_ENCODING.as_str().len() + v.len())
                            .sum::<usize>()
                            + header::AUTHORIZATION.as_str().len()
                            + format!("Bearer {TOKEN}").len();
                        assert!(
                            encodings.len() + 1 > hindsight_http::MAX_HEADERS
                                || bytes > hindsight_http::MAX_HEADER_BYTES,
                            "431 for {} encodings of {bytes} bytes: {json}",
                            encodings.len()
                        );
                        assert!(json["detail"].is_string(), "{status}: {json}");
                    }
                    other => panic!("unexpected {other}: {json}"),
                }
            }
        }
    });
});
