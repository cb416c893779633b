//! Where a caller stands in its sliding rate window, and the headers that
//! tell it.
//!
//! The window is the contract's ([`hindsight_contracts::AuthStore`]): a
//! request is counted against every hit within one window of it, so no
//! interval of [`RATE_WINDOW_MS`] ever holds more than the plan's
//! requests per minute. What a caller is told follows from the hits counted:
//! `Remaining` is the limit less those hits, `Reset` the moment all of them
//! have left the window (the full allowance is back), `Retry-After` (on a
//! 429) the moment enough have left for one more request.
//!
//! A leaf module: [`crate::error`] needs it for 429s and [`crate::auth`]
//! computes it, so it depends on neither.

use axum::http::HeaderValue;
use axum::response::Response;
use hindsight_contracts::auth::RATE_WINDOW_MS;
use hindsight_schemas::Timestamp;

/// Where a caller of a limited plan stands (after this request, when it was
/// counted).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateState {
    pub limit: u32,
    /// Requests counted in the window.
    pub used: u64,
    /// Unix seconds when every counted request has left the window.
    pub reset_at: i64,
    /// Seconds until one more request fits (at least 1).
    pub retry_after: u64,
}

/// Whole seconds from `now` until `at`, rounded up.
fn secs_until(now: Timestamp, at: i64) -> i64 {
    (at - now.millis() + 999).div_euclid(1000)
}

impl RateState {
    /// From the hits counted at `now` (ascending), as the store returned them.
    pub fn of(limit: u32, hits: &[Timestamp], now: Timestamp) -> Self {
        let leaves = |hit: &Timestamp| hit.millis() + RATE_WINDOW_MS;
        let reset_ms = hits.last().map_or(now.millis(), leaves);
        // With `used >= limit`, one more fits once the oldest `used - limit
        // + 1` hits have left. Fewer (a hit refused in a race at the limit)
        // is room already.
        let next_free = hits
            .len()
            .checked_sub(limit as usize)
            .map_or(now.millis(), |i| leaves(&hits[i]));
        RateState {
            limit,
            used: hits.len() as u64,
            reset_at: reset_ms.div_euclid(1000) + i64::from(reset_ms.rem_euclid(1000) != 0),
            retry_after: secs_until(now, next_free).max(1) as u64,
        }
    }

    pub fn remaining(&self) -> u64 {
        u64::from(self.limit).saturating_sub(self.used)
    }
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Unix seconds).
pub fn rate_headers(response: &mut Response, rate: &RateState) {
    let h = response.headers_mut();
    h.insert("x-ratelimit-limit", HeaderValue::from(rate.limit));
    h.insert("x-ratelimit-remaining", HeaderValue::from(rate.remaining()));
    h.insert("x-ratelimit-reset", HeaderValue::from(rate.reset_at));
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_761_955_210_000;

    fn at(offsets_ms: &[i64]) -> Vec<Timestamp> {
        offsets_ms.iter().map(|o| Timestamp(NOW + o)).collect()
    }

    #[test]
    fn an_empty_window_has_the_full_allowance_now() {
        let r = RateState::of(5, &[], Timestamp(NOW));
        assert_eq!((r.used, r.remaining(), r.reset_at), (0, 5, NOW / 1000));
    }

    #[test]
    fn reset_is_when_the_newest_hit_leaves_and_retry_when_the_oldest_needed_does() {
        // Hits 50 s, 30 s and 0.5 s ago; a limit of 3 is reached.
        let hits = at(&[-50_000, -30_000, -500]);
        let r = RateState::of(3, &hits, Timestamp(NOW));
        assert_eq!((r.used, r.remaining()), (3, 0));
        assert_eq!(
            r.reset_at,
            (NOW + 59_500 + 999) / 1000,
            "the newest leaves in 59.5 s"
        );
        assert_eq!(r.retry_after, 10, "the oldest leaves in 10 s");
        // A limit of 2 with the same three hits: the two oldest must leave.
        assert_eq!(RateState::of(2, &hits, Timestamp(NOW)).retry_after, 30);
    }

    #[test]
    fn retry_after_is_at_least_a_second_and_rounds_up() {
        let r = RateState::of(1, &at(&[-59_999]), Timestamp(NOW));
        assert_eq!(r.retry_after, 1);
        let r = RateState::of(1, &at(&[-1]), Timestamp(NOW));
        assert_eq!(r.retry_after, 60, "59.999 s round up");
        // Refused in a race with room left: retry at once (in a second).
        assert_eq!(RateState::of(3, &at(&[-1]), Timestamp(NOW)).retry_after, 1);
    }
}
