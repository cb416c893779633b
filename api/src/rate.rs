//! Where a caller stands in its rate window, and the headers that tell it.
//!
//! A leaf module: [`crate::error`] needs it for 429s and [`crate::auth`]
//! computes it, so it depends on neither.

use axum::http::HeaderValue;
use axum::response::Response;

/// Where the caller stands in its rate window (after this request).
#[derive(Debug, Clone, Copy)]
pub struct RateState {
    /// `None` on unlimited plans.
    pub limit: Option<u32>,
    pub used: u64,
    /// Unix seconds when the window resets.
    pub reset_at: i64,
}

impl RateState {
    pub fn remaining(&self) -> Option<u64> {
        self.limit.map(|l| (l as u64).saturating_sub(self.used))
    }
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Unix seconds), on limited plans.
pub fn rate_headers(response: &mut Response, rate: &RateState) {
    if let (Some(limit), Some(remaining)) = (rate.limit, rate.remaining()) {
        let h = response.headers_mut();
        h.insert("x-ratelimit-limit", HeaderValue::from(limit));
        h.insert("x-ratelimit-remaining", HeaderValue::from(remaining));
        h.insert("x-ratelimit-reset", HeaderValue::from(rate.reset_at));
    }
}
