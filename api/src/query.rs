//! Query parameters: one type per route shape that both parses the query
//! string and documents itself for OpenAPI (`IntoParams`), so handlers
//! receive only well-formed values and the document cannot drift from
//! what is parsed.
//!
//! Schema failures (missing, wrong type, out of bounds, bad enum) are 422 in
//! FastAPI's shape, every failed parameter listed; bad timestamps, date
//! ranges, history limits above 200 and cursors are 400 (docs/SPEC.md §7).
//!
//! A query that pages keeps its `cursor` raw with the cursor keys: the
//! handler binds it to its route (and, for history, the token or market it
//! resolved) with `q.page(…)`, which opens the cursor (400 if it was not
//! issued for this route, series and parameters) and seals the next one.

use crate::catalog::{SortField, SortOrder};
use crate::cursor::{CursorKeys, ListCursor, Pager, Scope};
use crate::error::{issue, ApiError};
use crate::export::Format;
use axum::extract::{FromRef, FromRequestParts, Query};
use axum::http::request::Parts;
use hindsight_contracts::{Range, TickKey, TickRange};
use hindsight_schemas::api::ValidationIssue;
use hindsight_schemas::{Granularity, Resolution, Timestamp, MAX_ID_LEN};
use std::collections::BTreeMap;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::IntoParams;

pub const HISTORY_LIMIT_DEFAULT: usize = 100;
pub const HISTORY_LIMIT_MAX: usize = 200;
pub const LIST_LIMIT_DEFAULT: usize = 100;
pub const LIST_LIMIT_MAX: usize = 1000;
pub const SEARCH_MAX: usize = 200;
/// How far past `end_ts` a history read looks for a later bucket, in
/// buckets: a day at `1m`, four years at `1d`. Bounded, because the CQL
/// store reads its time partitions one by one (8 640 buckets each, so this
/// adds at most one); a series quiet for longer after a page leaves the
/// page open, which only shortens how long it is cached.
pub const LOOKAHEAD_BUCKETS: i64 = 1_440;

/// The raw pairs of a query string.
pub struct QueryPairs(Vec<(String, String)>);

impl QueryPairs {
    async fn from_parts<S: Send + Sync>(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("Malformed query string: {e}")))?;
        Ok(QueryPairs(pairs))
    }

    /// The last value of a single-valued parameter.
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The last value, unless empty (`?cursor=` is no cursor).
    fn non_empty(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.is_empty())
    }

    /// Every value of a repeatable parameter, comma-separated values split.
    fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from)
            .collect()
    }
}

/// A closed set of words a parameter takes. One list serves parsing, the
/// 422 message and the OpenAPI enum ([`enum_schema`]).
pub trait QueryEnum: Copy + 'static {
    const ALL: &'static [Self];
    fn as_str(self) -> &'static str;

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.as_str() == text)
    }
}

impl QueryEnum for Granularity {
    const ALL: &'static [Self] = &Granularity::ALL;
    fn as_str(self) -> &'static str {
        Granularity::as_str(self)
    }
}

impl QueryEnum for SortField {
    const ALL: &'static [Self] = &SortField::ALL;
    fn as_str(self) -> &'static str {
        SortField::as_str(self)
    }
}

impl QueryEnum for SortOrder {
    const ALL: &'static [Self] = &[SortOrder::Asc, SortOrder::Desc];
    fn as_str(self) -> &'static str {
        match self {
            SortOrder::Asc => "asc",
            SortOrder::Desc => "desc",
        }
    }
}

/// What a prices or candles page does with buckets that hold no tick
/// (`fill`, beyond SPEC.md): `none` leaves them out (SPEC's behaviour),
/// `previous` carries the last stored value into them (see
/// `routes::history::fill_previous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fill {
    #[default]
    None,
    Previous,
}

impl QueryEnum for Fill {
    const ALL: &'static [Self] = &[Fill::None, Fill::Previous];
    fn as_str(self) -> &'static str {
        match self {
            Fill::None => "none",
            Fill::Previous => "previous",
        }
    }
}

/// `fill`, documented on the routes that take it (prices and candles);
/// parsed with the other history parameters into [`HistoryQuery::fill`].
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FillParam {
    /// `none` (default): buckets without ticks are left out. `previous`:
    /// each empty bucket in `[start_ts, end_ts)` gets the last stored
    /// value, marked `"filled": true` (candles: the previous close as
    /// `o`, `h`, `l` and `c`, `n` 0), if that value is at most 1 440
    /// buckets older, the bucket is not in the future, and the market was
    /// not closed (`closed_at`) before it.
    #[param(schema_with = enum_schema::<Fill>)]
    pub fill: Option<String>,
}

/// Whether a list keeps items with any (OR) or all (AND) requested tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagsMatch {
    Any,
    All,
}

impl QueryEnum for TagsMatch {
    const ALL: &'static [Self] = &[TagsMatch::Any, TagsMatch::All];
    fn as_str(self) -> &'static str {
        match self {
            TagsMatch::Any => "any",
            TagsMatch::All => "all",
        }
    }
}

/// The OpenAPI schema of an optional enum parameter (`schema_with`; such a
/// parameter carries no description of its own).
pub fn enum_schema<T: QueryEnum>() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(T::ALL.iter().map(|v| v.as_str())))
        .into()
}

/// An integer in `min..=max`; the 422 issues pydantic would give.
fn bounded_int(
    raw: Option<&str>,
    name: &str,
    default: usize,
    max: usize,
    errors: &mut Vec<ValidationIssue>,
) -> usize {
    let Some(text) = raw else { return default };
    match text.trim().parse::<i64>() {
        Ok(n) if n < 1 => {
            errors.push(issue(
                "query",
                name,
                "Input should be greater than or equal to 1",
                "greater_than_equal",
            ));
            default
        }
        Ok(n) if n as u64 > max as u64 => {
            errors.push(issue(
                "query",
                name,
                format!("Input should be less than or equal to {max}"),
                "less_than_equal",
            ));
            default
        }
        Ok(n) => n as usize,
        Err(_) => {
            errors.push(issue(
                "query",
                name,
                "Input should be a valid integer, unable to parse string as an integer",
                "int_parsing",
            ));
            default
        }
    }
}

/// `'a', 'b' or 'c'`, as pydantic words enum errors.
fn or_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

/// An enum parameter: `default` when absent, a 422 issue when not one of
/// the words.
fn enum_param<T: QueryEnum>(
    q: &QueryPairs,
    name: &str,
    default: T,
    errors: &mut Vec<ValidationIssue>,
) -> T {
    match q.get(name) {
        None => default,
        Some(v) => T::parse(v).unwrap_or_else(|| {
            let words: Vec<&str> = T::ALL.iter().map(|w| w.as_str()).collect();
            errors.push(issue(
                "query",
                name,
                format!("Input should be {}", or_list(&words)),
                "enum",
            ));
            default
        }),
    }
}

/// A timestamp parameter that is well-formed for the schema but must parse
/// (400 otherwise, docs/SPEC.md §7).
fn timestamp(text: &str, name: &str) -> Result<Timestamp, ApiError> {
    // Unix seconds are checked by their own value, so `1e20` is reported
    // as out of range, not as the saturated 9223372036854775807 ms.
    match text.trim().parse::<f64>() {
        Ok(secs) => hindsight_schemas::wire::unix_seconds(secs),
        Err(_) => Timestamp::parse(text),
    }
    .map_err(|e| ApiError::BadRequest(format!("Invalid {name}: {e}.")))
}

// ---- history -------------------------------------------------------------------

/// The query of every history route (docs/SPEC.md §4.5).
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// Inclusive range start: ISO 8601 timestamp or Unix seconds.
    #[param(rename = "start_ts", value_type = String)]
    pub start: Timestamp,
    /// Exclusive range end: ISO 8601 timestamp or Unix seconds.
    #[param(rename = "end_ts", value_type = String)]
    pub end: Timestamp,
    #[param(inline)]
    pub resolution: Granularity,
    /// Max points per page (market-level routes: across all tokens).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 200, default = 100)]
    pub limit: usize,
    /// Opaque: a previous `metadata.next_cursor` of this route and token
    /// (or market) with the same `start_ts`, `end_ts` and `resolution`.
    // Raw: opened by `page`, once the handler knows its route and series.
    cursor: Option<String>,
    /// Documented by [`FillParam`] on the routes that take it; the others
    /// refuse `previous` ([`HistoryQuery::no_fill`]).
    #[param(ignore)]
    pub fill: Fill,
    #[param(ignore)]
    keys: CursorKeys,
}

/// One page of a history series: where it starts, and how the next
/// page's cursor is sealed.
#[derive(Debug, Clone)]
pub struct HistoryPage {
    pub from: Timestamp,
    pager: Pager,
}

impl HistoryPage {
    pub fn next_cursor(&self, next: Timestamp) -> String {
        self.pager.history(next)
    }
}

/// One page of a tick-level series: the key it starts at, and how the next
/// page's cursor is sealed.
#[derive(Debug, Clone)]
pub struct TickPage {
    pub from: TickKey,
    pager: Pager,
}

impl TickPage {
    pub fn next_cursor(&self, next: TickKey) -> String {
        self.pager.tick(next)
    }
}

impl HistoryQuery {
    /// This query's page of `route` for the series `id` (the resolved token
    /// or market id): from its cursor, which must have been issued for that
    /// route, series, range and resolution, or from `start`.
    pub fn page(&self, route: &str, id: &str) -> Result<HistoryPage, ApiError> {
        let pager = self.pager(route, id);
        // Only this API signs cursors, and only with positions inside the
        // range; the range check keeps even a leaked secret from reaching
        // before `start_ts`, which the plan's lookback was checked on.
        let from = match self.cursor.as_deref().map(|c| pager.history_from(c)) {
            None => self.start,
            Some(Some(t)) if t >= self.start && t <= self.end => t,
            Some(_) => {
                return Err(ApiError::invalid_cursor(
                    "this route and token (or market) with the same `start_ts`, `end_ts` and `resolution`",
                ))
            }
        };
        Ok(HistoryPage { from, pager })
    }

    /// 400 for `fill=previous` on a route that does not fill (books,
    /// metrics).
    pub fn no_fill(&self) -> Result<(), ApiError> {
        match self.fill {
            Fill::None => Ok(()),
            Fill::Previous => Err(ApiError::BadRequest(
                "fill=previous is served on prices and candles routes only".into(),
            )),
        }
    }

    fn pager(&self, route: &str, id: &str) -> Pager {
        let mut scope = Scope::new(route)
            .with("id", id)
            .with("start_ts", &self.start.millis().to_string())
            .with("end_ts", &self.end.millis().to_string())
            .with("resolution", self.resolution.as_str());
        // Bound only when given: cursors without `fill` stay as they were.
        if self.fill != Fill::None {
            scope = scope.with("fill", self.fill.as_str());
        }
        Pager::new(self.keys.clone(), scope)
    }

    /// Like [`HistoryQuery::page`], for a tick-level series: its cursors
    /// carry a [`TickKey`] (ticks may share a millisecond).
    pub fn tick_page(&self, route: &str, id: &str) -> Result<TickPage, ApiError> {
        let pager = self.pager(route, id);
        let from = match self.cursor.as_deref().map(|c| pager.tick_from(c)) {
            None => TickKey::at(self.start),
            Some(Some(k)) if k.ts >= self.start && k.ts <= self.end => k,
            Some(_) => {
                return Err(ApiError::invalid_cursor(
                    "this route and token with the same `start_ts`, `end_ts` and `resolution`",
                ))
            }
        };
        Ok(TickPage { from, pager })
    }

    /// The resolution of a bucket query; `tick` on a route that serves
    /// only buckets is refused (422, naming the routes that serve it).
    pub fn bucket(&self) -> Result<Resolution, ApiError> {
        match self.resolution {
            Granularity::Bucket(res) => Ok(res),
            Granularity::Tick => Err(ApiError::Validation(vec![issue(
                "query",
                "resolution",
                "resolution 'tick' is served by /v1/tokens/{token_id}/prices and \
                 /v1/tokens/{token_id}/books only; query one token at a time there",
                "enum",
            )])),
        }
    }

    /// The store read of a tick page: `per + 1` ticks (is there a next
    /// page?), reaching a day past `end_ts` (is the page closed?, as
    /// [`HistoryQuery::range`] does with buckets).
    pub fn tick_range(&self, page: &TickPage, per: usize) -> TickRange {
        let lookahead = Resolution::M1.width_ms() * LOOKAHEAD_BUCKETS;
        TickRange {
            from: page.from,
            end: Timestamp(self.end.0.saturating_add(lookahead)),
            limit: per + 1,
        }
    }

    /// The store range for `page` with `per_series` points from one series:
    /// one more than asked, so the handler can tell whether more follow, and
    /// reaching [`LOOKAHEAD_BUCKETS`] past `end_ts`, so that a last page can
    /// tell whether the series already has a later bucket (the page is then
    /// closed, docs/DESIGN.md "Caching history"). Points at or after
    /// `end_ts` are never served.
    pub fn range(&self, res: Resolution, page: &HistoryPage, per_series: usize) -> Range {
        let lookahead = res.width_ms() * LOOKAHEAD_BUCKETS;
        Range {
            res,
            start: page.from,
            end: Timestamp(self.end.0.saturating_add(lookahead)),
            limit: per_series + 1,
        }
    }
}

impl<S> FromRequestParts<S> for HistoryQuery
where
    S: Send + Sync,
    CursorKeys: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = QueryPairs::from_parts(parts, state).await?;
        HistoryQuery::parse(&q, CursorKeys::from_ref(state), true)
    }
}

impl HistoryQuery {
    /// What the page of `route` for the path id `id` is kept under in the
    /// page cache: every field the page is a function of, the strings
    /// quoted and escaped so that no request's key is another's (a key
    /// names the page *after* the plan checked this request's own range).
    /// `None` with `fill=previous`, whose pages also depend on the clock.
    pub fn cache_key(&self, route: &str, id: &str) -> Option<String> {
        (self.fill == Fill::None).then(|| {
            format!(
                "{route} {id:?} {} {} {} {} {:?}",
                self.start.0,
                self.end.0,
                self.resolution.as_str(),
                self.limit,
                self.cursor
            )
        })
    }

    /// `with_resolution`: the route takes `resolution` (required); else it
    /// serves ticks only (trades), and the query is at `tick`.
    fn parse(q: &QueryPairs, keys: CursorKeys, with_resolution: bool) -> Result<Self, ApiError> {
        let mut errors = Vec::new();
        let required: &[&str] = if with_resolution {
            &["start_ts", "end_ts", "resolution"]
        } else {
            &["start_ts", "end_ts"]
        };
        for name in required {
            if q.get(name).is_none() {
                errors.push(issue("query", name, "Field required", "missing"));
            }
        }
        let resolution = if with_resolution {
            enum_param(
                q,
                "resolution",
                Granularity::Bucket(Resolution::M1),
                &mut errors,
            )
        } else {
            Granularity::Tick
        };
        let fill = enum_param(q, "fill", Fill::None, &mut errors);
        let limit = match q.get("limit").map(|l| l.trim().parse::<i64>()) {
            // Above 200 is a 400 that states both numbers (docs/SPEC.md §7).
            Some(Ok(n)) if n > HISTORY_LIMIT_MAX as i64 => {
                if errors.is_empty() {
                    return Err(ApiError::BadRequest(format!(
                        "Requested limit {n} exceeds the maximum of {HISTORY_LIMIT_MAX}."
                    )));
                }
                HISTORY_LIMIT_DEFAULT
            }
            _ => bounded_int(
                q.get("limit"),
                "limit",
                HISTORY_LIMIT_DEFAULT,
                HISTORY_LIMIT_MAX,
                &mut errors,
            ),
        };
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        let (start, end) = span_times(q)?;
        Ok(HistoryQuery {
            start,
            end,
            resolution,
            limit,
            cursor: q.non_empty("cursor").map(str::to_string),
            fill,
            keys,
        })
    }
}

/// The query of `/v1/tokens/{token_id}/trades`: a history query without
/// `resolution` (trades are served one by one, at `tick`).
#[derive(Debug, Clone)]
pub struct TradesQuery(pub HistoryQuery);

impl IntoParams for TradesQuery {
    fn into_params(
        parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        HistoryQuery::into_params(parameter_in_provider)
            .into_iter()
            .filter(|p| p.name != "resolution")
            .collect()
    }
}

impl<S> FromRequestParts<S> for TradesQuery
where
    S: Send + Sync,
    CursorKeys: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = QueryPairs::from_parts(parts, state).await?;
        HistoryQuery::parse(&q, CursorKeys::from_ref(state), false).map(TradesQuery)
    }
}

/// The query of the book at a moment.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BookAtQuery {
    /// The moment: ISO 8601 timestamp or Unix seconds. The answer is the
    /// latest snapshot at or before it.
    #[param(value_type = String)]
    pub ts: Timestamp,
}

impl<S: Send + Sync> FromRequestParts<S> for BookAtQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = QueryPairs::from_parts(parts, state).await?;
        let Some(text) = q.get("ts") else {
            return Err(ApiError::Validation(vec![issue(
                "query",
                "ts",
                "Field required",
                "missing",
            )]));
        };
        Ok(BookAtQuery {
            ts: timestamp(text, "ts")?,
        })
    }
}

/// The schema side of `start_ts`, `end_ts` and `resolution`, which every
/// history-shaped query takes: each is required, the resolution one of the
/// words. Issues go to `errors` with the query's other 422s.
fn span_params(q: &QueryPairs, errors: &mut Vec<ValidationIssue>) -> Granularity {
    for name in ["start_ts", "end_ts", "resolution"] {
        if q.get(name).is_none() {
            errors.push(issue("query", name, "Field required", "missing"));
        }
    }
    enum_param(q, "resolution", Granularity::Bucket(Resolution::M1), errors)
}

/// `start_ts` and `end_ts` once the schema passed: each must parse, in
/// order (400 otherwise, docs/SPEC.md §7).
fn span_times(q: &QueryPairs) -> Result<(Timestamp, Timestamp), ApiError> {
    let ts = |name: &str| timestamp(q.get(name).unwrap_or_default(), name);
    let (start, end) = (ts("start_ts")?, ts("end_ts")?);
    if start > end {
        return Err(ApiError::BadRequest("start_ts must be <= end_ts".into()));
    }
    Ok((start, end))
}

// ---- export --------------------------------------------------------------------

impl QueryEnum for Format {
    const ALL: &'static [Self] = &Format::ALL;
    fn as_str(self) -> &'static str {
        Format::as_str(self)
    }
}

/// The query of the export routes: one token or one market, and the range
/// and resolution of the history routes, without paging — the whole range
/// comes as one file.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// The token to export (prices, books). Give this or `market_id`.
    #[param(max_length = 200)]
    pub token_id: Option<String>,
    /// The market to export: every token of it (prices, books), or its
    /// metrics. Give this or `token_id`.
    #[param(max_length = 200)]
    pub market_id: Option<String>,
    /// Inclusive range start: ISO 8601 timestamp or Unix seconds.
    #[param(rename = "start_ts", value_type = String)]
    pub start: Timestamp,
    /// Exclusive range end: ISO 8601 timestamp or Unix seconds.
    #[param(rename = "end_ts", value_type = String)]
    pub end: Timestamp,
    #[param(inline)]
    pub resolution: Granularity,
    /// `csv` (default) or `parquet`.
    #[param(value_type = Option<String>, schema_with = enum_schema::<Format>)]
    pub format: Format,
}

impl<S: Send + Sync> FromRequestParts<S> for ExportQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = QueryPairs::from_parts(parts, state).await?;
        ExportQuery::parse(&q, true, true)
    }
}

impl ExportQuery {
    /// `by_token`: the route exports a token or a market (exactly one of
    /// `token_id` and `market_id`); else a market only, and `token_id`,
    /// which it does not document, is ignored like any unknown parameter.
    /// `by_resolution`: the route takes `resolution`; else it is `tick`
    /// (trades, kept one by one), and a `resolution` given is ignored the
    /// same way.
    fn parse(q: &QueryPairs, by_token: bool, by_resolution: bool) -> Result<Self, ApiError> {
        let mut errors = Vec::new();
        let resolution = if by_resolution {
            span_params(q, &mut errors)
        } else {
            for name in ["start_ts", "end_ts"] {
                if q.get(name).is_none() {
                    errors.push(issue("query", name, "Field required", "missing"));
                }
            }
            Granularity::Tick
        };
        let format = enum_param(q, "format", Format::Csv, &mut errors);
        let token_id = if by_token {
            id_param(q, "token_id", &mut errors)
        } else {
            None
        };
        let market_id = id_param(q, "market_id", &mut errors);
        match (&token_id, &market_id) {
            (None, None) if by_token => errors.push(issue(
                "query",
                "token_id",
                "Give `token_id` or `market_id`",
                "missing",
            )),
            (None, None) => errors.push(issue("query", "market_id", "Field required", "missing")),
            (Some(_), Some(_)) => errors.push(issue(
                "query",
                "market_id",
                "Give `token_id` or `market_id`, not both",
                "extra_forbidden",
            )),
            _ => {}
        }
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        let (start, end) = span_times(q)?;
        Ok(ExportQuery {
            token_id,
            market_id,
            start,
            end,
            resolution,
            format,
        })
    }
}

/// The query of `POST /v1/exports`: the export's `kind`, and the
/// parameters `/v1/export/{kind}` takes, parsed by [`ExportQuery`]'s own
/// parser once the kind says whether a token may be given. A job stores
/// them as given ([`ExportJobQuery::params`]), so it runs its export
/// again, after a restart, through that same parser: timestamps are
/// absolute, so the range does not move.
pub struct ExportJobQuery(QueryPairs);

/// What an export job keeps of its query: the parameters an export reads.
const EXPORT_JOB_PARAMS: [&str; 7] = [
    "kind",
    "token_id",
    "market_id",
    "start_ts",
    "end_ts",
    "resolution",
    "format",
];

impl ExportJobQuery {
    /// `kind`, as given; 422 when it is missing.
    pub fn kind(&self) -> Result<&str, ApiError> {
        self.0.get("kind").ok_or_else(|| {
            ApiError::Validation(vec![issue("query", "kind", "Field required", "missing")])
        })
    }

    /// The export's query; `by_token` and `by_resolution` as for
    /// [`ExportQuery`]'s routes.
    pub fn export(&self, by_token: bool, by_resolution: bool) -> Result<ExportQuery, ApiError> {
        ExportQuery::parse(&self.0, by_token, by_resolution)
    }

    /// The parameters an export reads, to store with a job.
    pub fn params(&self) -> BTreeMap<String, String> {
        EXPORT_JOB_PARAMS
            .iter()
            .filter_map(|&name| self.0.get(name).map(|v| (name.to_string(), v.to_string())))
            .collect()
    }

    /// A query from parameters [`ExportJobQuery::params`] gave.
    pub fn from_params(params: BTreeMap<String, String>) -> Self {
        ExportJobQuery(QueryPairs(params.into_iter().collect()))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ExportJobQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        QueryPairs::from_parts(parts, state)
            .await
            .map(ExportJobQuery)
    }
}

impl IntoParams for ExportJobQuery {
    fn into_params(
        parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        let kind = utoipa::openapi::path::ParameterBuilder::new()
            .name("kind")
            .parameter_in(utoipa::openapi::path::ParameterIn::Query)
            .required(utoipa::openapi::Required::True)
            .description(Some(
                "What to export: `prices`, `books`, `metrics`, `trades` or `candles` (the \
                 `{kind}` of `/v1/export/{kind}`, whose parameters follow; `metrics` takes \
                 `market_id` only, `trades` no `resolution`)",
            ))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["prices", "books", "metrics", "trades", "candles"])),
            ))
            .build();
        std::iter::once(kind)
            .chain(ExportQuery::into_params(parameter_in_provider))
            .collect()
    }
}

// ---- estimates -----------------------------------------------------------------

/// Which history route an estimate is for (`/v1/estimate/{kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EstimateKind {
    Prices,
    Books,
    Metrics,
    Candles,
    Trades,
}

impl QueryEnum for EstimateKind {
    const ALL: &'static [Self] = &[
        EstimateKind::Prices,
        EstimateKind::Books,
        EstimateKind::Metrics,
        EstimateKind::Candles,
        EstimateKind::Trades,
    ];
    fn as_str(self) -> &'static str {
        match self {
            EstimateKind::Prices => "prices",
            EstimateKind::Books => "books",
            EstimateKind::Metrics => "metrics",
            EstimateKind::Candles => "candles",
            EstimateKind::Trades => "trades",
        }
    }
}

impl EstimateKind {
    /// The path parameter, or the 422 of a word that is not a kind.
    pub fn parse_path(text: &str) -> Result<Self, ApiError> {
        Self::parse(text).ok_or_else(|| {
            let words: Vec<&str> = Self::ALL.iter().map(|w| w.as_str()).collect();
            ApiError::Validation(vec![issue(
                "path",
                "kind",
                format!("Input should be {}", or_list(&words)),
                "enum",
            )])
        })
    }
}

/// The history parameters of an estimate: those of the route it
/// estimates, so trades take no `resolution` (they are counted one by one,
/// as `/v1/tokens/{token_id}/trades` serves them).
#[derive(Debug, Clone)]
pub struct EstimateQuery(pub HistoryQuery);

impl IntoParams for EstimateQuery {
    fn into_params(
        parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        HistoryQuery::into_params(parameter_in_provider)
    }
}

impl<S> FromRequestParts<S> for EstimateQuery
where
    S: Send + Sync,
    CursorKeys: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let trades = parts.uri.path().ends_with("/trades");
        let q = QueryPairs::from_parts(parts, state).await?;
        HistoryQuery::parse(&q, CursorKeys::from_ref(state), !trades).map(EstimateQuery)
    }
}

/// The series an estimate counts: one token (`token_id`), or every token
/// (metrics: the market itself) of a market (`market_id`, id or slug),
/// named as on the export routes.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EstimateTarget {
    /// A token, as on `/v1/tokens/{token_id}/…` (not for metrics).
    #[param(min_length = 1, max_length = 200)]
    pub token_id: Option<String>,
    /// A market id or slug, as on `/v1/markets/{id_or_slug}/…`.
    #[param(min_length = 1, max_length = 200)]
    pub market_id: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for EstimateTarget {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = QueryPairs::from_parts(parts, state).await?;
        let mut errors = Vec::new();
        let target = EstimateTarget {
            token_id: id_param(&q, "token_id", &mut errors),
            market_id: id_param(&q, "market_id", &mut errors),
        };
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        if target.token_id.is_some() == target.market_id.is_some() {
            return Err(ApiError::BadRequest(
                "Give exactly one of `token_id` and `market_id`.".into(),
            ));
        }
        Ok(target)
    }
}

/// The query of `/v1/export/metrics`: an [`ExportQuery`] of one market,
/// without `token_id` and with `market_id` required (metrics are per
/// market).
#[derive(Debug, Clone)]
pub struct MarketExportQuery(pub ExportQuery);

impl From<MarketExportQuery> for ExportQuery {
    fn from(q: MarketExportQuery) -> Self {
        q.0
    }
}

impl IntoParams for MarketExportQuery {
    fn into_params(
        parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        ExportQuery::into_params(parameter_in_provider)
            .into_iter()
            .filter(|p| p.name != "token_id")
            .map(|mut p| {
                if p.name == "market_id" {
                    p.required = utoipa::openapi::Required::True;
                }
                p
            })
            .collect()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for MarketExportQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = QueryPairs::from_parts(parts, state).await?;
        ExportQuery::parse(&q, false, true).map(MarketExportQuery)
    }
}

/// The query of `/v1/export/trades`: an [`ExportQuery`] without
/// `resolution` (trades are exported one by one, as the trades route pages
/// them).
#[derive(Debug, Clone)]
pub struct TradesExportQuery(pub ExportQuery);

impl From<TradesExportQuery> for ExportQuery {
    fn from(q: TradesExportQuery) -> Self {
        q.0
    }
}

impl IntoParams for TradesExportQuery {
    fn into_params(
        parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        ExportQuery::into_params(parameter_in_provider)
            .into_iter()
            .filter(|p| p.name != "resolution")
            .collect()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for TradesExportQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = QueryPairs::from_parts(parts, state).await?;
        ExportQuery::parse(&q, true, false).map(TradesExportQuery)
    }
}

// ---- discovery lists ----------------------------------------------------------

/// The parameters a discovery list adds to those every list shares
/// ([`ListQuery`]): parsed with them, so one 422 lists every failure.
pub trait ListFilter: Sized + Send {
    fn parse(q: &QueryPairs, errors: &mut Vec<ValidationIssue>) -> Self;
    /// Binds the list's cursors to the filter's values.
    fn bind(&self, scope: Scope) -> Scope;
}

/// `/v1/series` has no filter of its own.
#[derive(Debug, Clone, Default)]
pub struct NoFilter;

impl ListFilter for NoFilter {
    fn parse(_: &QueryPairs, _: &mut Vec<ValidationIssue>) -> Self {
        NoFilter
    }
    fn bind(&self, scope: Scope) -> Scope {
        scope
    }
}

/// Filters of `/v1/events`.
#[derive(Debug, Clone, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventFilter {
    #[param(max_length = 200)]
    pub series_id: Option<String>,
    #[param(max_length = 200)]
    pub series_slug: Option<String>,
}

impl ListFilter for EventFilter {
    fn parse(q: &QueryPairs, errors: &mut Vec<ValidationIssue>) -> Self {
        EventFilter {
            series_id: id_param(q, "series_id", errors),
            series_slug: id_param(q, "series_slug", errors),
        }
    }
    fn bind(&self, scope: Scope) -> Scope {
        scope
            .with("series_id", self.series_id.as_deref().unwrap_or_default())
            .with(
                "series_slug",
                self.series_slug.as_deref().unwrap_or_default(),
            )
    }
}

/// Filters of `/v1/markets`.
#[derive(Debug, Clone, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MarketFilter {
    #[param(max_length = 200)]
    pub event_id: Option<String>,
    #[param(max_length = 200)]
    pub event_slug: Option<String>,
}

impl ListFilter for MarketFilter {
    fn parse(q: &QueryPairs, errors: &mut Vec<ValidationIssue>) -> Self {
        MarketFilter {
            event_id: id_param(q, "event_id", errors),
            event_slug: id_param(q, "event_slug", errors),
        }
    }
    fn bind(&self, scope: Scope) -> Scope {
        scope
            .with("event_id", self.event_id.as_deref().unwrap_or_default())
            .with("event_slug", self.event_slug.as_deref().unwrap_or_default())
    }
}

/// An id or slug filter: at most [`MAX_ID_LEN`] characters; empty is none.
fn id_param(q: &QueryPairs, name: &str, errors: &mut Vec<ValidationIssue>) -> Option<String> {
    let value = q.non_empty(name)?;
    if value.chars().count() > MAX_ID_LEN {
        errors.push(issue(
            "query",
            name,
            format!("String should have at most {MAX_ID_LEN} characters"),
            "string_too_long",
        ));
    }
    Some(value.to_string())
}

#[derive(Debug, Clone, Default)]
pub struct DateRange {
    pub min: Option<Timestamp>,
    pub max: Option<Timestamp>,
}

impl DateRange {
    /// Whether a (possibly missing) date passes; a filter excludes missing dates.
    pub fn keeps(&self, date: Option<Timestamp>) -> bool {
        match date {
            None => self.min.is_none() && self.max.is_none(),
            Some(d) => self.min.is_none_or(|m| d >= m) && self.max.is_none_or(|m| d <= m),
        }
    }
}

/// The query of a discovery list: what `/v1/series`, `/v1/events` and
/// `/v1/markets` share, and the list's own filter `F` (documented by its
/// own `IntoParams`: a route lists `params(ListQuery, EventFilter)`).
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery<F = NoFilter> {
    /// Case-insensitive text match (markets: question or slug; series and
    /// events: title or slug).
    // Lowercased.
    #[param(max_length = 200)]
    pub search: Option<String>,
    #[param(value_type = Option<i64>, minimum = 1, maximum = 1000, default = 100)]
    pub limit: usize,
    /// Opaque: a previous `metadata.next_cursor` of this list with the same
    /// `sort`, `order` and filters.
    // Raw: opened by `page`.
    cursor: Option<String>,
    /// Keep items with `start_date` >= value (ISO 8601 date or date-time).
    #[param(value_type = Option<String>)]
    pub start_date_min: Option<Timestamp>,
    #[param(value_type = Option<String>)]
    pub start_date_max: Option<Timestamp>,
    #[param(value_type = Option<String>)]
    pub end_date_min: Option<Timestamp>,
    #[param(value_type = Option<String>)]
    pub end_date_max: Option<Timestamp>,
    /// Event tags (series: own tags); repeated or comma-separated.
    #[param(value_type = Option<Vec<String>>, style = Form, explode)]
    pub tags: Vec<String>,
    #[param(schema_with = enum_schema::<TagsMatch>)]
    pub tags_match: TagsMatch,
    #[param(schema_with = enum_schema::<SortField>)]
    pub sort: SortField,
    #[param(schema_with = enum_schema::<SortOrder>)]
    pub order: SortOrder,
    #[param(ignore)]
    pub filter: F,
    #[param(ignore)]
    keys: CursorKeys,
}

/// One page of a list: the position to resume after, and how the next
/// page's cursor is sealed.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub after: Option<ListCursor>,
    pager: Pager,
}

impl ListPage {
    pub fn next_cursor(&self, last: &ListCursor) -> String {
        self.pager.list(last)
    }
}

impl<F: ListFilter> ListQuery<F> {
    /// This query's page of the list at `route`: after its cursor, which
    /// must have been issued for that list with the same sort, order and
    /// filters (tags in any order), or from the first item.
    pub fn page(&self, route: &str) -> Result<ListPage, ApiError> {
        let ms = |d: Option<Timestamp>| d.map(|t| t.millis().to_string()).unwrap_or_default();
        let mut tags = self.tags.clone();
        tags.sort();
        let scope = Scope::new(route)
            .with("sort", self.sort.as_str())
            .with("order", QueryEnum::as_str(self.order))
            .with("search", self.search.as_deref().unwrap_or_default())
            .with("tags", &tags.join(","))
            .with("tags_match", QueryEnum::as_str(self.tags_match))
            .with("start_date_min", &ms(self.start_date_min))
            .with("start_date_max", &ms(self.start_date_max))
            .with("end_date_min", &ms(self.end_date_min))
            .with("end_date_max", &ms(self.end_date_max));
        let pager = Pager::new(self.keys.clone(), self.filter.bind(scope));
        let after = match &self.cursor {
            None => None,
            Some(c) => Some(pager.list_after(c).ok_or_else(|| {
                ApiError::invalid_cursor("this list with the same `sort`, `order` and filters")
            })?),
        };
        Ok(ListPage { after, pager })
    }
}

impl<F> ListQuery<F> {
    pub fn start_date(&self) -> DateRange {
        DateRange {
            min: self.start_date_min,
            max: self.start_date_max,
        }
    }

    pub fn end_date(&self) -> DateRange {
        DateRange {
            min: self.end_date_min,
            max: self.end_date_max,
        }
    }

    /// Tag filter: any (OR) or all (AND) of the requested tags.
    pub fn keeps_tags(&self, tags: &[String]) -> bool {
        if self.tags.is_empty() {
            return true;
        }
        let has = |t: &String| tags.contains(t);
        match self.tags_match {
            TagsMatch::All => self.tags.iter().all(has),
            TagsMatch::Any => self.tags.iter().any(has),
        }
    }
}

impl<S, F> FromRequestParts<S> for ListQuery<F>
where
    S: Send + Sync,
    F: ListFilter,
    CursorKeys: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = QueryPairs::from_parts(parts, state).await?;
        let mut errors = Vec::new();
        let search = q.non_empty("search");
        if search.is_some_and(|s| s.chars().count() > SEARCH_MAX) {
            errors.push(issue(
                "query",
                "search",
                format!("String should have at most {SEARCH_MAX} characters"),
                "string_too_long",
            ));
        }
        let limit = bounded_int(
            q.get("limit"),
            "limit",
            LIST_LIMIT_DEFAULT,
            LIST_LIMIT_MAX,
            &mut errors,
        );
        let tags_match = enum_param(&q, "tags_match", TagsMatch::Any, &mut errors);
        let sort = enum_param(&q, "sort", SortField::UpdatedAt, &mut errors);
        let order = enum_param(&q, "order", SortOrder::Desc, &mut errors);
        let filter = F::parse(&q, &mut errors);
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        let date = |name: &str| q.non_empty(name).map(|v| timestamp(v, name)).transpose();
        let (start_date_min, start_date_max) = (date("start_date_min")?, date("start_date_max")?);
        let (end_date_min, end_date_max) = (date("end_date_min")?, date("end_date_max")?);
        for (min, max, field) in [
            (start_date_min, start_date_max, "start_date"),
            (end_date_min, end_date_max, "end_date"),
        ] {
            if let (Some(min), Some(max)) = (min, max) {
                if min > max {
                    return Err(ApiError::BadRequest(format!(
                        "{field}_min must be <= {field}_max"
                    )));
                }
            }
        }
        Ok(ListQuery {
            search: search.map(str::to_lowercase),
            limit,
            cursor: q.non_empty("cursor").map(str::to_string),
            start_date_min,
            start_date_max,
            end_date_min,
            end_date_max,
            tags: q.all("tags"),
            tags_match,
            sort,
            order,
            filter,
            keys: CursorKeys::from_ref(state),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn keys() -> CursorKeys {
        CursorKeys::new(&["0123456789abcdef0123456789abcdef"]).unwrap()
    }

    async fn extract<T: FromRequestParts<CursorKeys, Rejection = ApiError>>(
        query: &str,
    ) -> Result<T, ApiError> {
        let (mut parts, ()) = Request::get(format!("/x?{query}"))
            .body(())
            .unwrap()
            .into_parts();
        T::from_request_parts(&mut parts, &keys()).await
    }

    fn issue_names(e: ApiError) -> Vec<String> {
        match e {
            ApiError::Validation(issues) => issues.into_iter().map(|i| i.loc[1].clone()).collect(),
            other => panic!("expected 422, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_list_filter_fails_together_with_the_shared_parameters() {
        let long = "e".repeat(201);
        let err = extract::<ListQuery<MarketFilter>>(&format!("limit=0&order=up&event_id={long}"))
            .await
            .unwrap_err();
        assert_eq!(issue_names(err), ["limit", "order", "event_id"]);
        // The same parameter is no filter of /v1/series: ignored there.
        let q = extract::<ListQuery>(&format!("event_id={long}"))
            .await
            .unwrap();
        assert_eq!(q.limit, LIST_LIMIT_DEFAULT);
    }

    #[tokio::test]
    async fn list_words_parse_to_their_values() {
        let q = extract::<ListQuery<EventFilter>>(
            "sort=end_date&order=asc&tags_match=all&tags=a,b&tags=c&search=BTC&series_slug=s",
        )
        .await
        .unwrap();
        assert_eq!(
            (q.sort, q.order, q.tags_match),
            (SortField::EndDate, SortOrder::Asc, TagsMatch::All)
        );
        assert_eq!(q.tags, ["a", "b", "c"]);
        assert_eq!(q.search.as_deref(), Some("btc"));
        assert_eq!(q.filter.series_slug.as_deref(), Some("s"));
        assert!(q.keeps_tags(&["a".into(), "b".into(), "c".into()]));
        assert!(!q.keeps_tags(&["a".into()]));
    }

    #[tokio::test]
    async fn a_history_page_starts_at_its_cursor() {
        let base = "start_ts=2025-09-01T00:00:00Z&end_ts=2025-09-02T00:00:00Z&resolution=1h";
        let q = extract::<HistoryQuery>(base).await.unwrap();
        let page = q.page(ROUTE, "t1").unwrap();
        assert_eq!(
            (page.from, q.limit, q.resolution),
            (
                q.start,
                HISTORY_LIMIT_DEFAULT,
                Granularity::Bucket(Resolution::H1)
            )
        );
        let at = Timestamp(q.start.0 + 3_600_000);
        let c = page.next_cursor(at);
        let q = extract::<HistoryQuery>(&format!("{base}&cursor={c}"))
            .await
            .unwrap();
        let page = q.page(ROUTE, "t1").unwrap();
        assert_eq!(
            (
                page.from,
                q.range(Resolution::H1, &page, 10).start,
                q.range(Resolution::H1, &page, 10).limit
            ),
            (at, at, 11)
        );
        let err = extract::<HistoryQuery>("resolution=2h").await.unwrap_err();
        assert_eq!(issue_names(err), ["start_ts", "end_ts", "resolution"]);
    }

    const ROUTE: &str = "/v1/tokens/{token_id}/prices";

    fn bad_request(e: ApiError) -> String {
        match e {
            ApiError::BadRequest(detail) => detail,
            other => panic!("expected 400, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_history_cursor_continues_only_its_own_route_series_range_and_resolution() {
        let base = "start_ts=2025-09-01T00:00:00Z&end_ts=2025-09-02T00:00:00Z";
        let q = extract::<HistoryQuery>(&format!("{base}&resolution=1h"))
            .await
            .unwrap();
        let c = q
            .page(ROUTE, "t1")
            .unwrap()
            .next_cursor(Timestamp(q.start.0 + 3_600_000));
        let c = &c;
        let resumes = |query: String, route: &'static str, id: &'static str| async move {
            extract::<HistoryQuery>(&format!("{query}&cursor={c}"))
                .await
                .unwrap()
                .page(route, id)
        };
        // Another limit, or the same start in Unix seconds: the same pages.
        let same = [
            format!("{base}&resolution=1h&limit=7"),
            "start_ts=1756684800&end_ts=2025-09-02T00:00:00Z&resolution=1h".into(),
        ];
        for query in same {
            assert!(resumes(query.clone(), ROUTE, "t1").await.is_ok(), "{query}");
        }
        let other_range = "start_ts=2025-09-01T00:00:00Z&end_ts=2025-09-03T00:00:00Z&resolution=1h";
        for (query, route, id) in [
            (format!("{base}&resolution=1h"), ROUTE, "t2"),
            (
                format!("{base}&resolution=1h"),
                "/v1/tokens/{token_id}/books",
                "t1",
            ),
            (
                format!("{base}&resolution=1h"),
                "/v1/markets/{id_or_slug}/prices",
                "t1",
            ),
            (format!("{base}&resolution=1m"), ROUTE, "t1"),
            (other_range.to_string(), ROUTE, "t1"),
        ] {
            let detail = bad_request(resumes(query.clone(), route, id).await.unwrap_err());
            assert!(
                detail.starts_with("Invalid pagination cursor: the `cursor` parameter"),
                "{route} {id} {query}: {detail}"
            );
        }
    }

    #[tokio::test]
    async fn a_list_cursor_continues_only_its_own_list_sort_and_filters() {
        let q = extract::<ListQuery<MarketFilter>>("tags=b,a&event_id=e1")
            .await
            .unwrap();
        let c = q.page("/v1/markets").unwrap().next_cursor(&ListCursor {
            key: Some(5),
            id: "m1".into(),
        });
        // Tags in another order select the same markets: the cursor continues.
        let q = extract::<ListQuery<MarketFilter>>(&format!(
            "tags=a&tags=b&event_id=e1&limit=3&cursor={c}"
        ))
        .await
        .unwrap();
        let after = q.page("/v1/markets").unwrap().after;
        assert_eq!(after.map(|c| c.id), Some("m1".into()));
        for query in [
            "tags=a,b",
            "tags=a,b&event_id=e2",
            "tags=a,b&event_id=e1&order=asc",
            "tags=a,b&event_id=e1&search=x",
            "tags=a&event_id=e1",
            "tags=a,b&event_id=e1&start_date_min=2025-01-01",
        ] {
            let q = extract::<ListQuery<MarketFilter>>(&format!("{query}&cursor={c}"))
                .await
                .unwrap();
            let detail = bad_request(q.page("/v1/markets").unwrap_err());
            assert!(detail.starts_with("Invalid pagination cursor"), "{query}");
        }
        let q = extract::<ListQuery>(&format!("tags=a,b&cursor={c}"))
            .await
            .unwrap();
        assert!(
            q.page("/v1/series").is_err(),
            "a market cursor on the series list"
        );
    }
}
