//! Resolutions and bucket math.
//!
//! A bucket of width `w` starts at `floor(ts / w) * w` in UTC, so `1d` buckets
//! start at 00:00 and `6h` buckets at 00/06/12/18. Every resolution divides
//! the day, so a bucket never straddles a day boundary.

use crate::time::Timestamp;

/// Aggregation bucket widths. SPEC's set is `1m`,`10m`,`1h`,`6h`,`1d`; `5m`
/// and `15m` are built too because the official client names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resolution {
    M1,
    M5,
    M10,
    M15,
    H1,
    H6,
    D1,
}

impl Resolution {
    /// Every resolution the projector builds, finest first.
    pub const ALL: [Resolution; 7] = [
        Resolution::M1,
        Resolution::M5,
        Resolution::M10,
        Resolution::M15,
        Resolution::H1,
        Resolution::H6,
        Resolution::D1,
    ];

    pub const fn width_ms(self) -> i64 {
        const MIN: i64 = 60_000;
        match self {
            Resolution::M1 => MIN,
            Resolution::M5 => 5 * MIN,
            Resolution::M10 => 10 * MIN,
            Resolution::M15 => 15 * MIN,
            Resolution::H1 => 60 * MIN,
            Resolution::H6 => 360 * MIN,
            Resolution::D1 => 1440 * MIN,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Resolution::M1 => "1m",
            Resolution::M5 => "5m",
            Resolution::M10 => "10m",
            Resolution::M15 => "15m",
            Resolution::H1 => "1h",
            Resolution::H6 => "6h",
            Resolution::D1 => "1d",
        }
    }

    /// Position in [`Resolution::ALL`]; a dense index for per-resolution arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Start of the bucket holding `ts` (floor division, also before 1970).
    #[inline]
    pub fn bucket_start(self, ts: Timestamp) -> Timestamp {
        let w = self.width_ms();
        Timestamp(ts.0.div_euclid(w) * w)
    }

    pub fn parse(text: &str) -> Option<Resolution> {
        Resolution::ALL.into_iter().find(|r| r.as_str() == text)
    }

    /// `'1m', '5m', …` for error messages that list the allowed values.
    pub fn allowed_list() -> String {
        Resolution::ALL
            .iter()
            .map(|r| format!("'{}'", r.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The `resolution` query parameter's schema in the OpenAPI document,
/// from [`Resolution::ALL`] so the documented values are the parsed ones.
impl utoipa::PartialSchema for Resolution {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("Aggregation bucket size."))
            .enum_values(Some(Resolution::ALL.map(Resolution::as_str)))
            .into()
    }
}

impl utoipa::ToSchema for Resolution {}

/// What a history query asks for: every tick as ingested, or the buckets
/// of a resolution. `tick` is finer than every resolution (plans gate it
/// as the finest granularity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Granularity {
    Tick,
    Bucket(Resolution),
}

impl Granularity {
    /// Every granularity, finest first.
    pub const ALL: [Granularity; 8] = [
        Granularity::Tick,
        Granularity::Bucket(Resolution::M1),
        Granularity::Bucket(Resolution::M5),
        Granularity::Bucket(Resolution::M10),
        Granularity::Bucket(Resolution::M15),
        Granularity::Bucket(Resolution::H1),
        Granularity::Bucket(Resolution::H6),
        Granularity::Bucket(Resolution::D1),
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Granularity::Tick => "tick",
            Granularity::Bucket(r) => r.as_str(),
        }
    }

    /// Width of one point: 0 for ticks, finer than any bucket.
    pub const fn width_ms(self) -> i64 {
        match self {
            Granularity::Tick => 0,
            Granularity::Bucket(r) => r.width_ms(),
        }
    }

    pub fn parse(text: &str) -> Option<Granularity> {
        Granularity::ALL.into_iter().find(|g| g.as_str() == text)
    }

    /// `'tick', '1m', …` for error messages that list the allowed values.
    pub fn allowed_list() -> String {
        Granularity::ALL
            .iter()
            .map(|g| format!("'{}'", g.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The `resolution` query parameter's schema: every resolution, and `tick`
/// (on the token prices and books routes).
impl utoipa::PartialSchema for Granularity {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "Aggregation bucket size, or `tick` for every tick as ingested (token prices and books routes only).",
            ))
            .enum_values(Some(Granularity::ALL.map(Granularity::as_str)))
            .into()
    }
}

impl utoipa::ToSchema for Granularity {}

impl std::fmt::Display for Granularity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        Timestamp::parse(s).unwrap()
    }

    #[test]
    fn buckets_start_on_utc_boundaries() {
        let t = ts("2025-09-01T17:59:59.999Z");
        assert_eq!(Resolution::M1.bucket_start(t), ts("2025-09-01T17:59:00Z"));
        assert_eq!(Resolution::M5.bucket_start(t), ts("2025-09-01T17:55:00Z"));
        assert_eq!(Resolution::M10.bucket_start(t), ts("2025-09-01T17:50:00Z"));
        assert_eq!(Resolution::M15.bucket_start(t), ts("2025-09-01T17:45:00Z"));
        assert_eq!(Resolution::H1.bucket_start(t), ts("2025-09-01T17:00:00Z"));
        assert_eq!(Resolution::H6.bucket_start(t), ts("2025-09-01T12:00:00Z"));
        assert_eq!(Resolution::D1.bucket_start(t), ts("2025-09-01T00:00:00Z"));
        // Exactly on a boundary is the start of the new bucket.
        let edge = ts("2025-09-01T18:00:00Z");
        assert_eq!(Resolution::H6.bucket_start(edge), edge);
        assert_eq!(
            Resolution::D1.bucket_start(ts("2025-09-02T00:00:00Z")),
            ts("2025-09-02T00:00:00Z")
        );
    }

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for r in Resolution::ALL {
            assert_eq!(Resolution::parse(r.as_str()), Some(r));
            assert_eq!(Resolution::ALL[r.index()], r);
        }
        assert_eq!(Resolution::parse("2h"), None);
        assert_eq!(Resolution::D1.width_ms() % Resolution::H6.width_ms(), 0);
    }
}
