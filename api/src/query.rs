//! Query parameters, validated in extractors so handlers receive only
//! well-formed values.
//!
//! Schema failures (missing, wrong type, out of bounds, bad enum) are 422 in
//! FastAPI's shape; bad timestamps, date ranges, history limits above 200 and
//! cursors are 400 (SPEC.md §7). The `*Params` structs declare the same
//! parameters for the OpenAPI document.

use crate::catalog::{SortField, SortOrder};
use crate::cursor::{self, ListCursor};
use crate::error::{issue, ApiError};
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use hindsight_contracts::Range;
use hindsight_schemas::api::ValidationIssue;
use hindsight_schemas::{Resolution, Timestamp, MAX_ID_LEN};
use utoipa::{IntoParams, ToSchema};

pub const HISTORY_LIMIT_DEFAULT: usize = 100;
pub const HISTORY_LIMIT_MAX: usize = 200;
pub const LIST_LIMIT_DEFAULT: usize = 100;
pub const LIST_LIMIT_MAX: usize = 1000;
pub const SEARCH_MAX: usize = 200;

/// The raw pairs of a query string.
struct Pairs(Vec<(String, String)>);

impl Pairs {
    async fn from_parts<S: Send + Sync>(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("Malformed query string: {e}")))?;
        Ok(Pairs(pairs))
    }

    /// The last value of a single-valued parameter.
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
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

fn enum_value<T>(
    raw: Option<&str>,
    name: &str,
    default: T,
    allowed: &[&str],
    parse: impl Fn(&str) -> Option<T>,
    errors: &mut Vec<ValidationIssue>,
) -> T {
    match raw {
        None => default,
        Some(v) => parse(v).unwrap_or_else(|| {
            errors.push(issue(
                "query",
                name,
                format!("Input should be {}", or_list(allowed)),
                "enum",
            ));
            default
        }),
    }
}

// ---- history -------------------------------------------------------------------

/// Aggregation bucket size.
#[derive(ToSchema)]
#[allow(dead_code)]
pub enum ResolutionParam {
    #[schema(rename = "1m")]
    M1,
    #[schema(rename = "5m")]
    M5,
    #[schema(rename = "10m")]
    M10,
    #[schema(rename = "15m")]
    M15,
    #[schema(rename = "1h")]
    H1,
    #[schema(rename = "6h")]
    H6,
    #[schema(rename = "1d")]
    D1,
}

/// Query parameters of every history route (SPEC.md §4.5).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct HistoryParams {
    /// Inclusive range start: ISO 8601 timestamp or Unix seconds.
    start_ts: String,
    /// Exclusive range end: ISO 8601 timestamp or Unix seconds.
    end_ts: String,
    #[param(inline)]
    resolution: ResolutionParam,
    /// Max points per page (market-level routes: across all tokens).
    #[param(minimum = 1, maximum = 200, default = 100)]
    limit: Option<i64>,
    /// Opaque, from a previous `metadata.next_cursor`.
    cursor: Option<String>,
}

#[derive(Debug, Clone)]
pub struct HistoryQuery {
    /// Inclusive start as requested (plan checks apply to it).
    pub start: Timestamp,
    /// Exclusive end.
    pub end: Timestamp,
    pub resolution: Resolution,
    pub limit: usize,
    /// Where this page starts: `start`, or the cursor's position.
    pub from: Timestamp,
}

impl HistoryQuery {
    /// The store range for a page of `per_series` points from one series,
    /// one more than asked so the handler can tell whether more follow.
    pub fn range(&self, per_series: usize) -> Range {
        Range {
            res: self.resolution,
            start: self.from,
            end: self.end,
            limit: per_series + 1,
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for HistoryQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = Pairs::from_parts(parts, state).await?;
        let mut errors = Vec::new();
        for name in ["start_ts", "end_ts", "resolution"] {
            if q.get(name).is_none() {
                errors.push(issue("query", name, "Field required", "missing"));
            }
        }
        let names: Vec<&str> = Resolution::ALL.iter().map(|r| r.as_str()).collect();
        let resolution = q.get("resolution").map(|r| {
            enum_value(
                Some(r),
                "resolution",
                Resolution::M1,
                &names,
                Resolution::parse,
                &mut errors,
            )
        });
        let limit = match q.get("limit").map(|l| l.trim().parse::<i64>()) {
            // Above 200 is a 400 that states both numbers (SPEC.md §7).
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
        let ts = |name: &str| {
            Timestamp::parse(q.get(name).unwrap_or_default())
                .map_err(|e| ApiError::BadRequest(format!("Invalid {name}: {e}.")))
        };
        let (start, end) = (ts("start_ts")?, ts("end_ts")?);
        if start > end {
            return Err(ApiError::BadRequest("start_ts must be <= end_ts".into()));
        }
        let from = match q.get("cursor").filter(|c| !c.is_empty()) {
            None => start,
            Some(c) => match cursor::decode_history(c) {
                Some(t) if t >= start && t <= end => t,
                _ => return Err(ApiError::invalid_cursor()),
            },
        };
        Ok(HistoryQuery {
            start,
            end,
            resolution: resolution.expect("checked above"),
            limit,
            from,
        })
    }
}

// ---- discovery lists ----------------------------------------------------------

#[derive(ToSchema)]
#[allow(dead_code, non_camel_case_types)]
pub enum TagsMatchParam {
    any,
    all,
}

#[derive(ToSchema)]
#[allow(dead_code, non_camel_case_types)]
pub enum SortParam {
    created_at,
    updated_at,
    start_date,
    end_date,
}

#[derive(ToSchema)]
#[allow(dead_code, non_camel_case_types)]
pub enum OrderParam {
    asc,
    desc,
}

/// Query parameters of `/v1/series`, `/v1/events` and `/v1/markets`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ListParams {
    /// Case-insensitive text match (markets: question or slug; series and
    /// events: title or slug).
    #[param(max_length = 200)]
    search: Option<String>,
    #[param(minimum = 1, maximum = 1000, default = 100)]
    limit: Option<i64>,
    /// Opaque, from a previous `metadata.next_cursor`.
    cursor: Option<String>,
    /// Keep items with `start_date` >= value (ISO 8601 date or date-time).
    start_date_min: Option<String>,
    start_date_max: Option<String>,
    end_date_min: Option<String>,
    end_date_max: Option<String>,
    /// Event tags (series: own tags); repeated or comma-separated.
    #[param(style = Form, explode)]
    tags: Option<Vec<String>>,
    #[param(inline)]
    tags_match: Option<TagsMatchParam>,
    #[param(inline)]
    sort: Option<SortParam>,
    #[param(inline)]
    order: Option<OrderParam>,
}

/// Extra filters of `/v1/events`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct EventFilterParams {
    series_id: Option<String>,
    series_slug: Option<String>,
}

/// Extra filters of `/v1/markets`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct MarketFilterParams {
    event_id: Option<String>,
    event_slug: Option<String>,
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

#[derive(Debug, Clone)]
pub struct ListQuery {
    /// Lowercased.
    pub search: Option<String>,
    pub limit: usize,
    raw_cursor: Option<String>,
    pub start_date: DateRange,
    pub end_date: DateRange,
    pub tags: Vec<String>,
    pub tags_all: bool,
    pub sort: SortField,
    pub order: SortOrder,
    pub series_id: Option<String>,
    pub series_slug: Option<String>,
    pub event_id: Option<String>,
    pub event_slug: Option<String>,
}

impl ListQuery {
    /// The cursor scope: list name, sort field and order.
    pub fn scope(&self, list: &str) -> String {
        let order = match self.order {
            SortOrder::Asc => "asc",
            SortOrder::Desc => "desc",
        };
        format!("{list}:{}:{order}", self.sort.as_str())
    }

    /// The position to resume after; 400 for a cursor of another list.
    pub fn cursor(&self, list: &str) -> Result<Option<ListCursor>, ApiError> {
        match &self.raw_cursor {
            None => Ok(None),
            Some(c) => cursor::decode_list(&self.scope(list), c)
                .map(Some)
                .ok_or_else(ApiError::invalid_cursor),
        }
    }

    /// Tag filter: any (OR) or all (AND) of the requested tags.
    pub fn keeps_tags(&self, tags: &[String]) -> bool {
        if self.tags.is_empty() {
            return true;
        }
        let has = |t: &String| tags.contains(t);
        if self.tags_all {
            self.tags.iter().all(has)
        } else {
            self.tags.iter().any(has)
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ListQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let q = Pairs::from_parts(parts, state).await?;
        let mut errors = Vec::new();
        let search = q
            .get("search")
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        if search
            .as_ref()
            .is_some_and(|s| s.chars().count() > SEARCH_MAX)
        {
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
        let tags_all = enum_value(
            q.get("tags_match"),
            "tags_match",
            false,
            &["any", "all"],
            |v| match v {
                "any" => Some(false),
                "all" => Some(true),
                _ => None,
            },
            &mut errors,
        );
        let sorts: Vec<&str> = SortField::ALL.iter().map(|f| f.as_str()).collect();
        let sort = enum_value(
            q.get("sort"),
            "sort",
            SortField::UpdatedAt,
            &sorts,
            SortField::parse,
            &mut errors,
        );
        let order = enum_value(
            q.get("order"),
            "order",
            SortOrder::Desc,
            &["asc", "desc"],
            |v| match v {
                "asc" => Some(SortOrder::Asc),
                "desc" => Some(SortOrder::Desc),
                _ => None,
            },
            &mut errors,
        );
        for name in ["series_id", "series_slug", "event_id", "event_slug"] {
            if q.get(name).is_some_and(|v| v.chars().count() > MAX_ID_LEN) {
                errors.push(issue(
                    "query",
                    name,
                    format!("String should have at most {MAX_ID_LEN} characters"),
                    "string_too_long",
                ));
            }
        }
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        let date = |name: &str| -> Result<Option<Timestamp>, ApiError> {
            q.get(name)
                .filter(|v| !v.is_empty())
                .map(|v| {
                    Timestamp::parse(v)
                        .map_err(|e| ApiError::BadRequest(format!("Invalid {name}: {e}.")))
                })
                .transpose()
        };
        let start_date = DateRange {
            min: date("start_date_min")?,
            max: date("start_date_max")?,
        };
        let end_date = DateRange {
            min: date("end_date_min")?,
            max: date("end_date_max")?,
        };
        for (range, field) in [(&start_date, "start_date"), (&end_date, "end_date")] {
            if let (Some(min), Some(max)) = (range.min, range.max) {
                if min > max {
                    return Err(ApiError::BadRequest(format!(
                        "{field}_min must be <= {field}_max"
                    )));
                }
            }
        }
        let owned = |name: &str| q.get(name).filter(|v| !v.is_empty()).map(str::to_string);
        Ok(ListQuery {
            search: search.map(|s| s.to_lowercase()),
            limit,
            raw_cursor: owned("cursor"),
            start_date,
            end_date,
            tags: q.all("tags"),
            tags_all,
            sort,
            order,
            series_id: owned("series_id"),
            series_slug: owned("series_slug"),
            event_id: owned("event_id"),
            event_slug: owned("event_slug"),
        })
    }
}
