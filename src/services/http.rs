//! The one HTTP server loop every listener runs (ingest, api, dev, ops).
//!
//! `axum::serve` has no header-read timeout, no idle timeout and no
//! connection cap, so one client could hold connections open for ever (a
//! slowloris sending a byte a second, idle keep-alive connections, a reader
//! that never reads its response) until the process runs out of file
//! descriptors. This loop bounds each of those, per listener:
//!
//! - **connections**: at most `max_connections` at once; the next one waits
//!   in the kernel's accept queue until one closes (established connections
//!   keep being served);
//! - **header timeout**: a request's head must arrive whole within it, once
//!   the connection is ready to read one (hyper's `header_read_timeout`; it
//!   also runs while a kept-alive connection waits for its next request);
//! - **idle timeout**: a connection with no request being handled that
//!   moves no byte either way for this long is closed (idle keep-alive
//!   connections, and readers that stopped reading their response);
//! - **request timeout**: a handler (body read included) that has not
//!   answered within it is answered 408 with a JSON `detail`.
//!
//! Each listener reports its open connections, its cap and what each bound
//! cut short (`ListenerEvents`), so an SRE can tell a flood or a slow
//! client from an idle service.

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use axum::Router;
use hindsight_telemetry as tm;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics::{Counter, Gauge};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// The bounds of every connection of a listener (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub request_timeout: Duration,
    pub max_connections: u32,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            max_connections: 512,
        }
    }
}

/// What the serving loop does to one listener's connections, as the
/// metrics `hindsight_http_*` labelled by `listener`. Registered (at zero)
/// when [`serve`] is called, so an alert can tell zero from absent.
#[derive(Clone)]
struct ListenerEvents {
    open: Gauge,
    header_timeouts: Counter,
    idle_closes: Counter,
    request_timeouts: Counter,
}

impl ListenerEvents {
    fn register(listener: &'static str, max_connections: u32) -> Self {
        metrics::gauge!(tm::HTTP_MAX_CONNECTIONS, "listener" => listener)
            .set(f64::from(max_connections));
        let timeouts = |bound: &'static str| {
            let counter =
                metrics::counter!(tm::HTTP_TIMEOUTS, "listener" => listener, "bound" => bound);
            counter.increment(0);
            counter
        };
        let open = metrics::gauge!(tm::HTTP_OPEN_CONNECTIONS, "listener" => listener);
        open.increment(0.0);
        ListenerEvents {
            open,
            header_timeouts: timeouts("header"),
            idle_closes: timeouts("idle"),
            request_timeouts: timeouts("request"),
        }
    }
}

/// One open connection in [`ListenerEvents::open`], for as long as it lives.
struct OpenConnection(Gauge);

impl OpenConnection {
    fn new(open: &Gauge) -> Self {
        open.increment(1.0);
        OpenConnection(open.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Serves `router` on `listener` within `limits` until `stop` turns true,
/// then stops accepting, lets requests in progress finish, and returns once
/// every connection is closed (idle ones at once, stalled ones within the
/// idle timeout). `name` labels the listener's metrics (the service's name,
/// or `ops`).
///
/// The metrics are registered when this is called, not when the future is
/// first polled: the listener is bound and the service's other listeners
/// may already answer `/metrics`, which must list this one's at zero.
pub fn serve(
    name: &'static str,
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = io::Result<()>> + Send + 'static {
    let max = limits
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS as u32);
    let events = ListenerEvents::register(name, max);
    accept_loop(listener, router, limits, stop, events, max)
}

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
    events: ListenerEvents,
    max: u32,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(max as usize));
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = stopped(&mut stop) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => (stream, peer),
                Err(e) => {
                    // Out of file descriptors (or a connection reset before
                    // it was accepted): wait a little instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        let (router, stop, events) = (router.clone(), stop.clone(), events.clone());
        tokio::spawn(async move {
            let open = OpenConnection::new(&events.open);
            serve_connection(stream, peer, router, limits, &events, stop).await;
            drop(open);
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a permit until it closes.
    let _all = slots.acquire_many(max).await;
    Ok(())
}

/// Completes once the stop signal turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn serve_connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    router: Router,
    limits: HttpLimits,
    events: &ListenerEvents,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        let timeouts = events.request_timeouts.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let (router, activity) = (router.clone(), activity.clone());
            let timeouts = timeouts.clone();
            async move {
                let _busy = activity.busy();
                let mut req = req.map(Body::new);
                // The client's address (sign-in throttling per address).
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                let response = handle(router, req, limits.request_timeout).await;
                if response.status() == StatusCode::REQUEST_TIMEOUT {
                    timeouts.increment(1);
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let idle_deadline = activity.last() + limits.idle_timeout;
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    if e.is_timeout() {
                        events.header_timeouts.increment(1);
                    }
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = stopped(&mut stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep_until(idle_deadline) => {
                if activity.idle_for() >= limits.idle_timeout {
                    tracing::debug!("closing an idle connection");
                    events.idle_closes.increment(1);
                    return;
                }
            }
        }
    }
}

/// `router`'s answer, or 408 when it takes longer than `timeout`.
async fn handle(router: Router, req: Request<Body>, timeout: Duration) -> Response<Body> {
    let mut router = router;
    match tokio::time::timeout(timeout, tower_service::Service::call(&mut router, req)).await {
        Ok(Ok(response)) => response,
        Ok(Err(never)) => match never {},
        Err(_) => {
            let mut response = Response::new(Body::from(format!(
                r#"{{"detail":"the request did not complete within {} s"}}"#,
                timeout.as_secs_f64()
            )));
            *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            // The request body may be half read: the connection cannot be
            // reused.
            headers.insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            response
        }
    }
}

/// When a connection last moved a byte, and how many of its requests are
/// being handled (a connection is never idle while one is).
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    busy: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    fn idle_for(&self) -> Duration {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        self.last().elapsed()
    }

    fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }
}

/// A request being handled; it counts as activity when it ends.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that records in [`Activity`] every read or write that moves bytes.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
