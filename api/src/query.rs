//! History query parameters (SPEC.md §4.5), validated in an extractor so
//! handlers receive only well-formed ranges.
//!
//! Schema failures (missing, wrong type, bad enum) are 422 in FastAPI's
//! shape; bad timestamps, ranges, limits above 200 and cursors are 400.

use crate::cursor;
use crate::error::{ApiError, FieldError};
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use hindsight_schemas::{Resolution, Timestamp};
use hindsight_store::read::Range;

pub const HISTORY_LIMIT_DEFAULT: usize = 100;
pub const HISTORY_LIMIT_MAX: usize = 200;

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
    /// The store range for this page, one more than `limit` so the handler
    /// can tell whether another page follows.
    pub fn page_range(&self) -> Range {
        Range {
            res: self.resolution,
            start: self.from,
            end: self.end,
            limit: self.limit + 1,
        }
    }

    /// Cuts a page read with [`page_range`](Self::page_range) to `limit`
    /// and returns the cursor of the next page, if any.
    pub fn paginate<T>(&self, rows: &mut Vec<T>, t: impl Fn(&T) -> Timestamp) -> Option<String> {
        if rows.len() <= self.limit {
            return None;
        }
        rows.truncate(self.limit);
        rows.last()
            .map(|last| cursor::encode(Timestamp(t(last).0 + 1)))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for HistoryQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("Malformed query string: {e}")))?;
        let get = |name: &str| {
            pairs
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };

        let mut errors = Vec::new();
        let missing = |name: &str| FieldError::query(name, "Field required", "missing");
        let start_raw = get("start_ts");
        let end_raw = get("end_ts");
        if start_raw.is_none() {
            errors.push(missing("start_ts"));
        }
        if end_raw.is_none() {
            errors.push(missing("end_ts"));
        }
        let resolution = match get("resolution") {
            None => {
                errors.push(missing("resolution"));
                None
            }
            Some(r) => Resolution::parse(r).or_else(|| {
                errors.push(FieldError::query(
                    "resolution",
                    format!("Input should be {}", or_list()),
                    "enum",
                ));
                None
            }),
        };
        let limit = match get("limit") {
            None => Some(HISTORY_LIMIT_DEFAULT as i64),
            Some(text) => match text.trim().parse::<i64>() {
                Ok(n) if n < 1 => {
                    errors.push(FieldError::query(
                        "limit",
                        "Input should be greater than or equal to 1",
                        "greater_than_equal",
                    ));
                    None
                }
                Ok(n) => Some(n),
                Err(_) => {
                    errors.push(FieldError::query(
                        "limit",
                        "Input should be a valid integer, unable to parse string as an integer",
                        "int_parsing",
                    ));
                    None
                }
            },
        };
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        let (resolution, limit) = (resolution.unwrap(), limit.unwrap());
        if limit as usize > HISTORY_LIMIT_MAX {
            return Err(ApiError::BadRequest(format!(
                "Requested limit {limit} exceeds the maximum of {HISTORY_LIMIT_MAX}."
            )));
        }
        let ts = |name: &str, raw: &str| {
            Timestamp::parse(raw).map_err(|e| ApiError::BadRequest(format!("Invalid {name}: {e}.")))
        };
        let start = ts("start_ts", start_raw.unwrap())?;
        let end = ts("end_ts", end_raw.unwrap())?;
        if start > end {
            return Err(ApiError::BadRequest("start_ts must be <= end_ts".into()));
        }
        let from = match get("cursor").filter(|c| !c.is_empty()) {
            None => start,
            Some(c) => match cursor::decode(c) {
                Some(t) if t >= start && t <= end => t,
                _ => return Err(ApiError::BadRequest("Invalid pagination cursor".into())),
            },
        };
        Ok(HistoryQuery {
            start,
            end,
            resolution,
            limit: limit as usize,
            from,
        })
    }
}

/// `'1m', '5m', …, '6h' or '1d'` as pydantic words enum errors.
fn or_list() -> String {
    let names: Vec<String> = Resolution::ALL
        .iter()
        .map(|r| format!("'{}'", r.as_str()))
        .collect();
    let (last, rest) = names.split_last().expect("resolutions exist");
    format!("{} or {last}", rest.join(", "))
}
