//! `X-API-Key` → the calling key and its plan, as an extractor: a handler
//! that takes a [`Caller`] only runs for an authenticated request.

use crate::error::ApiError;
use crate::plans::Plan;
use crate::{keys, ApiState};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use hindsight_store::read::ApiKeyRecord;
use hindsight_telemetry as tm;
use subtle::ConstantTimeEq;

#[derive(Debug, Clone)]
pub struct Caller {
    pub key: ApiKeyRecord,
    pub plan: Plan,
}

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let Some(sent) = parts.headers.get("x-api-key") else {
            metrics::counter!(tm::API_AUTH_FAILURES, "reason" => "missing").increment(1);
            return Err(ApiError::MissingKey);
        };
        let invalid = || {
            metrics::counter!(tm::API_AUTH_FAILURES, "reason" => "invalid").increment(1);
            ApiError::InvalidKey
        };
        let sent = sent.to_str().map_err(|_| invalid())?;
        let hash = keys::hash(sent);
        let key = state.keys.key_by_hash(hash).await?.ok_or_else(invalid)?;
        // The lookup is by hash already; compare again in constant time so
        // that no code path branches on a partial match of secret material.
        if !bool::from(key.hash.ct_eq(&hash)) || key.revoked_at.is_some() {
            return Err(invalid());
        }
        let Some(plan) = state.plans.get(&key.plan).cloned() else {
            tracing::error!(key_id = %key.key_id, plan = %key.plan, "key has an unknown plan");
            return Err(ApiError::Internal);
        };
        Ok(Caller { key, plan })
    }
}
