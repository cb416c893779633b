//! The OpenAPI 3.1.0 document, generated from the handlers' `#[utoipa::path]`
//! annotations and the wire types' `ToSchema` derives. Served at
//! `/openapi.json`; `api/openapi.json` is the committed copy, which a test
//! keeps equal to this (`hindsight openapi > api/openapi.json` refreshes it).

use crate::routes::{self, discovery, history};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hindsight",
        version = "0.1.1",
        description = "Historical prediction-market data: discovery of series, events, markets and tags; \
                       price, metrics and order-book history from precomputed buckets."
    ),
    paths(
        routes::health,
        routes::usage,
        discovery::list_series,
        discovery::list_events,
        discovery::list_markets,
        discovery::get_market,
        discovery::list_tags,
        history::market_metrics,
        history::market_prices,
        history::token_prices,
        history::market_books,
        history::token_books,
    ),
    modifiers(&ApiKeyAuth),
    security(("APIKeyHeader" = [])),
    tags(
        (name = "utility", description = "Health and usage"),
        (name = "discovery", description = "Series, events, markets and tags"),
        (name = "history", description = "Prices, metrics and order books")
    )
)]
struct ApiDoc;

struct ApiKeyAuth;

impl Modify for ApiKeyAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "APIKeyHeader",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as committed: pretty JSON with a trailing newline.
pub fn to_pretty_json() -> String {
    document()
        .to_pretty_json()
        .expect("the document serializes")
        + "\n"
}
