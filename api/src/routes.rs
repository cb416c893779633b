//! `/v1` handlers. Extractors have authenticated the caller and validated
//! the query; each handler checks the plan, reads buckets, shapes the page.

use crate::auth::Caller;
use crate::error::{ApiError, FieldError};
use crate::plans::DataPoint;
use crate::query::HistoryQuery;
use crate::ApiState;
use axum::extract::{Path, State};
use axum::Json;
use hindsight_schemas::api::*;
use hindsight_schemas::{Timestamp, MAX_ID_LEN};

/// `GET /v1/health`: authenticated liveness.
pub async fn health(_caller: Caller) -> Json<HealthResponse> {
    Json(HealthResponse {
        status: "ok",
        timestamp: Timestamp::now().to_rfc3339(),
    })
}

/// A path id of 1..200 characters (SPEC.md §4).
fn path_id(name: &str, value: String) -> Result<String, ApiError> {
    let len = value.chars().count();
    if len == 0 {
        return Err(ApiError::Validation(vec![FieldError::path(
            name,
            "String should have at least 1 character",
            "string_too_short",
        )]));
    }
    if len > MAX_ID_LEN {
        return Err(ApiError::Validation(vec![FieldError::path(
            name,
            format!("String should have at most {MAX_ID_LEN} characters"),
            "string_too_long",
        )]));
    }
    Ok(value)
}

/// `GET /v1/tokens/{token_id}/prices`: average probability per bucket.
pub async fn token_prices(
    State(state): State<ApiState>,
    caller: Caller,
    Path(token_id): Path<String>,
    query: HistoryQuery,
) -> Result<Json<TokenPricesResponse>, ApiError> {
    let token_id = path_id("token_id", token_id)?;
    caller.plan.check_history(
        DataPoint::Prices,
        query.resolution,
        query.start,
        Timestamp::now(),
    )?;
    let token = state
        .store
        .token(&token_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("Token not found".into()))?;
    let mut points = state.store.prices(&token_id, query.page_range()).await?;
    let next_cursor = query.paginate(&mut points, |p| p.t);
    let data: Vec<PricePoint> = points
        .into_iter()
        .map(|p| PricePoint {
            t: p.t.to_rfc3339(),
            p: p.p,
        })
        .collect();
    Ok(Json(TokenPricesResponse {
        market_id: token.market_id,
        token_id: token.token_id,
        token_label: token.label,
        resolution: query.resolution.as_str().to_string(),
        metadata: PageMetadata {
            count: data.len(),
            limit: query.limit,
            next_cursor,
        },
        data,
    }))
}
