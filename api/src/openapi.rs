//! The OpenAPI 3.1.0 document, generated from the handlers' `#[utoipa::path]`
//! annotations and the wire types' `ToSchema` derives. Served at
//! `/openapi.json`; `api/openapi.json` is the committed copy, which a test
//! keeps equal to this (`hindsight openapi > api/openapi.json` refreshes it).

use crate::page;
use crate::routes::{self, discovery, history};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::openapi::{Object, RefOr, Required, ResponseBuilder, Type};
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
    modifiers(&ApiKeyAuth, &Revalidation),
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

/// The history routes' validators, declared once for all of them (they
/// come from one place in the code, `page` and `conditional`): the
/// `If-None-Match` request header, `ETag`, `Cache-Control` and `Vary` on
/// the 200, and the 304 that carries the same headers and no body.
struct Revalidation;

impl Modify for Revalidation {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let text = || Object::with_type(Type::String);
        let headers = [
            (
                "ETag",
                "Strong entity tag of this page's body; it changes whenever the body does.",
            ),
            (
                "Cache-Control",
                &*format!(
                    "`{}` when the projector has passed the page's range (a later bucket exists), \
                     else `{}`.",
                    page::CLOSED,
                    page::OPEN
                ),
            ),
            ("Vary", "`X-API-Key`: a cache keeps one copy per key."),
        ]
        .map(|(name, about)| {
            (
                name,
                HeaderBuilder::new()
                    .schema(text())
                    .description(Some(about))
                    .build(),
            )
        });
        let if_none_match = ParameterBuilder::new()
            .name("If-None-Match")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "Entity tags of pages already held (or `*`); when one matches this page's \
                 `ETag` (weak comparison), the answer is 304 without a body.",
            ))
            .schema(Some(text()))
            .build();
        for item in doc.paths.paths.values_mut() {
            let Some(op) = item.get.as_mut() else {
                continue;
            };
            if !op.tags.iter().flatten().any(|t| t == "history") {
                continue;
            }
            op.parameters
                .get_or_insert_with(Vec::new)
                .push(if_none_match.clone());
            if let Some(RefOr::T(ok)) = op.responses.responses.get_mut("200") {
                for (name, header) in &headers {
                    ok.headers.insert(name.to_string(), header.clone());
                }
            }
            let mut not_modified = ResponseBuilder::new().description(
                "Not Modified: the page is the one whose `ETag` was sent in `If-None-Match`.",
            );
            for (name, header) in &headers {
                not_modified = not_modified.header(*name, header.clone());
            }
            op.responses
                .responses
                .insert("304".into(), not_modified.into());
        }
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
