//! The ingest wire format and every validation rule.
//!
//! Pipelines send one JSON object per line (NDJSON). Each line names its
//! `kind`; fields beyond the ones a kind uses are allowed and ignored, so
//! producers can add their own. [`parse_line`] turns one line into a
//! validated [`Event`] or a [`Reject`]: a [`RejectKind`] (what metrics count
//! by), the field when there is one, and the text ingest reports next to the
//! line number.

use crate::event::*;
use crate::time::Timestamp;
use crate::MAX_ID_LEN;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;

mod flat;

/// Why a line was refused, as far as an operator can count it. The label
/// is the `reason` of the ingest reject metric, so dashboards and alerts
/// can group by it; the human text stays in [`Reject`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectKind {
    /// The line is not UTF-8 text.
    NotUtf8,
    /// Not a JSON object (syntax error, `NaN`, an array…).
    MalformedJson,
    /// A field holds a JSON value of the wrong type (`"p": "0.5"`).
    WrongType,
    /// `kind` is none of the event kinds.
    UnknownKind,
    /// A field the line's kind requires is absent.
    MissingField,
    /// An id, text, tag, label or list that must not be empty is.
    Empty,
    /// Longer than its cap: an id, tag or label over [`MAX_ID_LEN`]
    /// characters, a text over [`MAX_TITLE_LEN`] / [`MAX_TEXT_LEN`], more
    /// than [`MAX_TAGS`] tags, a book side over [`Limits::max_book_levels`].
    TooLong,
    /// An id with a character it may not contain (`/`, whitespace, control,
    /// zero-width or bidi-override characters).
    BadId,
    /// A number outside its range: a probability above 1, a negative size.
    OutOfRange,
    /// A timestamp that does not parse or lies outside 2000..2100.
    BadTimestamp,
    /// A timestamp later than now plus [`Limits::max_future_skew_ms`].
    InTheFuture,
    /// Book levels not best first.
    BookNotBestFirst,
    /// A token id or label given twice in one market.
    Duplicate,
    /// Fields that contradict each other (a winner that is not a token).
    Inconsistent,
    /// A price tick or book snapshot whose token the catalog lists under
    /// another market (field `market_id`): folded, it would land in that
    /// market's history.
    MarketMismatch,
    /// A market listing a token the catalog lists under another market
    /// (field `tokens[i].id`): a token belongs to the first market that
    /// lists it.
    TokenClaimed,
    /// A market whose slug another market of the catalog has (field
    /// `slug`): `/v1/markets/{slug}` must name one market.
    SlugTaken,
}

impl RejectKind {
    pub const ALL: [RejectKind; 17] = [
        RejectKind::NotUtf8,
        RejectKind::MalformedJson,
        RejectKind::WrongType,
        RejectKind::UnknownKind,
        RejectKind::MissingField,
        RejectKind::Empty,
        RejectKind::TooLong,
        RejectKind::BadId,
        RejectKind::OutOfRange,
        RejectKind::BadTimestamp,
        RejectKind::InTheFuture,
        RejectKind::BookNotBestFirst,
        RejectKind::Duplicate,
        RejectKind::Inconsistent,
        RejectKind::MarketMismatch,
        RejectKind::TokenClaimed,
        RejectKind::SlugTaken,
    ];

    /// The kinds found against the catalog ([`crate::claims`]) rather than
    /// by [`parse_line`]: a line is refused for them by what other lines
    /// said before it, not by its own content.
    pub const CATALOG: [RejectKind; 3] = [
        RejectKind::MarketMismatch,
        RejectKind::TokenClaimed,
        RejectKind::SlugTaken,
    ];

    /// The metric label: short, bounded, stable (dashboards and alerts
    /// select on it), and defined here only.
    pub const fn label(self) -> &'static str {
        match self {
            RejectKind::NotUtf8 => "not_utf8",
            RejectKind::MalformedJson => "malformed_json",
            RejectKind::WrongType => "wrong_type",
            RejectKind::UnknownKind => "unknown_kind",
            RejectKind::MissingField => "missing_field",
            RejectKind::Empty => "empty",
            RejectKind::TooLong => "too_long",
            RejectKind::BadId => "bad_id",
            RejectKind::OutOfRange => "out_of_range",
            RejectKind::BadTimestamp => "bad_timestamp",
            RejectKind::InTheFuture => "in_the_future",
            RejectKind::BookNotBestFirst => "book_not_best_first",
            RejectKind::Duplicate => "duplicate",
            RejectKind::Inconsistent => "inconsistent",
            RejectKind::MarketMismatch => "market_mismatch",
            RejectKind::TokenClaimed => "token_claimed",
            RejectKind::SlugTaken => "slug_taken",
        }
    }
}

/// A refused line: its kind, the field it concerns (when there is one) and
/// the text a pipeline author reads (`field `p`: 1.5 is not a probability
/// in [0, 1]`), which is what `Display` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Reject {
    kind: RejectKind,
    field: Option<String>,
    text: String,
}

impl Reject {
    fn new(kind: RejectKind, field: Option<&str>, text: String) -> Self {
        Reject {
            kind,
            field: field.map(str::to_string),
            text,
        }
    }

    /// About one field: the text reads ``field `name`…`` followed by `rest`
    /// (which starts with `": "` or `" "`).
    fn field(kind: RejectKind, name: &str, rest: impl fmt::Display) -> Self {
        Self::new(kind, Some(name), format!("field `{name}`{rest}"))
    }

    /// A tick of `market_id` for a token the catalog lists under `owner`.
    pub fn market_mismatch(market_id: &str, token_id: &str, owner: &str) -> Self {
        Self::field(
            RejectKind::MarketMismatch,
            "market_id",
            format!(
                ": token `{token_id}` is listed under market `{owner}` in the catalog, not `{market_id}`"
            ),
        )
    }

    /// The `index`th token of a market is listed under market `owner`.
    pub fn token_claimed(index: usize, token_id: &str, owner: &str) -> Self {
        Self::field(
            RejectKind::TokenClaimed,
            &format!("tokens[{index}].id"),
            format!(
                ": token `{token_id}` is already listed under market `{owner}` (a token belongs to the first market that lists it)"
            ),
        )
    }

    /// A market's slug is market `owner`'s.
    pub fn slug_taken(slug: &str, owner: &str) -> Self {
        Self::field(
            RejectKind::SlugTaken,
            "slug",
            format!(": `{slug}` is already the slug of market `{owner}`"),
        )
    }

    fn missing(name: &str, kind: EventKind) -> Self {
        Self::new(
            RejectKind::MissingField,
            Some(name),
            format!(
                "missing field `{name}` (required for kind `{}`)",
                kind.as_str()
            ),
        )
    }

    /// A line that is not UTF-8 text (found before [`parse_line`] can run).
    pub fn not_utf8(err: std::str::Utf8Error) -> Self {
        Self::new(
            RejectKind::NotUtf8,
            None,
            format!("line is not valid UTF-8 ({err})"),
        )
    }

    pub fn kind(&self) -> RejectKind {
        self.kind
    }

    /// The field the reject concerns, as a path (`tokens[1].label`).
    pub fn field_name(&self) -> Option<&str> {
        self.field.as_deref()
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Reject {}

/// One line as sent. Everything is optional here; [`parse_line`] checks
/// which fields the line's kind requires, so the message can name them.
/// `kind` is borrowed from the line unless escaped: it is only read, and
/// allocating it was one of the three strings a price line cost.
#[derive(Deserialize, Default)]
struct WireLine<'a> {
    #[serde(borrow)]
    kind: Option<Text<'a>>,
    market_id: Option<String>,
    token_id: Option<String>,
    ts: Option<WireTs>,
    p: Option<f64>,
    price: Option<f64>,
    size: Option<f64>,
    side: Option<String>,
    trade_id: Option<String>,
    bids: Option<Vec<[f64; 2]>>,
    asks: Option<Vec<[f64; 2]>>,
    volume: Option<f64>,
    liquidity: Option<f64>,
    spread: Option<f64>,
    id: Option<String>,
    slug: Option<String>,
    title: Option<String>,
    series_id: Option<String>,
    event_id: Option<String>,
    question: Option<String>,
    description: Option<String>,
    status: Option<String>,
    tags: Option<Vec<String>>,
    start_date: Option<WireTs>,
    end_date: Option<WireTs>,
    closed_at: Option<WireTs>,
    created_at: Option<WireTs>,
    updated_at: Option<WireTs>,
    resolved_token_id: Option<String>,
    resolved_token_label: Option<String>,
    tokens: Option<Vec<WireToken>>,
}

#[derive(Deserialize)]
struct WireToken {
    id: Option<String>,
    label: Option<String>,
}

/// A string borrowed from the line when it holds no escapes. (serde's
/// derive borrows a `Cow` field, but not one inside an `Option`.)
struct Text<'a>(std::borrow::Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(v.into()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(v.to_owned().into()))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// The fields [`WireLine`] reads as [`WireTs`]: a value there that does not
/// deserialize is a bad timestamp rather than a wrong type.
const TIMESTAMP_FIELDS: [&str; 6] = [
    "ts",
    "start_date",
    "end_date",
    "closed_at",
    "created_at",
    "updated_at",
];

/// A timestamp as ISO 8601 text or Unix seconds (number or numeric text).
struct WireTs(Timestamp);

impl<'de> Deserialize<'de> for WireTs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = WireTs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an ISO 8601 timestamp or Unix seconds")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<WireTs, E> {
                Timestamp::parse(v).map(WireTs).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<WireTs, E> {
                self.visit_f64(v as f64)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<WireTs, E> {
                self.visit_f64(v as f64)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<WireTs, E> {
                unix_seconds(v).map(WireTs).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Largest metric value (`volume`, `liquidity`, `spread`) accepted. Buckets
/// sum metrics: with every value at most 1e15, even a billion samples in one
/// bucket sum to 1e24, far from `f64::MAX` (1.8e308), so no sum can
/// overflow to infinity and be served as `null`. 1e15 is above any real
/// market's volume in dollars.
pub const MAX_METRIC_VALUE: f64 = 1e15;

/// Longest series or event `title` and market `question`, in characters.
pub const MAX_TITLE_LEN: usize = 1_000;

/// Longest market `description`, in characters.
pub const MAX_TEXT_LEN: usize = 10_000;

/// Most tags on one series or event (`/v1/tags` lists them all).
pub const MAX_TAGS: usize = 50;

/// Default of [`Limits::max_future_skew_ms`]: 5 minutes.
pub const DEFAULT_MAX_FUTURE_SKEW_MS: i64 = 5 * 60 * 1000;

/// Default of [`Limits::max_book_levels`]. A books page holds at most 200
/// points of two sides, so with 1 000 levels per side a page carries at most
/// 400 000 levels: under 20 MB of JSON (a level `[p,size]` is at most ~50
/// bytes with the longest f64 texts; ~12 for `[0.41,100.0]`), not 100 MB.
pub const DEFAULT_MAX_BOOK_LEVELS: usize = 1_000;

/// The validation bounds an operator may need to move; everything else is
/// a constant of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How far past `now` a `ts` or catalog `updated_at`/`created_at` may
    /// lie (clock skew between producers and ingest). Further is refused:
    /// a point from the future would be served as the newest to every
    /// plan, and a catalog version from the future could never be
    /// superseded.
    pub max_future_skew_ms: i64,
    /// Most levels on one side of a book.
    pub max_book_levels: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_future_skew_ms: DEFAULT_MAX_FUTURE_SKEW_MS,
            max_book_levels: DEFAULT_MAX_BOOK_LEVELS,
        }
    }
}

/// [`parse_line_with`] under the default [`Limits`].
pub fn parse_line(line: &str, now: Timestamp) -> Result<Event, Reject> {
    parse_line_with(line, now, &Limits::default())
}

/// Unix seconds as a timestamp, refusing a number outside 2000..2100 by
/// its own value (`1e20 is out of range`) rather than by what it would
/// become once converted to milliseconds (saturated at `i64::MAX`). Used
/// for ingest lines and the API's `start_ts`/`end_ts` alike.
pub fn unix_seconds(secs: f64) -> Result<Timestamp, String> {
    use crate::time::{MAX_MS, MIN_MS};
    let (lo, hi) = (MIN_MS / 1000, MAX_MS / 1000);
    if secs.is_finite() && !(lo as f64..hi as f64).contains(&secs) {
        return Err(format!(
            "{secs} is out of range: Unix seconds must be within {lo}..{hi} (2000-01-01..2100-01-01)"
        ));
    }
    Timestamp::from_unix_seconds(secs)
}

/// Parses and validates one NDJSON line. `now` fills `created_at` and
/// `updated_at` of catalog records that omit them, so that the log (and any
/// replay of it) carries a definite version for every record, and bounds
/// how far in the future timestamps may lie; it is passed in, not read
/// here, so that callers (and tests) decide what "now" is.
pub fn parse_line_with(line: &str, now: Timestamp, limits: &Limits) -> Result<Event, Reject> {
    let mut wire = WireLine::default();
    if flat::scan(line, &mut wire).is_none() {
        wire = read_with_serde(line)?;
    }
    validate(wire, now, limits)
}

/// The event a line's fields make, or why they make none.
fn validate(mut wire: WireLine, now: Timestamp, limits: &Limits) -> Result<Event, Reject> {
    let Some(Text(kind_text)) = &wire.kind else {
        return Err(Reject::new(
            RejectKind::MissingField,
            Some("kind"),
            "missing field `kind`".into(),
        ));
    };
    let kind = EventKind::parse(kind_text).ok_or_else(|| {
        Reject::new(
            RejectKind::UnknownKind,
            Some("kind"),
            format!(
                "unknown kind `{}`: expected one of price, book, metrics, trade, series, event, market",
                truncate(kind_text)
            ),
        )
    })?;
    let latest = Timestamp(now.0.saturating_add(limits.max_future_skew_ms));
    let mut f = Fields {
        w: &mut wire,
        kind,
        latest,
    };
    let event = match kind {
        EventKind::Price => {
            let p = f.number("p")?;
            if !(0.0..=1.0).contains(&p) {
                return Err(Reject::field(
                    RejectKind::OutOfRange,
                    "p",
                    format!(": {p} is not a probability in [0, 1]"),
                ));
            }
            Event::Price(PriceTick {
                market_id: f.id("market_id")?,
                token_id: f.id("token_id")?,
                ts: f.ts("ts")?,
                p,
            })
        }
        EventKind::Book => Event::Book(Box::new(BookSnapshot {
            market_id: f.id("market_id")?,
            token_id: f.id("token_id")?,
            ts: f.ts("ts")?,
            bids: book_side("bids", f.w.bids.take(), Side::Bids, limits)?,
            asks: book_side("asks", f.w.asks.take(), Side::Asks, limits)?,
        })),
        EventKind::Trade => {
            let price = f.number("price")?;
            if !(0.0..=1.0).contains(&price) {
                return Err(Reject::field(
                    RejectKind::OutOfRange,
                    "price",
                    format!(": {price} is not a probability in [0, 1]"),
                ));
            }
            let side_text = f.text("side")?;
            let side = TradeSide::parse(&side_text).ok_or_else(|| {
                Reject::field(
                    RejectKind::OutOfRange,
                    "side",
                    format!(": `{}` is neither `buy` nor `sell`", truncate(&side_text)),
                )
            })?;
            Event::Trade(Box::new(Trade {
                market_id: f.id("market_id")?,
                token_id: f.id("token_id")?,
                ts: f.ts("ts")?,
                price,
                size: f.metric("size")?,
                side,
                trade_id: f.optional_id("trade_id")?,
            }))
        }
        EventKind::Metrics => Event::Metrics(MetricsSample {
            market_id: f.id("market_id")?,
            ts: f.ts("ts")?,
            volume: f.metric("volume")?,
            liquidity: f.metric("liquidity")?,
            spread: f.metric("spread")?,
        }),
        EventKind::Series => {
            let (created_at, updated_at) = f.versions(now)?;
            Event::Series(Box::new(SeriesRecord {
                id: f.id("id")?,
                slug: f.id("slug")?,
                title: f.capped_text("title", MAX_TITLE_LEN)?,
                tags: f.tags()?,
                status: f.w.status.take(),
                start_date: f.w.start_date.take().map(|t| t.0),
                end_date: f.w.end_date.take().map(|t| t.0),
                created_at,
                updated_at,
            }))
        }
        EventKind::Event => {
            let (created_at, updated_at) = f.versions(now)?;
            Event::Event(Box::new(EventRecord {
                id: f.id("id")?,
                slug: f.id("slug")?,
                series_id: f.optional_id("series_id")?,
                title: f.capped_text("title", MAX_TITLE_LEN)?,
                tags: f.tags()?,
                status: f.w.status.take(),
                start_date: f.w.start_date.take().map(|t| t.0),
                end_date: f.w.end_date.take().map(|t| t.0),
                created_at,
                updated_at,
            }))
        }
        EventKind::Market => {
            let (created_at, updated_at) = f.versions(now)?;
            let tokens = f.tokens()?;
            let (resolved_token_id, resolved_token_label) = resolution_of(f.w, &tokens)?;
            Event::Market(Box::new(MarketRecord {
                id: f.id("id")?,
                slug: f.id("slug")?,
                event_id: f.optional_id("event_id")?,
                question: capped("question", f.w.question.take(), MAX_TITLE_LEN)?,
                description: capped("description", f.w.description.take(), MAX_TEXT_LEN)?,
                status: f.text("status")?,
                start_date: f.w.start_date.take().map(|t| t.0),
                end_date: f.w.end_date.take().map(|t| t.0),
                closed_at: f.w.closed_at.take().map(|t| t.0),
                resolved_token_id,
                resolved_token_label,
                tokens,
                created_at,
                updated_at,
            }))
        }
    };
    Ok(event)
}

/// Reads a line [`flat::scan`] declined: any JSON the format allows, and
/// the explanation of any it does not.
fn read_with_serde(line: &str) -> Result<WireLine<'_>, Reject> {
    serde_json::from_str(line).map_err(|_| explain_json_error(line))
}

/// Re-parses a line `serde_json` refused, tracking the field path so
/// the reject names the field (`field `p`: invalid type: string "x" …`).
fn explain_json_error(line: &str) -> Reject {
    // Valid JSON that is not an object: say so, rather than serde's
    // "expected struct WireLine" (a name internal to this file).
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(line) {
        let found = match value {
            serde_json::Value::Object(_) => None,
            serde_json::Value::Null => Some("null"),
            serde_json::Value::Bool(_) => Some("a boolean"),
            serde_json::Value::Number(_) => Some("a number"),
            serde_json::Value::String(_) => Some("a string"),
            serde_json::Value::Array(_) => Some("an array"),
        };
        if let Some(found) = found {
            return Reject::new(
                RejectKind::MalformedJson,
                None,
                format!("malformed JSON: expected a JSON object, found {found}"),
            );
        }
    }
    let de = &mut serde_json::Deserializer::from_str(line);
    match serde_path_to_error::deserialize::<_, WireLine>(de) {
        Ok(_) => Reject::new(RejectKind::MalformedJson, None, "malformed JSON".into()),
        Err(err) => {
            let path = err.path().to_string();
            let inner = err.into_inner();
            if inner.is_data() && path != "." {
                let kind = if TIMESTAMP_FIELDS.contains(&path.as_str()) {
                    RejectKind::BadTimestamp
                } else {
                    RejectKind::WrongType
                };
                Reject::field(kind, &path, format!(": {inner}"))
            } else {
                Reject::new(
                    RejectKind::MalformedJson,
                    None,
                    format!("malformed JSON: {inner}"),
                )
            }
        }
    }
}

/// The line's fields, taken as its kind needs them. It borrows the line
/// rather than holding it: a `WireLine` is most of a kilobyte, and each
/// move of it was a copy per line.
struct Fields<'w, 'a> {
    w: &'w mut WireLine<'a>,
    kind: EventKind,
    /// The latest timestamp accepted: now plus the allowed skew.
    latest: Timestamp,
}

impl Fields<'_, '_> {
    fn missing(&self, name: &str) -> Reject {
        Reject::missing(name, self.kind)
    }

    fn slot(&mut self, name: &str) -> Option<String> {
        match name {
            "market_id" => self.w.market_id.take(),
            "token_id" => self.w.token_id.take(),
            "id" => self.w.id.take(),
            "slug" => self.w.slug.take(),
            "title" => self.w.title.take(),
            "status" => self.w.status.take(),
            "series_id" => self.w.series_id.take(),
            "event_id" => self.w.event_id.take(),
            "side" => self.w.side.take(),
            "trade_id" => self.w.trade_id.take(),
            _ => unreachable!("no string field {name}"),
        }
    }

    fn id(&mut self, name: &str) -> Result<String, Reject> {
        let value = self.slot(name).ok_or_else(|| self.missing(name))?;
        check_id(name, &value)?;
        Ok(value)
    }

    fn optional_id(&mut self, name: &str) -> Result<Option<String>, Reject> {
        match self.slot(name) {
            Some(v) => check_id(name, &v).map(|_| Some(v)),
            None => Ok(None),
        }
    }

    fn text(&mut self, name: &str) -> Result<String, Reject> {
        let value = self.slot(name).ok_or_else(|| self.missing(name))?;
        if value.trim().is_empty() {
            return Err(Reject::field(RejectKind::Empty, name, " is empty"));
        }
        Ok(value)
    }

    fn number(&mut self, name: &str) -> Result<f64, Reject> {
        let value = match name {
            "p" => self.w.p,
            "price" => self.w.price,
            "size" => self.w.size,
            "volume" => self.w.volume,
            "liquidity" => self.w.liquidity,
            "spread" => self.w.spread,
            _ => unreachable!("no number field {name}"),
        }
        .ok_or_else(|| self.missing(name))?;
        if !value.is_finite() {
            return Err(Reject::field(
                RejectKind::OutOfRange,
                name,
                " is not a finite number",
            ));
        }
        Ok(value)
    }

    /// A metric: finite, `>= 0` and at most [`MAX_METRIC_VALUE`], so that
    /// bucket sums stay finite.
    fn metric(&mut self, name: &str) -> Result<f64, Reject> {
        let value = self.number(name)?;
        if value < 0.0 {
            return Err(Reject::field(
                RejectKind::OutOfRange,
                name,
                format!(": {value} is negative"),
            ));
        }
        if value > MAX_METRIC_VALUE {
            return Err(Reject::field(
                RejectKind::OutOfRange,
                name,
                format!(": {value} is above the largest accepted value, {MAX_METRIC_VALUE:e}"),
            ));
        }
        Ok(value)
    }

    fn not_future(&self, name: &str, ts: Timestamp) -> Result<Timestamp, Reject> {
        if ts > self.latest {
            return Err(Reject::field(
                RejectKind::InTheFuture,
                name,
                format!(
                    ": {} is later than now plus the allowed clock skew ({})",
                    ts.to_rfc3339(),
                    self.latest.to_rfc3339()
                ),
            ));
        }
        Ok(ts)
    }

    fn ts(&mut self, name: &str) -> Result<Timestamp, Reject> {
        let ts = self
            .w
            .ts
            .take()
            .map(|t| t.0)
            .ok_or_else(|| self.missing(name))?;
        self.not_future(name, ts)
    }

    /// The record's versions. Only these are bounded in time: a version
    /// from the future could never be superseded, whereas `end_date` and
    /// friends legitimately lie ahead.
    fn versions(&mut self, now: Timestamp) -> Result<(Timestamp, Timestamp), Reject> {
        let updated = self.w.updated_at.take().map(|t| t.0);
        let created = self.w.created_at.take().map(|t| t.0);
        if let Some(t) = updated {
            self.not_future("updated_at", t)?;
        }
        if let Some(t) = created {
            self.not_future("created_at", t)?;
        }
        let updated = updated.or(created).unwrap_or(now);
        Ok((created.unwrap_or(updated), updated))
    }

    fn capped_text(&mut self, name: &str, max: usize) -> Result<String, Reject> {
        let value = self.text(name)?;
        check_len(name, &value, max)?;
        Ok(value)
    }

    fn tags(&mut self) -> Result<Vec<String>, Reject> {
        let tags = self.w.tags.take().unwrap_or_default();
        if tags.len() > MAX_TAGS {
            return Err(Reject::field(
                RejectKind::TooLong,
                "tags",
                format!(" has {} tags; at most {MAX_TAGS} are allowed", tags.len()),
            ));
        }
        for (i, tag) in tags.iter().enumerate() {
            check_label(&format!("tags[{i}]"), tag)?;
        }
        Ok(tags)
    }

    fn tokens(&mut self) -> Result<Vec<Token>, Reject> {
        let wire = self.w.tokens.take().ok_or_else(|| self.missing("tokens"))?;
        if wire.is_empty() {
            return Err(Reject::field(
                RejectKind::Empty,
                "tokens",
                " is empty: a market needs at least one token",
            ));
        }
        let mut tokens: Vec<Token> = Vec::with_capacity(wire.len());
        for (i, t) in wire.into_iter().enumerate() {
            let (id_field, label_field) = (format!("tokens[{i}].id"), format!("tokens[{i}].label"));
            let id = t.id.ok_or_else(|| self.missing(&id_field))?;
            let label = t.label.ok_or_else(|| self.missing(&label_field))?;
            check_id(&id_field, &id)?;
            check_label(&label_field, &label)?;
            if let Some(j) = tokens.iter().position(|o| o.id == id) {
                return Err(Reject::field(
                    RejectKind::Duplicate,
                    &id_field,
                    format!(" repeats tokens[{j}].id"),
                ));
            }
            // Labels key the market-level responses (label -> points).
            if let Some(j) = tokens.iter().position(|o| o.label == label) {
                return Err(Reject::field(
                    RejectKind::Duplicate,
                    &label_field,
                    format!(" repeats tokens[{j}].label"),
                ));
            }
            tokens.push(Token { id, label });
        }
        Ok(tokens)
    }
}

/// An optional free text, at most `max` characters.
fn capped(name: &str, value: Option<String>, max: usize) -> Result<Option<String>, Reject> {
    if let Some(v) = &value {
        check_len(name, v, max)?;
    }
    Ok(value)
}

fn check_len(name: &str, value: &str, max: usize) -> Result<(), Reject> {
    let len = value.chars().count();
    if len > max {
        return Err(Reject::field(
            RejectKind::TooLong,
            name,
            format!(" is {len} characters long; at most {max} are allowed"),
        ));
    }
    Ok(())
}

/// Tags and token labels: 1..200 characters, not all blank.
fn check_label(name: &str, value: &str) -> Result<(), Reject> {
    let kind = if value.trim().is_empty() {
        RejectKind::Empty
    } else if value.chars().count() > MAX_ID_LEN {
        RejectKind::TooLong
    } else {
        return Ok(());
    };
    Err(Reject::field(
        kind,
        name,
        format!(" must be 1..{MAX_ID_LEN} non-blank characters"),
    ))
}

/// The winning token must be one of the market's tokens; its label is taken
/// from the token list when the line gives only the id.
fn resolution_of(
    w: &mut WireLine<'_>,
    tokens: &[Token],
) -> Result<(Option<String>, Option<String>), Reject> {
    match (w.resolved_token_id.take(), w.resolved_token_label.take()) {
        (None, None) => Ok((None, None)),
        (None, Some(_)) => Err(Reject::field(
            RejectKind::Inconsistent,
            "resolved_token_label",
            " is set but `resolved_token_id` is not",
        )),
        (Some(id), label) => {
            let token = tokens.iter().find(|t| t.id == id).ok_or_else(|| {
                Reject::field(
                    RejectKind::Inconsistent,
                    "resolved_token_id",
                    format!(": `{}` is not one of the market's tokens", truncate(&id)),
                )
            })?;
            if let Some(label) = &label {
                if *label != token.label {
                    return Err(Reject::field(
                        RejectKind::Inconsistent,
                        "resolved_token_label",
                        format!(
                            ": `{}` is not the label of token `{}` (`{}`)",
                            truncate(label),
                            token.id,
                            token.label
                        ),
                    ));
                }
            }
            Ok((Some(id), Some(token.label.clone())))
        }
    }
}

/// Ids become URL path segments (`/v1/tokens/{id}/prices`): 1..200
/// characters, no `/`, no whitespace or control characters, and none of
/// the invisible characters ([`is_invisible`]) that make two ids look alike
/// or reorder the text around them.
pub fn check_id(name: &str, value: &str) -> Result<(), Reject> {
    // Nearly every id is printable ASCII, checked here a byte at a time:
    // counting chars and asking Unicode's classes of each cost more than
    // parsing the id. Any other id takes the general path below, which
    // also words the reason.
    let printable = |b: u8| b > b' ' && b < 0x7f && b != b'/';
    if (1..=MAX_ID_LEN).contains(&value.len()) && value.bytes().all(printable) {
        return Ok(());
    }
    check_id_chars(name, value)
}

/// [`check_id`] of any id, a character at a time.
fn check_id_chars(name: &str, value: &str) -> Result<(), Reject> {
    let len = value.chars().count();
    if len == 0 {
        return Err(Reject::field(RejectKind::Empty, name, " is empty"));
    }
    if len > MAX_ID_LEN {
        return Err(Reject::field(
            RejectKind::TooLong,
            name,
            format!(" is {len} characters long; at most {MAX_ID_LEN} are allowed"),
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| *c == '/' || c.is_whitespace() || c.is_control() || is_invisible(*c))
    {
        return Err(Reject::field(
            RejectKind::BadId,
            name,
            format!(
                " contains {:?} (U+{:04X}); ids may not contain '/', whitespace, control, zero-width or bidi characters",
                c, c as u32
            ),
        ));
    }
    Ok(())
}

/// Zero-width and bidirectional formatting characters: invisible, so an id
/// holding one looks like another id, and bidi overrides reorder what is
/// displayed around them.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}'                     // soft hyphen
        | '\u{061C}'                   // Arabic letter mark
        | '\u{180E}'                   // Mongolian vowel separator
        | '\u{200B}'..='\u{200F}'      // zero-width space/joiners, LRM, RLM
        | '\u{202A}'..='\u{202E}'      // bidi embeddings and overrides
        | '\u{2060}'..='\u{2064}'      // word joiner, invisible operators
        | '\u{2066}'..='\u{2069}'      // bidi isolates
        | '\u{FEFF}'                   // zero-width no-break space (BOM)
    )
}

#[derive(Clone, Copy)]
enum Side {
    Bids,
    Asks,
}

/// Levels must be finite, prices in `[0, 1]`, sizes `>= 0`, and best first:
/// bids strictly descending by price, asks strictly ascending.
fn book_side(
    name: &str,
    levels: Option<Vec<[f64; 2]>>,
    side: Side,
    limits: &Limits,
) -> Result<Vec<BookLevel>, Reject> {
    let levels = levels.ok_or_else(|| Reject::missing(name, EventKind::Book))?;
    if levels.len() > limits.max_book_levels {
        return Err(Reject::field(
            RejectKind::TooLong,
            name,
            format!(
                " has {} levels; at most {} per side are allowed",
                levels.len(),
                limits.max_book_levels
            ),
        ));
    }
    let mut out: Vec<BookLevel> = Vec::with_capacity(levels.len());
    for (i, [price, size]) in levels.into_iter().enumerate() {
        let level = format!("{name}[{i}]");
        if !price.is_finite() || !(0.0..=1.0).contains(&price) {
            return Err(Reject::field(
                RejectKind::OutOfRange,
                &level,
                format!(": price {price} is not in [0, 1]"),
            ));
        }
        if !size.is_finite() || size < 0.0 {
            return Err(Reject::field(
                RejectKind::OutOfRange,
                &level,
                format!(": size {size} is negative or not finite"),
            ));
        }
        if let Some(prev) = out.last() {
            let best_first = match side {
                Side::Bids => price < prev.price,
                Side::Asks => price > prev.price,
            };
            if !best_first {
                let order = match side {
                    Side::Bids => "descending",
                    Side::Asks => "ascending",
                };
                return Err(Reject::field(
                    RejectKind::BookNotBestFirst,
                    name,
                    format!(
                        " is not best first: level {i} price {price} after {} (must be strictly {order})",
                        prev.price
                    ),
                ));
            }
        }
        out.push(BookLevel { price, size });
    }
    Ok(out)
}

fn truncate(s: &str) -> String {
    if s.chars().count() <= 40 {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(40).collect::<String>())
    }
}

/// The ingest line of an event: the inverse of [`parse_line`], for tools
/// that feed pipelines (`hindsight feed`) and for round-trip tests.
pub fn to_line(event: &Event) -> String {
    use serde_json::json;
    let ts = |t: Timestamp| t.to_rfc3339();
    let opt = |t: Option<Timestamp>| t.map(ts);
    let levels = |l: &[BookLevel]| l.iter().map(|l| [l.price, l.size]).collect::<Vec<_>>();
    let value = match event {
        Event::Price(p) => {
            json!({"kind": "price", "market_id": p.market_id, "token_id": p.token_id, "ts": ts(p.ts), "p": p.p})
        }
        Event::Book(b) => {
            json!({"kind": "book", "market_id": b.market_id, "token_id": b.token_id, "ts": ts(b.ts),
            "bids": levels(&b.bids), "asks": levels(&b.asks)})
        }
        Event::Trade(t) => {
            json!({"kind": "trade", "market_id": t.market_id, "token_id": t.token_id,
            "ts": ts(t.ts), "price": t.price, "size": t.size, "side": t.side.as_str(), "trade_id": t.trade_id})
        }
        Event::Metrics(m) => json!({"kind": "metrics", "market_id": m.market_id, "ts": ts(m.ts),
            "volume": m.volume, "liquidity": m.liquidity, "spread": m.spread}),
        Event::Series(s) => {
            json!({"kind": "series", "id": s.id, "slug": s.slug, "title": s.title, "tags": s.tags,
            "status": s.status, "start_date": opt(s.start_date), "end_date": opt(s.end_date),
            "created_at": ts(s.created_at), "updated_at": ts(s.updated_at)})
        }
        Event::Event(e) => {
            json!({"kind": "event", "id": e.id, "slug": e.slug, "series_id": e.series_id, "title": e.title,
            "tags": e.tags, "status": e.status, "start_date": opt(e.start_date), "end_date": opt(e.end_date),
            "created_at": ts(e.created_at), "updated_at": ts(e.updated_at)})
        }
        Event::Market(m) => {
            json!({"kind": "market", "id": m.id, "slug": m.slug, "event_id": m.event_id,
            "question": m.question, "description": m.description, "status": m.status,
            "start_date": opt(m.start_date), "end_date": opt(m.end_date), "closed_at": opt(m.closed_at),
            "resolved_token_id": m.resolved_token_id, "resolved_token_label": m.resolved_token_label,
            "tokens": m.tokens.iter().map(|t| json!({"id": t.id, "label": t.label})).collect::<Vec<_>>(),
            "created_at": ts(m.created_at), "updated_at": ts(m.updated_at)})
        }
    };
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp(1_760_000_000_000);

    fn err(line: &str) -> String {
        parse_line(line, NOW).expect_err(line).to_string()
    }

    #[test]
    fn parses_every_kind_of_the_documented_format() {
        let e = parse_line(
            r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":"2025-09-01T00:00:30Z","p":0.42,"extra":1}"#,
            NOW,
        )
        .unwrap();
        assert_eq!(
            e,
            Event::Price(PriceTick {
                market_id: "m1".into(),
                token_id: "t1".into(),
                ts: Timestamp(1_756_684_830_000),
                p: 0.42
            })
        );
        let book = parse_line(
            r#"{"kind":"book","market_id":"m1","token_id":"t1","ts":1756684830.5,"bids":[[0.41,100.0],[0.40,5]],"asks":[[0.43,50.0]]}"#,
            NOW,
        )
        .unwrap();
        let Event::Book(b) = book else { panic!() };
        assert_eq!(b.ts, Timestamp(1_756_684_830_500));
        assert_eq!(b.bids.len(), 2);
        let m = parse_line(
            r#"{"kind":"market","id":"m1","slug":"will-it","event_id":"e1","question":"Will it?","status":"open","tokens":[{"id":"t1","label":"Yes"},{"id":"t2","label":"No"}],"resolved_token_id":"t1","start_date":"2025-08-01","end_date":null}"#,
            NOW,
        )
        .unwrap();
        let Event::Market(m) = m else { panic!() };
        assert_eq!(m.resolved_token_label.as_deref(), Some("Yes"));
        assert_eq!((m.created_at, m.updated_at), (NOW, NOW));
        assert!(parse_line(r#"{"kind":"metrics","market_id":"m1","ts":1756684830,"volume":10,"liquidity":5.5,"spread":0.01}"#, NOW).is_ok());
        assert!(parse_line(
            r#"{"kind":"series","id":"s1","slug":"s","title":"S","tags":["a"]}"#,
            NOW
        )
        .is_ok());
        assert!(parse_line(r#"{"kind":"event","id":"e1","slug":"e","title":"E","series_id":"s1","updated_at":"2025-09-01T00:00:00Z"}"#, NOW).is_ok());
        // A kind written with escapes is the same kind.
        let escaped = parse_line(
            r#"{"kind":"pr\u0069ce","market_id":"m1","token_id":"t1","ts":1756684830,"p":0.42}"#,
            NOW,
        );
        assert!(matches!(escaped, Ok(Event::Price(_))), "{escaped:?}");
    }

    #[test]
    fn an_ascii_id_is_refused_for_what_any_id_is_refused_for() {
        let mut ids: Vec<String> = (0u8..0x80)
            .flat_map(|b| [format!("a{}b", b as char), (b as char).to_string()])
            .collect();
        ids.extend(["", "é", "a\u{200B}b"].map(String::from));
        ids.extend([MAX_ID_LEN, MAX_ID_LEN + 1].map(|n| "x".repeat(n)));
        for id in ids {
            assert_eq!(check_id("id", &id), check_id_chars("id", &id), "{id:?}");
        }
        assert!(check_id("id", "a/b").is_err());
        assert!(check_id("id", "lt64-no").is_ok());
    }

    #[test]
    fn refuses_bad_input_naming_field_and_reason() {
        assert!(err("{not json").starts_with("malformed JSON"));
        assert!(err(r#"{"kind":"quote"}"#).contains("unknown kind `quote`"));
        let trade = r#""kind":"trade","market_id":"m1","token_id":"t1","ts":1756684830,"size":1"#;
        assert_eq!(
            err(&format!(r#"{{{trade},"price":1.5,"side":"buy"}}"#)),
            "field `price`: 1.5 is not a probability in [0, 1]"
        );
        assert_eq!(
            err(&format!(r#"{{{trade},"price":0.5,"side":"hold"}}"#)),
            "field `side`: `hold` is neither `buy` nor `sell`"
        );
        assert!(err(&format!(r#"{{{trade},"price":0.5}}"#)).contains("missing field `side`"));
        assert!(err(&format!(
            r#"{{{trade},"price":0.5,"side":"buy","trade_id":"a b"}}"#
        ))
        .contains("field `trade_id`"));
        assert!(err(r#"{"market_id":"m"}"#).contains("missing field `kind`"));
        let base = r#""kind":"price","market_id":"m1","token_id":"t1","ts":"2025-09-01T00:00:30Z""#;
        assert!(
            err(&format!("{{{base},\"p\":1.5}}")).contains("field `p`: 1.5 is not a probability")
        );
        assert!(err(&format!("{{{base},\"p\":NaN}}")).starts_with("malformed JSON"));
        assert!(err(&format!("{{{base},\"p\":\"0.5\"}}")).starts_with("field `p`: invalid type"));
        assert!(err(&format!("{{{base}}}")).contains("missing field `p`"));
        let empty = r#"{"kind":"price","market_id":"","token_id":"t1","ts":1756684830,"p":0.5}"#;
        assert!(err(empty).contains("field `market_id` is empty"));
        let long = format!(
            r#"{{"kind":"price","market_id":"m1","token_id":"{}","ts":1756684830,"p":0.5}}"#,
            "x".repeat(201)
        );
        assert!(err(&long).contains("`token_id` is 201 characters long"));
        let bad_ts =
            r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":"yesterday","p":0.5}"#;
        assert!(err(bad_ts).starts_with("field `ts`:"), "{}", err(bad_ts));
        let not_best = r#"{"kind":"book","market_id":"m1","token_id":"t1","ts":1756684830,"bids":[[0.40,1],[0.41,1]],"asks":[]}"#;
        assert!(err(not_best).contains("`bids` is not best first"));
        let asks = r#"{"kind":"book","market_id":"m1","token_id":"t1","ts":1756684830,"bids":[],"asks":[[0.5,1],[0.5,2]]}"#;
        assert!(err(asks).contains("strictly ascending"));
        let neg = r#"{"kind":"book","market_id":"m1","token_id":"t1","ts":1756684830,"bids":[[0.4,-1]],"asks":[]}"#;
        assert!(err(neg).contains("size -1 is negative"));
        let dup = r#"{"kind":"market","id":"m1","slug":"s","status":"open","tokens":[{"id":"t1","label":"Yes"},{"id":"t2","label":"Yes"}]}"#;
        assert!(err(dup).contains("`tokens[1].label` repeats"));
        let wrong = r#"{"kind":"market","id":"m1","slug":"s","status":"open","tokens":[{"id":"t1","label":"Yes"}],"resolved_token_id":"t9"}"#;
        assert!(err(wrong).contains("not one of the market's tokens"));
        let slash = r#"{"kind":"event","id":"a/b","slug":"s","title":"t"}"#;
        assert!(err(slash).contains("may not contain '/'"));
    }
    /// One line per kind: each reject carries the kind its metric label
    /// comes from and, where there is one, the field it is about.
    #[test]
    fn every_reject_kind_is_reached_with_its_field() {
        let market = |extra: &str| {
            format!(
                r#"{{"kind":"market","id":"m1","slug":"s","status":"open","tokens":[{{"id":"t1","label":"Yes"}}]{extra}}}"#
            )
        };
        let price = |extra: &str| {
            format!(r#"{{"kind":"price","market_id":"m1","token_id":"t1","ts":1756684830{extra}}}"#)
        };
        let cases: Vec<(String, RejectKind, Option<&str>)> = vec![
            ("{not json".into(), RejectKind::MalformedJson, None),
            ("42".into(), RejectKind::MalformedJson, None),
            (price(r#","p":"0.5""#), RejectKind::WrongType, Some("p")),
            (r#"{"kind":"quote"}"#.into(), RejectKind::UnknownKind, Some("kind")),
            (r#"{"market_id":"m"}"#.into(), RejectKind::MissingField, Some("kind")),
            (price(""), RejectKind::MissingField, Some("p")),
            (
                r#"{"kind":"market","id":"m1","slug":"s","status":"open","tokens":[{"id":"t1"}]}"#.into(),
                RejectKind::MissingField,
                Some("tokens[0].label"),
            ),
            (
                r#"{"kind":"price","market_id":"","token_id":"t1","ts":1756684830,"p":0.5}"#.into(),
                RejectKind::Empty,
                Some("market_id"),
            ),
            (
                r#"{"kind":"series","id":"s1","slug":"s","title":"S","tags":["  "]}"#.into(),
                RejectKind::Empty,
                Some("tags[0]"),
            ),
            (
                format!(
                    r#"{{"kind":"price","market_id":"{}","token_id":"t1","ts":1756684830,"p":0.5}}"#,
                    "m".repeat(201)
                ),
                RejectKind::TooLong,
                Some("market_id"),
            ),
            (
                r#"{"kind":"event","id":"a/b","slug":"s","title":"t"}"#.into(),
                RejectKind::BadId,
                Some("id"),
            ),
            (price(r#","p":1.5"#), RejectKind::OutOfRange, Some("p")),
            (
                r#"{"kind":"book","market_id":"m1","token_id":"t1","ts":1756684830,"bids":[[0.4,-1]],"asks":[]}"#.into(),
                RejectKind::OutOfRange,
                Some("bids[0]"),
            ),
            (
                r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":"yesterday","p":0.5}"#.into(),
                RejectKind::BadTimestamp,
                Some("ts"),
            ),
            (
                r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":1756684830000,"p":0.5}"#.into(),
                RejectKind::BadTimestamp,
                Some("ts"),
            ),
            (market(r#","end_date":"soon""#), RejectKind::BadTimestamp, Some("end_date")),
            (
                r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":"2099-01-01T00:00:00Z","p":0.5}"#.into(),
                RejectKind::InTheFuture,
                Some("ts"),
            ),
            (
                r#"{"kind":"book","market_id":"m1","token_id":"t1","ts":1756684830,"bids":[[0.40,1],[0.41,1]],"asks":[]}"#.into(),
                RejectKind::BookNotBestFirst,
                Some("bids"),
            ),
            (
                r#"{"kind":"market","id":"m1","slug":"s","status":"open","tokens":[{"id":"t1","label":"Yes"},{"id":"t1","label":"No"}]}"#.into(),
                RejectKind::Duplicate,
                Some("tokens[1].id"),
            ),
            (
                market(r#","resolved_token_id":"t9""#),
                RejectKind::Inconsistent,
                Some("resolved_token_id"),
            ),
        ];
        for (line, kind, field) in &cases {
            let reject = parse_line(line, NOW).expect_err(line);
            assert_eq!(
                (reject.kind(), reject.field_name()),
                (*kind, *field),
                "{line}: {reject}"
            );
        }
        // Built at run time: clippy refuses a literal that can never decode.
        let bytes: Vec<u8> = b"{\"kind\":\"price"
            .iter()
            .chain(&[0xff])
            .copied()
            .collect();
        let utf8 = std::str::from_utf8(&bytes).unwrap_err();
        let reject = Reject::not_utf8(utf8);
        assert_eq!(
            (reject.kind(), reject.field_name()),
            (RejectKind::NotUtf8, None)
        );
        assert!(reject.to_string().starts_with("line is not valid UTF-8"));
        // Every kind but NotUtf8 (found before parsing) and the catalog
        // kinds (found against other lines: `claims` tests them) is
        // reachable from a line.
        for kind in RejectKind::ALL {
            assert!(
                kind == RejectKind::NotUtf8
                    || RejectKind::CATALOG.contains(&kind)
                    || cases.iter().any(|(_, k, _)| *k == kind),
                "no case for {kind:?}"
            );
        }
    }

    #[test]
    fn reject_labels_are_distinct_snake_case() {
        let labels: std::collections::HashSet<&str> =
            RejectKind::ALL.iter().map(|k| k.label()).collect();
        assert_eq!(labels.len(), RejectKind::ALL.len());
        assert!(labels.iter().all(|l| l
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')));
    }
}
