//! UTC timestamps as milliseconds since the Unix epoch.
//!
//! Pipelines send `ts` either as ISO 8601 text or as Unix seconds (integer or
//! fractional); the API accepts the same for `start_ts`/`end_ts`. Everything
//! inside Hindsight is an `i64` of milliseconds: cheap to compare, exact to
//! bucket, and the precision the ingest format promises.

use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, Utc};

/// Milliseconds since 1970-01-01T00:00:00Z.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode,
)]
pub struct Timestamp(pub i64);

/// Earliest accepted instant (2000-01-01): older values are almost always a
/// unit mistake (milliseconds sent as seconds, or a zero default).
pub const MIN_MS: i64 = 946_684_800_000;
/// Latest accepted instant (2100-01-01).
pub const MAX_MS: i64 = 4_102_444_800_000;

impl Timestamp {
    pub fn now() -> Self {
        Timestamp(Utc::now().timestamp_millis())
    }

    pub fn from_secs(secs: i64) -> Self {
        Timestamp(secs * 1000)
    }

    pub fn millis(self) -> i64 {
        self.0
    }

    /// Parses ISO 8601 (`2025-09-01T00:00:30Z`, with offset, without zone as
    /// UTC, or a bare date) or Unix seconds (`1756684830`, `1756684830.25`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("empty timestamp".into());
        }
        if let Ok(secs) = text.parse::<f64>() {
            return Self::from_unix_seconds(secs);
        }
        parse_iso(text)
            .map(|dt| Timestamp(dt.timestamp_millis()))
            .ok_or_else(|| format!("`{text}` is neither ISO 8601 nor Unix seconds"))
            .and_then(Self::checked)
    }

    /// Unix seconds with a fractional part; millisecond precision is kept.
    pub fn from_unix_seconds(secs: f64) -> Result<Self, String> {
        if !secs.is_finite() {
            return Err("timestamp is not a finite number".into());
        }
        Self::checked(Timestamp(crate::num::round(secs * 1000.0)))
    }

    fn checked(self) -> Result<Self, String> {
        if (MIN_MS..MAX_MS).contains(&self.0) {
            Ok(self)
        } else {
            Err(format!(
                "timestamp {} is outside 2000-01-01..2100-01-01 (Unix seconds expected, not milliseconds)",
                self.to_rfc3339()
            ))
        }
    }

    /// ISO 8601 in UTC with a `Z`; milliseconds shown only when non-zero.
    pub fn to_rfc3339(self) -> String {
        match DateTime::<Utc>::from_timestamp_millis(self.0) {
            Some(dt) if self.0 % 1000 == 0 => dt.to_rfc3339_opts(SecondsFormat::Secs, true),
            Some(dt) => dt.to_rfc3339_opts(SecondsFormat::Millis, true),
            None => self.0.to_string(),
        }
    }
}

/// Where "now" comes from, for the rules that depend on it: the API's
/// rate-limit windows and plan lookback. Services hold an `Arc<dyn Clock>`
/// so tests can pin and move time instead of sleeping across a window.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The wall clock, for every deployment.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that stands still until told to move: tests set it to an
/// instant of their choosing and advance it past window boundaries.
#[derive(Debug)]
pub struct ManualClock(std::sync::atomic::AtomicI64);

impl ManualClock {
    pub fn new(at: Timestamp) -> Self {
        ManualClock(std::sync::atomic::AtomicI64::new(at.0))
    }

    pub fn set(&self, at: Timestamp) {
        self.0.store(at.0, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn advance(&self, by: std::time::Duration) {
        self.0
            .fetch_add(by.as_millis() as i64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// A timestamp that serializes as ISO 8601 UTC text (`2025-09-01T00:00:00Z`,
/// with `.mmm` when it has milliseconds) without allocating: history pages
/// write hundreds of them per response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct IsoTime(pub Timestamp);

impl serde::Serialize for IsoTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 24];
        match self.0.write_iso(&mut buf) {
            Some(text) => s.serialize_str(text),
            None => s.serialize_str(&self.0.to_rfc3339()),
        }
    }
}

impl Timestamp {
    /// ISO 8601 for years 0000..=9999 into `buf`, as [`Timestamp::to_rfc3339`]
    /// writes it; `None` outside that range.
    pub fn write_iso(self, buf: &mut [u8; 24]) -> Option<&str> {
        let text = IsoWriter::default().write(self, buf)?;
        Some(std::str::from_utf8(text).expect("ISO 8601 text is ASCII"))
    }
}

/// Writes timestamps as [`Timestamp::write_iso`] does, keeping the date of
/// the last one: the points of a history page mostly share their day, and
/// the civil date is most of the work (a 200-point page's timestamps were
/// ~7 % of a cache-missed page's CPU with the date worked out for each).
#[derive(Debug, Clone, Copy, Default)]
pub struct IsoWriter {
    /// The last day written (days since 1970-01-01) and its `YYYY-MM-DD`.
    last: Option<(i64, [u8; 10])>,
}

impl IsoWriter {
    /// `t` in ISO 8601 into `buf`, as ASCII bytes (digits, `-`, `:`, `.`,
    /// `T` and `Z`): a page copies them into its body as they are, where a
    /// `&str` cost a UTF-8 check per point (~4 % of a cache-missed page's
    /// instructions). `None` outside the years 0000..=9999.
    pub fn write<'b>(&mut self, t: Timestamp, buf: &'b mut [u8; 24]) -> Option<&'b [u8]> {
        let (secs, ms) = (t.0.div_euclid(1000), t.0.rem_euclid(1000));
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let date = match self.last {
            Some((day, date)) if day == days => date,
            _ => {
                let date = civil_date(days)?;
                self.last = Some((days, date));
                date
            }
        };
        // Within a day, so in `u32`; each field by its two digits.
        let (rem, ms) = (rem as u32, ms as u32);
        buf[..10].copy_from_slice(&date);
        buf[10] = b'T';
        buf[11..13].copy_from_slice(two_digits(rem / 3600));
        buf[13] = b':';
        buf[14..16].copy_from_slice(two_digits(rem / 60 % 60));
        buf[16] = b':';
        buf[17..19].copy_from_slice(two_digits(rem % 60));
        let len = if ms == 0 {
            buf[19] = b'Z';
            20
        } else {
            buf[19] = b'.';
            buf[20] = b'0' + (ms / 100) as u8;
            buf[21..23].copy_from_slice(two_digits(ms % 100));
            buf[23] = b'Z';
            24
        };
        Some(&buf[..len])
    }
}

/// `YYYY-MM-DD` of the day `days` after 1970-01-01 (Howard Hinnant's
/// civil-from-days); `None` outside the years 0000..=9999.
fn civil_date(days: i64) -> Option<[u8; 10]> {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(0..=9999).contains(&year) {
        return None;
    }
    let mut date = [b'-'; 10];
    put_digits(&mut date, 0, year, 4);
    put_digits(&mut date, 5, month, 2);
    put_digits(&mut date, 8, day, 2);
    Some(date)
}

/// `n` (below 100) in two decimal digits, from a table: dividing by ten
/// digit by digit was over a third of a timestamp's instructions.
fn two_digits(n: u32) -> &'static [u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let at = 2 * n as usize;
    &PAIRS[at..at + 2]
}

/// `value` in `width` decimal digits at `buf[at..]`.
fn put_digits(buf: &mut [u8], at: usize, value: i64, width: usize) {
    let mut v = value;
    for i in (0..width).rev() {
        buf[at + i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

fn parse_iso(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(dt) = DateTime::parse_from_rfc3339(text) {
        return Some(dt.with_timezone(&Utc));
    }
    // RFC 3339 with a space instead of `T`, and zone-less forms, are common in
    // pipeline output; a missing zone means UTC (SPEC §1: all timestamps UTC).
    let with_t = text.replacen(' ', "T", 1);
    if let Ok(dt) = DateTime::parse_from_rfc3339(&with_t) {
        return Some(dt.with_timezone(&Utc));
    }
    for fmt in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M"] {
        if let Ok(naive) = NaiveDateTime::parse_from_str(&with_t, fmt) {
            return Some(naive.and_utc());
        }
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|n| n.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_accepted_form_to_the_same_instant() {
        let want = Timestamp(1_756_684_830_000); // 2025-09-01T00:00:30Z
        for text in [
            "2025-09-01T00:00:30Z",
            "2025-09-01T00:00:30.000Z",
            "2025-09-01T02:00:30+02:00",
            "2025-09-01 00:00:30Z",
            "2025-09-01T00:00:30",
            "1756684830",
            "1756684830.0",
        ] {
            assert_eq!(Timestamp::parse(text), Ok(want), "{text}");
        }
        assert_eq!(
            Timestamp::parse("2025-09-01"),
            Ok(Timestamp(1_756_684_800_000))
        );
    }

    #[test]
    fn keeps_milliseconds_and_prints_utc() {
        let ts = Timestamp::parse("1756684830.123").unwrap();
        assert_eq!(ts, Timestamp(1_756_684_830_123));
        assert_eq!(ts.to_rfc3339(), "2025-09-01T00:00:30.123Z");
        assert_eq!(
            Timestamp(1_756_684_800_000).to_rfc3339(),
            "2025-09-01T00:00:00Z"
        );
    }

    /// A timestamp alone (as `IsoTime` writes one), then a page from it
    /// through one writer that keeps the date: points a minute or a second
    /// and a half apart, within a day, across midnight and after a jump to
    /// the next page's far-off day, each as chrono prints it.
    #[test]
    fn iso_text_matches_chrono() {
        let mut iso = IsoWriter::default();
        let mut x: u64 = 1;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let ms = (x >> 20) as i64 % 8_000_000_000_000 - 1_000_000_000_000;
            let start = Timestamp(if x & 1 == 0 { ms / 1000 * 1000 } else { ms });
            let mut buf = [0u8; 24];
            assert_eq!(
                start.write_iso(&mut buf).unwrap(),
                start.to_rfc3339(),
                "{}",
                start.0
            );
            let step = if x & 2 == 0 { 60_000 } else { 1_500 };
            for i in 0..20 {
                let t = Timestamp(start.0 + i * step);
                let text = iso.write(t, &mut buf).unwrap();
                assert_eq!(text, t.to_rfc3339().as_bytes(), "{}", t.0);
            }
        }
        let mut buf = [0u8; 24];
        assert_eq!(
            iso.write(Timestamp(253_402_300_800_000), &mut buf),
            None,
            "year 10000"
        );
    }

    #[test]
    fn refuses_garbage_and_milliseconds_sent_as_seconds() {
        assert!(Timestamp::parse("yesterday").is_err());
        assert!(Timestamp::parse("").is_err());
        assert!(Timestamp::parse("2025-13-01T00:00:00Z").is_err());
        let err = Timestamp::parse("1756684830000").unwrap_err();
        assert!(err.contains("outside"), "{err}");
    }
}
