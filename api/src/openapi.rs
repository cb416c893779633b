//! The OpenAPI 3.1.0 document, generated from the handlers' `#[utoipa::path]`
//! annotations and the wire types' `ToSchema` derives. Served at
//! `/openapi.json`; `api/openapi.json` is the committed copy, which a test
//! keeps equal to this (`hindsight openapi > api/openapi.json` refreshes it).

use crate::page;
use crate::routes::{self, discovery, estimate, export, exports, history};
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::openapi::{Object, Ref, RefOr, Required, ResponseBuilder, Type};
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
        history::market_candles,
        history::token_candles,
        estimate::estimate,
        export::export_prices,
        export::export_books,
        export::export_metrics,
        export::export_trades,
        export::export_candles,
        exports::create_export_job,
        exports::list_export_jobs,
        exports::get_export_job,
        exports::download_export_job,
        history::token_trades,
        history::token_book,
        history::market_book,
    ),
    modifiers(&ApiKeyAuth, &Revalidation, &Links, &EdgeRefusals, &Examples),
    security(("APIKeyHeader" = [])),
    tags(
        (name = "utility", description = "Health and usage"),
        (name = "discovery", description = "Series, events, markets and tags"),
        (name = "history", description = "Prices, candles, metrics, order books and trades"),
        (name = "snapshots", description = "The order book at a moment"),
        (name = "estimate", description = "Points and bytes a history request would return"),
        (name = "export", description = "Whole ranges as one CSV or Parquet file, streamed or as jobs")
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

/// What the shared HTTP edge (`hindsight_http::edge`) answers before any
/// route runs, declared on every operation: a request target longer than
/// [`hindsight_http::MAX_URI_BYTES`] is refused with a JSON 414, whatever
/// the route (a long enough query string reaches it on any of them).
struct EdgeRefusals;

impl Modify for EdgeRefusals {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let too_long = ResponseBuilder::new()
            .description(format!(
                "The request target (path and query) is longer than {} bytes",
                hindsight_http::MAX_URI_BYTES
            ))
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorResponse")))
                    .build(),
            )
            .build();
        for op in operations(doc) {
            op.responses
                .responses
                .insert("414".into(), RefOr::T(too_long.clone()));
        }
    }
}

/// Every operation of the document (the API's are GETs and POSTs).
fn operations(doc: &mut utoipa::openapi::OpenApi) -> impl Iterator<Item = &mut Operation> {
    doc.paths
        .paths
        .values_mut()
        .flat_map(|item| [item.get.as_mut(), item.post.as_mut()])
        .flatten()
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

/// OpenAPI `links`: where the ids an answer carries can be used next (a
/// listed market's detail and history, a market's tokens' history, an
/// event's markets, a series' events). They document how the routes
/// chain, and let stateful clients and testers (schemathesis) follow them.
struct Links;

/// `(from operation, link name, to operation, its parameter, JSON pointer
/// into the `200` body)`: lists link their first item.
const LINKS: [(&str, &str, &str, &str, &str); 24] = [
    (
        "list_series",
        "events",
        "list_events",
        "series_id",
        "/data/0/id",
    ),
    (
        "list_events",
        "markets",
        "list_markets",
        "event_id",
        "/data/0/id",
    ),
    (
        "list_markets",
        "market",
        "get_market",
        "id_or_slug",
        "/data/0/id",
    ),
    (
        "list_markets",
        "market_by_slug",
        "get_market",
        "id_or_slug",
        "/data/0/slug",
    ),
    (
        "list_markets",
        "market_prices",
        "market_prices",
        "id_or_slug",
        "/data/0/id",
    ),
    (
        "list_markets",
        "market_metrics",
        "market_metrics",
        "id_or_slug",
        "/data/0/id",
    ),
    (
        "list_markets",
        "market_books",
        "market_books",
        "id_or_slug",
        "/data/0/id",
    ),
    (
        "list_markets",
        "token_prices",
        "token_prices",
        "token_id",
        "/data/0/tokens/0/id",
    ),
    (
        "list_markets",
        "token_books",
        "token_books",
        "token_id",
        "/data/0/tokens/0/id",
    ),
    (
        "list_markets",
        "export_prices",
        "export_prices",
        "market_id",
        "/data/0/id",
    ),
    (
        "list_markets",
        "export_metrics",
        "export_metrics",
        "market_id",
        "/data/0/id",
    ),
    (
        "get_market",
        "export_books",
        "export_books",
        "token_id",
        "/tokens/0/id",
    ),
    (
        "get_market",
        "export_prices",
        "export_prices",
        "token_id",
        "/tokens/0/id",
    ),
    ("get_market", "prices", "market_prices", "id_or_slug", "/id"),
    (
        "get_market",
        "metrics",
        "market_metrics",
        "id_or_slug",
        "/id",
    ),
    ("get_market", "books", "market_books", "id_or_slug", "/id"),
    (
        "get_market",
        "token_prices",
        "token_prices",
        "token_id",
        "/tokens/0/id",
    ),
    (
        "get_market",
        "token_books",
        "token_books",
        "token_id",
        "/tokens/0/id",
    ),
    (
        "list_markets",
        "market_candles",
        "market_candles",
        "id_or_slug",
        "/data/0/id",
    ),
    (
        "list_markets",
        "token_candles",
        "token_candles",
        "token_id",
        "/data/0/tokens/0/id",
    ),
    (
        "get_market",
        "candles",
        "market_candles",
        "id_or_slug",
        "/id",
    ),
    (
        "get_market",
        "token_candles",
        "token_candles",
        "token_id",
        "/tokens/0/id",
    ),
    (
        "get_market",
        "token_trades",
        "token_trades",
        "token_id",
        "/tokens/0/id",
    ),
    ("get_market", "book", "market_book", "id_or_slug", "/id"),
];

impl Modify for Links {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let operations = doc
            .paths
            .paths
            .values_mut()
            .filter_map(|item| item.get.as_mut());
        for operation in operations {
            let Some(from) = operation.operation_id.as_deref() else {
                continue;
            };
            let links = LINKS.iter().filter(|l| l.0 == from).collect::<Vec<_>>();
            let Some(RefOr::T(ok)) = operation.responses.responses.get_mut("200") else {
                continue;
            };
            for (_, name, to, parameter, pointer) in links {
                // utoipa 5.5 writes `LinkBuilder::operation_id` as
                // `operation_id`, not OpenAPI's `operationId`: the field
                // goes in as an entry of the link's flattened extensions,
                // under its OpenAPI name.
                let link = LinkBuilder::new()
                    .parameter(*parameter, format!("$response.body#{pointer}"))
                    .extensions(Some(Extensions::from_iter([("operationId", *to)])))
                    .build();
                ok.links.insert(name.to_string(), link.into());
            }
        }
    }
}

/// An example value for every parameter of these names, wherever it is
/// declared (path or query): a reader sees what a request looks like, and
/// schemathesis's examples phase sends them.
///
/// The ids are those of a demo market of `hindsight dev` (README's first
/// command; the binary's tests keep them so), and the times fall in the
/// range of the schemathesis dataset (`tests/sdk/schemathesis/`), which
/// holds the same market with three hours of history from 2025-09-01.
struct Examples;

/// `(parameter name, example)`.
///
/// `market_id` has none: the routes that take it as a filter take it or
/// `token_id`, not both, and an example of each would make their example
/// request one they refuse.
pub const EXAMPLES: [(&str, &str); 8] = [
    ("token_id", "tok-fed-cuts-25bps-december-2026-yes"),
    ("id_or_slug", "fed-cuts-25bps-december-2026"),
    ("start_ts", "2025-09-01T00:00:00Z"),
    ("end_ts", "2025-09-01T03:00:00Z"),
    ("resolution", "1h"),
    ("ts", "2025-09-01T01:30:00Z"),
    ("kind", "prices"),
    ("search", "fed"),
];

/// The example of parameter `name`, if [`EXAMPLES`] gives one.
pub fn example(name: &str) -> Option<&'static str> {
    EXAMPLES.iter().find(|(n, _)| *n == name).map(|(_, e)| *e)
}

impl Modify for Examples {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let parameters = operations(doc).flat_map(|op| op.parameters.iter_mut().flatten());
        for p in parameters {
            if let Some(example) = example(&p.name) {
                // utoipa keeps a parameter's `example` private to its builder.
                *p = ParameterBuilder::from(p.clone())
                    .example(Some(example.into()))
                    .build();
            }
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
