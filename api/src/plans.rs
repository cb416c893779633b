//! Plans: what a key may query (SPEC.md §8).

use crate::error::ApiError;
use hindsight_schemas::{Resolution, Timestamp};
use std::collections::HashMap;

/// Standard coverage starts 2025-08-01T00:00:00Z; earlier history only on
/// plans with `before_coverage`.
pub const COVERAGE_START: Timestamp = Timestamp(1_754_006_400_000);

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub name: String,
    /// `None`: unlimited.
    pub requests_per_minute: Option<u32>,
    /// Finest resolution allowed.
    pub finest: Resolution,
    /// Rolling lookback window.
    pub max_history_days: u32,
    pub metrics: bool,
    pub prices: bool,
    pub books: bool,
    /// History before [`COVERAGE_START`].
    pub before_coverage: bool,
}

/// A history data point a plan may or may not allow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DataPoint {
    Metrics,
    Prices,
    Books,
}

impl DataPoint {
    fn noun(self) -> &'static str {
        match self {
            DataPoint::Metrics => "historical metrics",
            DataPoint::Prices => "historical prices",
            DataPoint::Books => "historical order books",
        }
    }
}

impl Plan {
    /// Refuses (403) what the plan does not allow for a history query.
    pub fn check_history(
        &self,
        point: DataPoint,
        res: Resolution,
        start: Timestamp,
        now: Timestamp,
    ) -> Result<(), ApiError> {
        let allowed = match point {
            DataPoint::Metrics => self.metrics,
            DataPoint::Prices => self.prices,
            DataPoint::Books => self.books,
        };
        if !allowed {
            return Err(ApiError::Forbidden(format!(
                "Your plan does not allow {}.",
                point.noun()
            )));
        }
        if res.width_ms() < self.finest.width_ms() {
            return Err(ApiError::Forbidden(format!(
                "Your plan does not allow resolution {res}; the finest allowed is {}.",
                self.finest
            )));
        }
        if start < COVERAGE_START && !self.before_coverage {
            return Err(ApiError::Forbidden(
                "History before 2025-08-01 is available on enterprise plans only.".into(),
            ));
        }
        let earliest = Timestamp(now.0 - self.max_history_days as i64 * 86_400_000);
        if start < earliest {
            return Err(ApiError::Forbidden(format!(
                "start_ts is beyond your plan's lookback of {} days.",
                self.max_history_days
            )));
        }
        Ok(())
    }
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
            before_coverage: before,
        };
        Plans(HashMap::from([
            (
                "free".into(),
                plan("free", Some(60), Resolution::H1, 30, false, false),
            ),
            (
                "pro".into(),
                plan("pro", Some(600), Resolution::M1, 365, true, false),
            ),
            (
                "enterprise".into(),
                plan("enterprise", None, Resolution::M1, u32::MAX, true, true),
            ),
        ]))
    }
}

impl Plans {
    pub fn get(&self, name: &str) -> Option<&Plan> {
        self.0.get(name)
    }
}
