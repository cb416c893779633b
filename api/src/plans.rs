//! Plans: what a key may query (docs/SPEC.md §8), from configuration.
//!
//! Defaults: `free` (60 req/min, finest 1h, 30 days, metrics and prices),
//! `pro` (600 req/min, finest 1m, 365 days, everything but ticks),
//! `enterprise` (unlimited rate, finest `tick`, 100 years, history before
//! coverage). `tick` (every tick as ingested) is finer than `1m`, so only a
//! plan whose finest is `tick` reads tick-level prices and books. Trades
//! are a data point of their own (`pro` and `enterprise`). A JSON file
//! (`--plans-file`) adds plans or replaces these by name.

use crate::error::ApiError;
use hindsight_schemas::{Granularity, Resolution, Timestamp};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

/// Standard coverage starts 2025-08-01T00:00:00Z; earlier history only on
/// plans with `before_coverage`.
pub const COVERAGE_START: Timestamp = Timestamp(1_754_006_400_000);

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub name: String,
    /// `None`: unlimited.
    pub requests_per_minute: Option<u32>,
    /// Finest granularity allowed (`tick` or a resolution).
    pub finest: Granularity,
    /// Rolling lookback window.
    pub max_history_days: u32,
    pub metrics: bool,
    pub prices: bool,
    pub books: bool,
    pub trades: bool,
    /// History before [`COVERAGE_START`].
    pub before_coverage: bool,
}

/// A history data point a plan may or may not allow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DataPoint {
    Metrics,
    Prices,
    Books,
    Trades,
}

impl DataPoint {
    fn noun(self) -> &'static str {
        match self {
            DataPoint::Metrics => "historical metrics",
            DataPoint::Prices => "historical prices",
            DataPoint::Books => "historical order books",
            DataPoint::Trades => "historical trades",
        }
    }
}

impl Plan {
    /// Refuses (403) what the plan does not allow for a history query.
    pub fn check_history(
        &self,
        point: DataPoint,
        res: Granularity,
        start: Timestamp,
        now: Timestamp,
    ) -> Result<(), ApiError> {
        self.check_point(point)?;
        if res.width_ms() < self.finest.width_ms() {
            return Err(ApiError::Forbidden {
                reason: "resolution",
                detail: format!(
                    "Your plan does not allow resolution {res}; the finest allowed is {}.",
                    self.finest
                ),
            });
        }
        self.check_since(start, now)
    }

    /// Refuses (403) a data point the plan does not include.
    pub fn check_point(&self, point: DataPoint) -> Result<(), ApiError> {
        let allowed = match point {
            DataPoint::Metrics => self.metrics,
            DataPoint::Prices => self.prices,
            DataPoint::Books => self.books,
            DataPoint::Trades => self.trades,
        };
        if allowed {
            return Ok(());
        }
        Err(ApiError::Forbidden {
            reason: "data_point",
            detail: format!("Your plan does not allow {}.", point.noun()),
        })
    }

    /// The earliest instant the plan lets a query read at `now`: its
    /// lookback, and the coverage start unless it has earlier history.
    pub fn earliest(&self, now: Timestamp) -> Timestamp {
        let lookback = Timestamp(now.0 - self.max_history_days as i64 * 86_400_000);
        if self.before_coverage {
            lookback
        } else {
            lookback.max(COVERAGE_START)
        }
    }

    /// Refuses (403) a query reaching back to `start` past the coverage
    /// start (without `before_coverage`) or the plan's lookback.
    pub fn check_since(&self, start: Timestamp, now: Timestamp) -> Result<(), ApiError> {
        if start < COVERAGE_START && !self.before_coverage {
            return Err(ApiError::Forbidden {
                reason: "coverage",
                detail: "History before 2025-08-01 is available on enterprise plans only.".into(),
            });
        }
        let earliest = Timestamp(now.0 - self.max_history_days as i64 * 86_400_000);
        if start < earliest {
            return Err(ApiError::Forbidden {
                reason: "lookback",
                detail: format!(
                    "start_ts is beyond your plan's lookback of {} days.",
                    self.max_history_days
                ),
            });
        }
        Ok(())
    }
}

/// A plan as written in the plans file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanConfig {
    /// Omit or null for unlimited.
    requests_per_minute: Option<u32>,
    granularity_allowed: String,
    max_history_days: u32,
    metrics: bool,
    prices: bool,
    books: bool,
    /// Absent in files written before trades existed: no trades.
    #[serde(default)]
    trades: bool,
    #[serde(default)]
    before_coverage: bool,
}

#[derive(Debug, Clone)]
pub struct Plans(HashMap<String, Plan>);

impl Default for Plans {
    fn default() -> Self {
        let plan = |name: &str, rpm, finest, days, books, before| Plan {
            name: name.into(),
            requests_per_minute: rpm,
            finest,
            max_history_days: days,
            metrics: true,
            prices: true,
            books,
            trades: books,
            before_coverage: before,
        };
        Plans(HashMap::from([
            (
                "free".into(),
                plan(
                    "free",
                    Some(60),
                    Granularity::Bucket(Resolution::H1),
                    30,
                    false,
                    false,
                ),
            ),
            (
                "pro".into(),
                plan(
                    "pro",
                    Some(600),
                    Granularity::Bucket(Resolution::M1),
                    365,
                    true,
                    false,
                ),
            ),
            (
                "enterprise".into(),
                plan("enterprise", None, Granularity::Tick, 36_500, true, true),
            ),
        ]))
    }
}

impl Plans {
    pub fn get(&self, name: &str) -> Option<&Plan> {
        self.0.get(name)
    }

    /// The defaults, with the plans of a JSON file (`{"name": {…}}`) added
    /// or replacing defaults of the same name.
    pub fn load(path: Option<&Path>) -> Result<Plans, String> {
        let mut plans = Plans::default();
        let Some(path) = path else { return Ok(plans) };
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file: HashMap<String, PlanConfig> =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        for (name, c) in file {
            let finest = Granularity::parse(&c.granularity_allowed).ok_or_else(|| {
                format!(
                    "{}: plan {name}: granularity_allowed must be one of {}",
                    path.display(),
                    Granularity::allowed_list()
                )
            })?;
            plans.0.insert(
                name.clone(),
                Plan {
                    name,
                    requests_per_minute: c.requests_per_minute,
                    finest,
                    max_history_days: c.max_history_days,
                    metrics: c.metrics,
                    prices: c.prices,
                    books: c.books,
                    trades: c.trades,
                    before_coverage: c.before_coverage,
                },
            );
        }
        Ok(plans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plans_file_adds_and_replaces_plans() {
        let path = std::env::temp_dir().join(format!("plans-{}.json", std::process::id()));
        std::fs::write(
            &path,
            r#"{"free": {"requests_per_minute": 5, "granularity_allowed": "1d", "max_history_days": 7,
                         "metrics": true, "prices": false, "books": false},
                "research": {"granularity_allowed": "10m", "max_history_days": 90,
                             "metrics": true, "prices": true, "books": true}}"#,
        )
        .unwrap();
        let plans = Plans::load(Some(&path)).unwrap();
        assert_eq!(plans.get("free").unwrap().requests_per_minute, Some(5));
        assert!(!plans.get("free").unwrap().prices);
        assert_eq!(plans.get("research").unwrap().requests_per_minute, None);
        assert_eq!(
            plans.get("research").unwrap().finest,
            Granularity::Bucket(Resolution::M10)
        );
        assert!(
            !plans.get("research").unwrap().trades,
            "trades default to off"
        );
        assert!(plans.get("pro").is_some());
        std::fs::write(&path, r#"{"x": {"granularity_allowed": "2h", "max_history_days": 1, "metrics": true, "prices": true, "books": true}}"#).unwrap();
        assert!(Plans::load(Some(&path))
            .unwrap_err()
            .contains("granularity_allowed"));
    }
}
