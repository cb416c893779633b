//! Every listener bounds its connections: slow heads, idle keep-alive
//! connections, stalled requests and connection floods cannot hold the
//! server; and dev's ops routes can have their own listener. Each bound
//! shows on the listener's metrics (the test binary shares one recorder, so
//! they are compared before and after).

use crate::helpers::*;
use hindsight::services::http::HttpLimits;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn limits(header: u64, idle: u64, request: u64, max_connections: u32) -> Options {
    Options {
        http: HttpLimits {
            header_timeout: Duration::from_secs(header),
            idle_timeout: Duration::from_secs(idle),
            request_timeout: Duration::from_secs(request),
            max_connections,
        },
        ..Options::default()
    }
}

fn addr(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

async fn connect(base: &str) -> TcpStream {
    TcpStream::connect(addr(base)).await.unwrap()
}

/// Writes a keep-alive GET of `path` with the test key.
async fn send_get(stream: &mut TcpStream, path: &str) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nX-API-Key: {API_KEY}\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
}

/// Reads one response (head and `Content-Length` body); its status.
async fn read_response(stream: &mut TcpStream) -> u16 {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                return head[9..12].parse().unwrap();
            }
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed mid-response");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Whether the server closed `stream` within `within` (reads nothing more).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut chunk = [0u8; 1024];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut chunk)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_disconnected_within_the_header_timeout() {
    let app = spawn_app_with("slowloris", limits(1, 60, 60, 64)).await;
    let cut = r#"hindsight_http_timeouts_total{listener="api",bound="header"}"#;
    let before = metric_value(&app.ops, cut).await;
    let mut stream = connect(&app.api).await;
    stream
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut closed = false;
    // One more header byte a second, for at most 6 s.
    for byte in b"X-Slow: aaaaaa".iter().take(6) {
        if closed_within(&mut stream, Duration::from_secs(1)).await {
            closed = true;
            break;
        }
        if stream.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
    }
    let took = started.elapsed();
    assert!(closed, "a slowloris was still connected after {took:?}");
    assert!(took < Duration::from_secs(3), "closed only after {took:?}");
    assert!(
        metric_value(&app.ops, cut).await > before,
        "{cut} not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let app = spawn_app_with("idle-keepalive", limits(30, 1, 60, 64)).await;
    let cut = r#"hindsight_http_timeouts_total{listener="api",bound="idle"}"#;
    let before = metric_value(&app.ops, cut).await;
    let mut stream = connect(&app.api).await;
    send_get(&mut stream, "/v1/health").await;
    assert_eq!(read_response(&mut stream).await, 200);
    let started = Instant::now();
    assert!(
        closed_within(&mut stream, Duration::from_secs(5)).await,
        "an idle keep-alive connection stayed open"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "closed after {took:?}, not about the 1 s idle timeout"
    );
    assert!(
        metric_value(&app.ops, cut).await > before,
        "{cut} not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_request_body_is_answered_408_with_a_json_detail() {
    let app = spawn_app_with("stalled-body", limits(30, 30, 1, 64)).await;
    let cut = r#"hindsight_http_timeouts_total{listener="ingest",bound="request"}"#;
    let before = metric_value(&app.ops, cut).await;
    let mut stream = connect(&app.ingest).await;
    let head = format!(
        "POST /ingest/v1/events HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {INGEST_TOKEN}\r\nContent-Length: 1000\r\n\r\n{{\"kind\""
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .expect("a stalled request is answered within its timeout")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert!(
        response.contains("application/json") && response.contains(r#"{"detail":"#),
        "{response}"
    );
    assert!(
        metric_value(&app.ops, cut).await > before,
        "{cut} not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_cap_connections_wait_while_established_ones_answer_and_are_released() {
    const CAP: usize = 4;
    let app = spawn_app_with("connection-cap", limits(30, 30, 30, CAP as u32)).await;
    let mut established = Vec::new();
    for _ in 0..CAP {
        let mut stream = connect(&app.api).await;
        send_get(&mut stream, "/v1/health").await;
        assert_eq!(read_response(&mut stream).await, 200);
        established.push(stream);
    }
    // Connection CAP + 1 is not served while the others are open...
    let mut waiting = connect(&app.api).await;
    send_get(&mut waiting, "/v1/health").await;
    let answered = tokio::time::timeout(Duration::from_secs(1), read_response(&mut waiting)).await;
    assert!(answered.is_err(), "connection {} was served", CAP + 1);
    // ...while an established connection still answers /v1/health.
    send_get(&mut established[0], "/v1/health").await;
    assert_eq!(read_response(&mut established[0]).await, 200);
    // Clients going away release their slots: the waiting one is served.
    established.truncate(CAP - 1);
    let status = tokio::time::timeout(Duration::from_secs(5), read_response(&mut waiting))
        .await
        .expect("the waiting connection is served once a slot is free");
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_serves_ops_on_its_own_listener_and_then_not_metrics_publicly() {
    let shared = spawn_dev("dev-ops-shared").await;
    assert_eq!(shared.ops, shared.api);
    let r = client()
        .get(format!("{}/metrics", shared.api))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "dev serves /metrics on its one address");

    let apart = spawn_dev_with(
        "dev-ops-apart",
        Options {
            ops_listener: true,
            ..Options::default()
        },
    )
    .await;
    assert_ne!(apart.ops, apart.api);
    for path in ["/metrics", "/livez", "/readyz"] {
        let r = client()
            .get(format!("{}{path}", apart.ops))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path} on the ops listener");
        let r = client()
            .get(format!("{}{path}", apart.api))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path} on the public address");
    }
    let (status, _) = get(&apart, "/v1/health").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_public_listener_does_not_starve_the_ops_listener() {
    let app = spawn_dev_with(
        "ops-not-starved",
        Options {
            ops_listener: true,
            ..limits(30, 30, 30, 2)
        },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = connect(&app.api).await;
        send_get(&mut stream, "/v1/health").await;
        assert_eq!(read_response(&mut stream).await, 200);
        held.push(stream);
    }
    let mut over = connect(&app.api).await;
    send_get(&mut over, "/v1/health").await;
    let answered = tokio::time::timeout(Duration::from_secs(1), read_response(&mut over)).await;
    assert!(answered.is_err(), "the public listener is over its cap");
    // The ops listener shows the public one's open connections (at least
    // the two held here; the one over the cap waits unaccepted).
    let open = r#"hindsight_http_open_connections{listener="dev"}"#;
    assert!(metric_value(&app.ops, open).await >= 2.0, "{open} below 2");
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        client().get(format!("{}/metrics", app.ops)).send(),
    )
    .await
    .expect("the ops listener answers while the public one is full")
    .unwrap();
    assert_eq!(r.status(), 200);
}
