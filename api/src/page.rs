//! History pages on the wire: encoded straight from the store's rows into
//! their thread's buffer, room reserved up front ([`Writer`]), copied once
//! into a body of exactly their size, then answered with a strong `ETag`
//! (a hash of those bytes) and a caching policy that depends on whether
//! the page is closed (docs/DESIGN.md, "Caching history").
//!
//! The JSON is byte for byte what serde writes for the documented response
//! types of `hindsight_schemas::api` (the OpenAPI document is generated from
//! them; a test here holds the two together). Writing it by hand skips the
//! copy of every point into those types, the per-label maps of market pages,
//! and the buffer's repeated growth: a page is one allocation (its body),
//! plus its `next_cursor`.

use crate::error::ApiError;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use hindsight_contracts as read;
use hindsight_schemas::{IsoTime, IsoWriter, Timestamp};
use serde_json::value::RawValue;

/// `Cache-Control` of a closed page: no bucket it holds will receive an
/// in-order event any more. Not `immutable`: a late event or a backfill may
/// still change a closed bucket (its `ETag` then changes), so caches keep
/// it for minutes, not forever — which also bounds how long a revoked key's
/// pages stay in a shared cache.
pub const CLOSED: &str = "public, max-age=300";
/// `Cache-Control` of an open page: its last bucket may still be filling.
pub const OPEN: &str = "public, max-age=5";
/// Every history page is some key's answer: a shared cache keeps one copy
/// per key, and never hands it to a request with another key or none.
pub const VARY: &str = "X-API-Key";

/// An encoded history page, answered as JSON with its validators.
pub struct Page {
    body: bytes::Bytes,
    closed: bool,
}

impl Page {
    /// The page's strong entity tag: the XXH3-128 of its bytes, so it
    /// changes whenever the body does (a late tick, a cursor signed with a
    /// new secret) and never otherwise.
    pub fn etag(body: &[u8]) -> String {
        format!("\"{:032x}\"", twox_hash::XxHash3_128::oneshot(body))
    }

    /// The page with its `ETag` computed, ready to answer (and to keep:
    /// clones share the bytes).
    pub fn seal(self) -> Sealed {
        let etag = HeaderValue::from_str(&Page::etag(&self.body)).expect("hex is a valid header");
        Sealed {
            body: self.body,
            etag,
            closed: self.closed,
        }
    }

    #[cfg(test)]
    pub(crate) fn from_body(body: Vec<u8>, closed: bool) -> Page {
        Page {
            body: body.into(),
            closed,
        }
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        self.seal().into_response()
    }
}

/// A page with its validator: what the page cache keeps and every history
/// route answers.
#[derive(Clone)]
pub struct Sealed {
    body: bytes::Bytes,
    etag: HeaderValue,
    closed: bool,
}

impl Sealed {
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    pub fn len(&self) -> usize {
        self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

impl IntoResponse for Sealed {
    fn into_response(self) -> Response {
        let policy = if self.closed { CLOSED } else { OPEN };
        (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (header::ETAG, self.etag),
                (header::CACHE_CONTROL, HeaderValue::from_static(policy)),
                (header::VARY, HeaderValue::from_static(VARY)),
            ],
            self.body,
        )
            .into_response()
    }
}

/// One point of a series, as the store returns it and the page writes it.
pub trait Point {
    /// The bucket start.
    fn t(&self) -> Timestamp;
    /// Bytes it will take on the wire, near enough to size the buffer.
    fn size_hint(&self) -> usize;
    fn write(&self, w: &mut Writer) -> Result<(), ApiError>;
    /// Whether the point is a stored bucket (not one `fill` made up): only
    /// a stored bucket after a page shows the projector has passed it.
    fn stored(&self) -> bool {
        true
    }
}

/// A point `fill=previous` can carry into an empty bucket.
pub trait Carry: Point + Clone {
    /// This point's value at bucket `t`, marked `"filled": true`.
    fn write_carried(&self, t: Timestamp, w: &mut Writer) -> Result<(), ApiError>;
}

/// A point of a series with gaps filled: a stored bucket, or the last
/// stored one before it carried into empty bucket `t`.
#[derive(Debug, Clone)]
pub enum Gap<P> {
    Stored(P),
    Filled { t: Timestamp, from: P },
}

impl<P: Carry> Point for Gap<P> {
    fn t(&self) -> Timestamp {
        match self {
            Gap::Stored(p) => p.t(),
            Gap::Filled { t, .. } => *t,
        }
    }
    fn size_hint(&self) -> usize {
        match self {
            Gap::Stored(p) => p.size_hint(),
            Gap::Filled { from, .. } => from.size_hint() + 16,
        }
    }
    fn write(&self, w: &mut Writer) -> Result<(), ApiError> {
        match self {
            Gap::Stored(p) => p.write(w),
            Gap::Filled { t, from } => from.write_carried(*t, w),
        }
    }
    fn stored(&self) -> bool {
        matches!(self, Gap::Stored(_))
    }
}

impl Carry for read::PricePoint {
    fn write_carried(&self, t: Timestamp, w: &mut Writer) -> Result<(), ApiError> {
        w.raw(b"{\"t\":");
        w.time(t);
        w.raw(b",\"p\":");
        w.number(self.p);
        w.raw(b",\"filled\":true}");
        Ok(())
    }
}

impl Carry for read::CandlePoint {
    /// The previous close as open, high, low and close, and no ticks.
    fn write_carried(&self, t: Timestamp, w: &mut Writer) -> Result<(), ApiError> {
        let close = read::Candle::of(read::Mark {
            ts: t,
            offset: 0,
            p: stored_candle(self)?.close.p,
        });
        let carried = read::CandlePoint {
            t,
            count: 0,
            candle: Some(close),
            trades: None,
        };
        carried.write(w)?;
        w.buf.pop();
        w.raw(b",\"filled\":true}");
        Ok(())
    }
}

/// Bytes of `{"t":"2025-09-01T00:00:00.000Z",` and a few separators.
const POINT_BASE: usize = 40;
/// The longest `f64` serde writes, with its key.
const NUMBER: usize = 36;

impl Point for read::PricePoint {
    fn t(&self) -> Timestamp {
        self.t
    }
    fn size_hint(&self) -> usize {
        POINT_BASE + NUMBER
    }
    fn write(&self, w: &mut Writer) -> Result<(), ApiError> {
        w.raw(b"{\"t\":");
        w.time(self.t);
        w.raw(b",\"p\":");
        w.number(self.p);
        w.raw(b"}");
        Ok(())
    }
}

/// The candle of a stored point, or the 409 of a bucket projected before
/// candles were stored: refused rather than served with a candle of part
/// of a bucket.
fn stored_candle(p: &read::CandlePoint) -> Result<&read::Candle, ApiError> {
    p.candle.as_ref().ok_or_else(|| {
        ApiError::NotDerived(format!(
            "The candle of the bucket at {} was not stored: the bucket was projected \
             before candles were. The operator fills it by running `hindsight rebuild` \
             (runbooks/rebuild-read-model.md).",
            p.t.to_rfc3339()
        ))
    })
}

impl Point for read::CandlePoint {
    fn t(&self) -> Timestamp {
        self.t
    }
    fn size_hint(&self) -> usize {
        POINT_BASE + 5 * NUMBER + 60
    }
    fn write(&self, w: &mut Writer) -> Result<(), ApiError> {
        let c = stored_candle(self)?;
        w.raw(b"{\"t\":");
        w.time(self.t);
        w.raw(b",\"o\":");
        w.number(c.open.p);
        w.raw(b",\"h\":");
        w.number(c.high);
        w.raw(b",\"l\":");
        w.number(c.low);
        w.raw(b",\"c\":");
        w.number(c.close.p);
        w.raw(b",\"n\":");
        serde_json::to_writer(&mut w.buf, &self.count).expect("writing to a Vec cannot fail");
        if let Some(trades) = &self.trades {
            w.raw(b",\"volume\":");
            w.number(trades.volume);
            w.raw(b",\"trades\":");
            serde_json::to_writer(&mut w.buf, &trades.count).expect("writing to a Vec cannot fail");
        }
        w.raw(b"}");
        Ok(())
    }
}

impl Point for read::MetricsPoint {
    fn t(&self) -> Timestamp {
        self.t
    }
    fn size_hint(&self) -> usize {
        POINT_BASE + 3 * NUMBER
    }
    fn write(&self, w: &mut Writer) -> Result<(), ApiError> {
        w.raw(b"{\"t\":");
        w.time(self.t);
        w.raw(b",\"volume\":");
        w.number(self.volume);
        w.raw(b",\"liquidity\":");
        w.number(self.liquidity);
        w.raw(b",\"spread\":");
        w.number(self.spread);
        w.raw(b"}");
        Ok(())
    }
}

impl Point for read::BookPoint {
    fn t(&self) -> Timestamp {
        self.t
    }
    fn size_hint(&self) -> usize {
        POINT_BASE + 20 + self.bids.len() + self.asks.len()
    }
    fn write(&self, w: &mut Writer) -> Result<(), ApiError> {
        w.raw(b"{\"t\":");
        w.time(self.t);
        w.raw(b",\"bids\":");
        w.json(&self.bids)?;
        w.raw(b",\"asks\":");
        w.json(&self.asks)?;
        w.raw(b"}");
        Ok(())
    }
}

/// Bytes `point` takes in a page (its encoding and the comma after it);
/// its size hint when it cannot be encoded (a bucket without a candle).
pub fn point_len<P: Point>(point: &P) -> usize {
    let mut w = Writer::with_capacity(point.size_hint());
    match point.write(&mut w) {
        Ok(()) => w.buf.len() + 1,
        Err(_) => point.size_hint() + 1,
    }
}

/// A tick-level point: a price tick as `{"t","p"}`, a snapshot as
/// `{"t","bids","asks"}` (the bucket points' shapes, with the exact time),
/// a trade as `{"t","price","size","side","trade_id"}`.
impl Point for read::Tick {
    fn t(&self) -> Timestamp {
        self.key.ts
    }
    fn size_hint(&self) -> usize {
        match &self.value {
            read::TickValue::Price { .. } => POINT_BASE + NUMBER,
            read::TickValue::Book { bids, asks } => POINT_BASE + 20 + bids.len() + asks.len(),
            read::TickValue::Trade { trade_id, .. } => {
                POINT_BASE + 2 * NUMBER + 40 + trade_id.as_ref().map_or(4, |id| id.len() + 8)
            }
        }
    }
    fn write(&self, w: &mut Writer) -> Result<(), ApiError> {
        w.raw(b"{\"t\":");
        w.time(self.key.ts);
        match &self.value {
            read::TickValue::Price { p } => {
                w.raw(b",\"p\":");
                w.number(*p);
            }
            read::TickValue::Book { bids, asks } => {
                w.raw(b",\"bids\":");
                w.json(bids)?;
                w.raw(b",\"asks\":");
                w.json(asks)?;
            }
            read::TickValue::Trade {
                price,
                size,
                side,
                trade_id,
            } => {
                w.raw(b",\"price\":");
                w.number(*price);
                w.raw(b",\"size\":");
                w.number(*size);
                w.raw(b",\"side\":");
                w.string(side.as_str());
                w.raw(b",\"trade_id\":");
                match trade_id {
                    Some(id) => w.string(id),
                    None => w.raw(b"null"),
                }
            }
        }
        w.raw(b"}");
        Ok(())
    }
}

/// The buffer a page is written into: its thread's, kept from page to
/// page ([`SCRATCH`]), with room reserved for the points' size hints; the
/// page's body is a copy of exactly the bytes written ([`Writer::finish`]).
///
/// Why not a buffer of its own, handed over as the body: the hints are
/// upper bounds (a 200-point price page of 7.6 KB reserved 15.6 KB), and
/// a body kept the whole buffer, in the page cache too, which counts a
/// page by its bytes: a 64 MB cache of price pages held about twice that.
/// Copying 8 KB takes well under a microsecond, of the ~200 µs of CPU a
/// cache-missed page takes (10 206 pages/s on two cores, `api` run 71).
pub struct Writer {
    buf: Vec<u8>,
    /// Keeps the date of the last timestamp, which the next mostly shares.
    iso: IsoWriter,
}

thread_local! {
    /// Each thread's page buffer, lent to one [`Writer`] at a time.
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A buffer grown past this (a page of thousands of book levels) goes
/// back to the allocator instead of staying with its thread.
const SCRATCH_KEPT: usize = 1 << 20;

impl Writer {
    fn with_capacity(bytes: usize) -> Self {
        let mut buf = SCRATCH.take();
        buf.clear();
        buf.reserve(bytes);
        Writer {
            buf,
            iso: IsoWriter::default(),
        }
    }

    /// The bytes written, as a body of exactly their size.
    fn finish(self) -> bytes::Bytes {
        bytes::Bytes::copy_from_slice(&self.buf)
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// A JSON string, escaped as serde escapes it.
    fn string(&mut self, text: &str) {
        serde_json::to_writer(&mut self.buf, text).expect("writing to a Vec cannot fail");
    }

    /// A number as serde writes an `f64` (shortest round trip; `null` if
    /// not finite).
    fn number(&mut self, value: f64) {
        serde_json::to_writer(&mut self.buf, &value).expect("writing to a Vec cannot fail");
    }

    fn count(&mut self, n: usize) {
        serde_json::to_writer(&mut self.buf, &n).expect("writing to a Vec cannot fail");
    }

    fn time(&mut self, t: Timestamp) {
        let mut text = [0u8; 24];
        match self.iso.write(t, &mut text) {
            // Digits, `-`, `:`, `.`, `T` and `Z`: nothing JSON escapes.
            Some(iso) => {
                self.buf.push(b'"');
                self.buf.extend_from_slice(iso);
                self.buf.push(b'"');
            }
            None => serde_json::to_writer(&mut self.buf, &IsoTime(t))
                .expect("writing to a Vec cannot fail"),
        }
    }

    /// Stored JSON text (book levels), checked and written as it is, less
    /// surrounding whitespace (as `RawValue` would).
    fn json(&mut self, text: &str) -> Result<(), ApiError> {
        let value: &RawValue = serde_json::from_str(text)
            .map_err(|e| ApiError::invariant(format!("stored book levels are not JSON: {e}")))?;
        self.raw(value.get().as_bytes());
        Ok(())
    }

    /// `"key":"value",` (every head field is followed by another).
    fn field(&mut self, key: &str, value: &str) {
        self.string(key);
        self.raw(b":");
        self.string(value);
        self.raw(b",");
    }

    fn points<P: Point>(&mut self, points: &[P]) -> Result<(), ApiError> {
        self.raw(b"[");
        for (i, p) in points.iter().enumerate() {
            if i > 0 {
                self.raw(b",");
            }
            p.write(self)?;
        }
        self.raw(b"]");
        Ok(())
    }

    fn metadata(&mut self, meta: &Meta) {
        self.raw(b"\"metadata\":{\"count\":");
        self.count(meta.count);
        self.raw(b",\"limit\":");
        self.count(meta.limit);
        self.raw(b",\"next_cursor\":");
        match &meta.next_cursor {
            Some(c) => self.string(c),
            None => self.raw(b"null"),
        }
        self.raw(b"}}");
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.buf.capacity() <= SCRATCH_KEPT {
            SCRATCH.set(std::mem::take(&mut self.buf));
        }
    }
}

/// `metadata` of a page.
pub struct Meta {
    pub count: usize,
    pub limit: usize,
    pub next_cursor: Option<String>,
}

fn head_size(head: &[(&str, &str)], meta: &Meta) -> usize {
    let fields: usize = head.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
    fields + 96 + meta.next_cursor.as_ref().map_or(0, String::len)
}

fn points_size<P: Point>(points: &[P]) -> usize {
    points.iter().map(|p| p.size_hint() + 1).sum::<usize>() + 2
}

/// A page of one series: the `head` string fields in order, then
/// `"data": [points]` and `metadata` (token and metrics routes).
pub fn series<P: Point>(
    head: &[(&str, &str)],
    points: &[P],
    meta: &Meta,
    closed: bool,
) -> Result<Page, ApiError> {
    let mut w = Writer::with_capacity(head_size(head, meta) + points_size(points));
    w.raw(b"{");
    for (k, v) in head {
        w.field(k, v);
    }
    w.raw(b"\"data\":");
    w.points(points)?;
    w.raw(b",");
    w.metadata(meta);
    Ok(Page {
        body: w.finish(),
        closed,
    })
}

/// One token's part of a market page.
pub struct TokenSeries<'a, P> {
    pub label: &'a str,
    pub id: &'a str,
    pub points: Vec<P>,
}

/// A page of every token of a market: `tokens` (label → id) and `data`
/// (label → points), both in label order as a JSON object from a
/// `BTreeMap` is (labels are unique within a market: ingest refuses a
/// repeated one).
pub fn market<P: Point>(
    head: &[(&str, &str)],
    tokens: &mut [TokenSeries<'_, P>],
    meta: &Meta,
    closed: bool,
) -> Result<Page, ApiError> {
    tokens.sort_by(|a, b| a.label.cmp(b.label));
    let size = head_size(head, meta)
        + tokens
            .iter()
            .map(|s| 2 * s.label.len() + s.id.len() + 12 + points_size(&s.points))
            .sum::<usize>();
    let mut w = Writer::with_capacity(size);
    w.raw(b"{");
    for (k, v) in head {
        w.field(k, v);
    }
    w.raw(b"\"tokens\":{");
    for (i, s) in tokens.iter().enumerate() {
        if i > 0 {
            w.raw(b",");
        }
        w.string(s.label);
        w.raw(b":");
        w.string(s.id);
    }
    w.raw(b"},\"data\":{");
    for (i, s) in tokens.iter().enumerate() {
        if i > 0 {
            w.raw(b",");
        }
        w.string(s.label);
        w.raw(b":");
        w.points(&s.points)?;
    }
    w.raw(b"},");
    w.metadata(meta);
    Ok(Page {
        body: w.finish(),
        closed,
    })
}

#[cfg(test)]
mod tests {
    //! The hand-written encoding is the serde encoding of the documented
    //! response types, byte for byte, and fits the buffer it sized.
    use super::*;
    use hindsight_schemas::api;
    use std::collections::BTreeMap;

    fn meta(next: Option<&str>) -> (Meta, api::PageMetadata) {
        let next = next.map(str::to_string);
        (
            Meta {
                count: 2,
                limit: 7,
                next_cursor: next.clone(),
            },
            api::PageMetadata {
                count: 2,
                limit: 7,
                next_cursor: next,
            },
        )
    }

    fn prices() -> Vec<read::PricePoint> {
        vec![
            read::PricePoint {
                t: Timestamp(1_756_684_800_000),
                p: 0.1 + 0.2,
            },
            read::PricePoint {
                t: Timestamp(1_756_684_860_123),
                p: 1.0,
            },
        ]
    }

    fn api_prices(points: &[read::PricePoint]) -> Vec<api::PricePoint> {
        points
            .iter()
            .map(|p| api::PricePoint {
                t: IsoTime(p.t),
                p: p.p,
                filled: false,
            })
            .collect()
    }

    /// The page never outgrew the room reserved for it (so the buffer did
    /// not grow while it was written).
    fn fits(page: &Page, sized: usize) {
        assert!(
            page.body.len() <= sized,
            "{} bytes in a buffer sized for {sized}",
            page.body.len()
        );
    }

    #[test]
    fn a_trades_page_is_the_serde_encoding_of_its_documented_type() {
        let (m, doc_meta) = meta(None);
        let head = [
            ("market_id", "m1"),
            ("token_id", "t1"),
            ("token_label", "Yes"),
        ];
        let trade = |ms: i64, side, id: Option<&str>| read::Tick {
            token_id: "t1".into(),
            key: read::TickKey {
                ts: Timestamp(ms),
                partition: 0,
                offset: ms as u64,
            },
            value: read::TickValue::Trade {
                price: 0.1 + 0.2,
                size: 1e15,
                side,
                trade_id: id.map(Box::from),
            },
        };
        use hindsight_schemas::TradeSide;
        let points = vec![
            trade(1_756_684_800_001, TradeSide::Buy, Some("x\"1")),
            trade(1_756_684_800_002, TradeSide::Sell, None),
        ];
        let page = series(&head, &points, &m, false).unwrap();
        let expected = serde_json::to_vec(&api::TokenTradesResponse {
            market_id: "m1".into(),
            token_id: "t1".into(),
            token_label: "Yes".into(),
            data: points
                .iter()
                .map(|p| match &p.value {
                    read::TickValue::Trade {
                        price,
                        size,
                        side,
                        trade_id,
                    } => api::TradePoint {
                        t: IsoTime(p.key.ts),
                        price: *price,
                        size: *size,
                        side: side.as_str().into(),
                        trade_id: trade_id.as_deref().map(String::from),
                    },
                    _ => unreachable!(),
                })
                .collect(),
            metadata: doc_meta,
        })
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&page.body),
            String::from_utf8_lossy(&expected)
        );
        fits(&page, head_size(&head, &m) + points_size(&points));
    }

    #[test]
    fn a_token_prices_page_is_the_serde_encoding_of_its_documented_type() {
        let (m, doc_meta) = meta(Some("h\"quoted\u{1}"));
        let head = [
            ("market_id", "m\u{e9}1"),
            ("token_id", "t1"),
            ("token_label", "Y\"es"),
            ("resolution", "1m"),
        ];
        let points = prices();
        let page = series(&head, &points, &m, true).unwrap();
        let expected = serde_json::to_vec(&api::TokenPricesResponse {
            market_id: "m\u{e9}1".into(),
            token_id: "t1".into(),
            token_label: "Y\"es".into(),
            resolution: "1m".into(),
            data: api_prices(&points),
            metadata: doc_meta,
        })
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&page.body),
            String::from_utf8_lossy(&expected)
        );
        fits(&page, head_size(&head, &m) + points_size(&points));
    }

    #[test]
    fn metrics_and_books_pages_are_the_serde_encoding_of_their_documented_types() {
        let (m, doc_meta) = meta(None);
        let metrics = vec![read::MetricsPoint {
            t: Timestamp(0),
            volume: 10.0,
            liquidity: f64::NAN,
            spread: 1e-7,
        }];
        let page = series(
            &[("market_id", "m"), ("resolution", "1d")],
            &metrics,
            &m,
            false,
        )
        .unwrap();
        let expected = serde_json::to_vec(&api::MetricsResponse {
            market_id: "m".into(),
            resolution: "1d".into(),
            data: vec![api::MetricsPoint {
                t: IsoTime(Timestamp(0)),
                volume: 10.0,
                liquidity: f64::NAN,
                spread: 1e-7,
            }],
            metadata: doc_meta,
        })
        .unwrap();
        assert_eq!(page.body, expected);

        let (m, doc_meta) = meta(Some("c"));
        let book = |t, bids: &str| read::BookPoint {
            t: Timestamp(t),
            bids: bids.into(),
            asks: " [[0.6,1.5]] ".into(),
        };
        let mut tokens = vec![
            TokenSeries {
                label: "Yes",
                id: "ty",
                points: vec![book(60_000, "[[0.4,1]]"), book(120_000, "[]")],
            },
            TokenSeries {
                label: "No",
                id: "tn",
                points: vec![],
            },
        ];
        let page = market(
            &[("market_id", "m"), ("resolution", "1m")],
            &mut tokens,
            &m,
            true,
        )
        .unwrap();
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        let api_book = |p: &read::BookPoint| api::BookPoint {
            t: IsoTime(p.t),
            bids: raw(&p.bids),
            asks: raw(&p.asks),
        };
        let expected = serde_json::to_vec(&api::MarketBooksResponse {
            market_id: "m".into(),
            resolution: "1m".into(),
            tokens: BTreeMap::from([("Yes".into(), "ty".into()), ("No".into(), "tn".into())]),
            data: BTreeMap::from([
                (
                    "Yes".into(),
                    tokens[1].points.iter().map(api_book).collect(),
                ),
                ("No".into(), vec![]),
            ]),
            metadata: doc_meta,
        })
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&page.body),
            String::from_utf8_lossy(&expected)
        );
    }

    #[test]
    fn a_candles_page_is_the_serde_encoding_of_its_documented_type() {
        let (m, doc_meta) = meta(Some("next"));
        let mark = |ms: i64, p: f64| read::Mark {
            ts: Timestamp(1_756_684_800_000 + ms),
            offset: 3,
            p,
        };
        let candle = read::Candle {
            open: mark(5, 0.1 + 0.2),
            close: mark(59_000, 1.0),
            high: 1.0,
            low: 0.0,
        };
        let points = vec![
            read::CandlePoint {
                t: Timestamp(1_756_684_800_000),
                count: 12_345,
                candle: Some(candle),
                trades: None,
            },
            read::CandlePoint {
                t: Timestamp(1_756_684_860_000),
                count: 1,
                candle: Some(candle),
                trades: Some(read::TradeTotals {
                    volume: 0.1 + 0.2,
                    count: 7,
                }),
            },
        ];
        let head = [
            ("market_id", "m"),
            ("token_id", "t"),
            ("token_label", "Yes"),
            ("resolution", "1m"),
        ];
        let page = series(&head, &points, &m, false).unwrap();
        let expected = serde_json::to_vec(&api::TokenCandlesResponse {
            market_id: "m".into(),
            token_id: "t".into(),
            token_label: "Yes".into(),
            resolution: "1m".into(),
            data: vec![
                api::CandlePoint {
                    t: IsoTime(points[0].t),
                    o: 0.1 + 0.2,
                    h: 1.0,
                    l: 0.0,
                    c: 1.0,
                    n: 12_345,
                    volume: None,
                    trades: None,
                    filled: false,
                },
                api::CandlePoint {
                    t: IsoTime(points[1].t),
                    o: 0.1 + 0.2,
                    h: 1.0,
                    l: 0.0,
                    c: 1.0,
                    n: 1,
                    volume: Some(0.1 + 0.2),
                    trades: Some(7),
                    filled: false,
                },
            ],
            metadata: doc_meta,
        })
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&page.body),
            String::from_utf8_lossy(&expected)
        );
        fits(&page, head_size(&head, &m) + points_size(&points));
    }

    #[test]
    fn a_bucket_without_its_candle_is_refused_with_409_not_served_partly() {
        let (m, _) = meta(None);
        let old = [read::CandlePoint {
            t: Timestamp(0),
            count: 4,
            candle: None,
            trades: None,
        }];
        let err = series(&[], &old, &m, true).err().unwrap();
        assert_eq!(err.status(), axum::http::StatusCode::CONFLICT);
    }

    #[test]
    fn book_levels_that_are_not_json_are_an_internal_error() {
        let (m, _) = meta(None);
        let broken = [read::BookPoint {
            t: Timestamp(0),
            bids: "[[0.4,".into(),
            asks: "[]".into(),
        }];
        let err = series(&[], &broken, &m, true).err().unwrap();
        assert_eq!(err.status(), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn the_etag_is_a_strong_tag_that_follows_the_bytes() {
        let a = Page::etag(b"{\"data\":[]}");
        assert_eq!(a, Page::etag(b"{\"data\":[]}"));
        assert_ne!(a, Page::etag(b"{\"data\":[1]}"));
        assert!(
            a.starts_with('"') && a.ends_with('"') && a.len() == 34,
            "{a}"
        );
    }
}
