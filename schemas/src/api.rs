//! API wire types: the JSON bodies `/v1` returns (SPEC.md §2, and the
//! official client's models where SPEC says "not shown").

use serde::Serialize;

/// `metadata` of history pages and discovery lists.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PageMetadata {
    pub count: usize,
    pub limit: usize,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PricePoint {
    /// Bucket start, ISO 8601 UTC.
    pub t: String,
    /// Average probability in the bucket.
    pub p: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenPricesResponse {
    pub market_id: String,
    pub token_id: String,
    pub token_label: String,
    pub resolution: String,
    pub data: Vec<PricePoint>,
    pub metadata: PageMetadata,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HealthResponse {
    pub status: &'static str,
    pub timestamp: String,
}
