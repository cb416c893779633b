//! The `/v1` requests behind the explorer's tables and charts.
//!
//! A page does not read the store itself: it writes the `/v1` request it
//! shows beside a chart ([`V1Request`]), and asks it of the `/v1` handlers
//! in this process, through the same query extractors, plan checks and
//! reads as a client's request ([`V1Request::send`]). What is drawn is
//! therefore what the copyable `curl` and Python snippets fetch, and a
//! plan's refusal is the API's own message. The signed-in organization is
//! the caller ([`caller`]): its plan, the API's clock. Each request takes
//! one from the plan's rate limit, counted for the organization as if it
//! were one more key (`dashboard:{org}`), so the pages are no way around a
//! plan's limit; it is not counted in any key's usage (no key made it).

use super::{DashError, SignedIn};
use crate::auth::Caller;
use crate::query::{BookAtQuery, HistoryQuery, ListQuery, MarketFilter};
use crate::routes::{discovery, history};
use crate::ApiState;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use hindsight_contracts::ApiKeyRecord;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

/// The `/v1` routes the explorer asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// `/v1/markets`: the search.
    Markets,
    /// `/v1/markets/{id_or_slug}`.
    Market(String),
    /// `/v1/tokens/{token_id}/prices`.
    TokenPrices(String),
    /// `/v1/tokens/{token_id}/book`: the book at a moment.
    TokenBook(String),
    /// `/v1/markets/{id_or_slug}/metrics`.
    MarketMetrics(String),
}

/// Characters left as they are in a path segment (RFC 3986 unreserved).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `id` as one path segment.
pub fn segment(id: &str) -> String {
    utf8_percent_encode(id, SEGMENT).to_string()
}

/// A Python string literal (a JSON string is one).
fn py(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// One `/v1` request: a route and its query, in the order the official
/// client sends its parameters (so the URL shown is the URL it asks).
#[derive(Debug, Clone)]
pub struct V1Request {
    pub route: Route,
    pub query: Vec<(String, String)>,
}

/// What `/v1` answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub fn ok(&self) -> bool {
        self.status == 200
    }

    /// The error's `detail`, one line (a 422's issues joined).
    pub fn detail(&self) -> String {
        match &self.body["detail"] {
            Value::String(s) => s.clone(),
            Value::Array(issues) => issues
                .iter()
                .map(|i| {
                    let field = i["loc"]
                        .as_array()
                        .and_then(|l| l.last())
                        .and_then(Value::as_str)
                        .unwrap_or("request");
                    format!("{field}: {}", i["msg"].as_str().unwrap_or("invalid"))
                })
                .collect::<Vec<_>>()
                .join("; "),
            _ => format!("the API answered {}", self.status),
        }
    }
}

impl V1Request {
    pub fn new(route: Route, query: &[(&str, String)]) -> Self {
        V1Request {
            route,
            query: query
                .iter()
                .map(|(k, v)| ((*k).to_string(), v.clone()))
                .collect(),
        }
    }

    pub fn path(&self) -> String {
        match &self.route {
            Route::Markets => "/v1/markets".into(),
            Route::Market(id) => format!("/v1/markets/{}", segment(id)),
            Route::TokenPrices(id) => format!("/v1/tokens/{}/prices", segment(id)),
            Route::TokenBook(id) => format!("/v1/tokens/{}/book", segment(id)),
            Route::MarketMetrics(id) => format!("/v1/markets/{}/metrics", segment(id)),
        }
    }

    /// Path and query, as sent.
    pub fn path_and_query(&self) -> String {
        if self.query.is_empty() {
            return self.path();
        }
        let query = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&self.query)
            .finish();
        format!("{}?{query}", self.path())
    }

    /// A copyable `curl` of this request on `base`.
    pub fn curl(&self, base: &str) -> String {
        format!(
            "curl -sS -H \"X-API-Key: $HINDSIGHT_API_KEY\" '{base}{}'",
            self.path_and_query()
        )
    }

    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Keyword arguments of the official client for `names` present in
    /// the query (`numbers` unquoted).
    fn kwargs(&self, names: &[&str], numbers: &[&str]) -> Vec<String> {
        names
            .iter()
            .filter_map(|n| {
                self.param(n).map(|v| {
                    if numbers.contains(n) {
                        format!("{n}={v}")
                    } else {
                        format!("{n}={}", py(v))
                    }
                })
            })
            .collect()
    }

    /// A copyable Python snippet of this request through the official
    /// client, `polymarketdata-sdk` (its 0.1.0 methods and arguments).
    pub fn python(&self, base: &str) -> String {
        let client = format!(
            "import os\nfrom polymarketdata import PolymarketDataClient\n\n\
             client = PolymarketDataClient(api_key=os.environ[\"HINDSIGHT_API_KEY\"], base_url={})\n",
            py(&format!("{base}/v1"))
        );
        const HISTORY: [&str; 4] = ["start_ts", "end_ts", "resolution", "limit"];
        const NUMBERS: [&str; 3] = ["start_ts", "end_ts", "limit"];
        let call = |method: &str, id: &str, args: Vec<String>| {
            let mut all = vec![py(id)];
            all.extend(args);
            format!(
                "{client}page = client.{method}(\n    {},\n)\n",
                all.join(",\n    ")
            )
        };
        match &self.route {
            Route::Markets => {
                const SDK: [&str; 7] = [
                    "search",
                    "event_id",
                    "event_slug",
                    "limit",
                    "cursor",
                    "sort",
                    "order",
                ];
                let args = self.kwargs(&SDK, &["limit"]);
                let unsent: Vec<&str> = self
                    .query
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .filter(|k| !SDK.contains(k))
                    .collect();
                let mut out = client;
                if !unsent.is_empty() {
                    out.push_str(&format!(
                        "# polymarketdata-sdk 0.1.0's list_markets has no argument for: {} \
                         (the curl sends them)\n",
                        unsent.join(", ")
                    ));
                }
                out.push_str(&format!(
                    "page = client.discovery.list_markets(\n    {},\n)\n",
                    args.join(",\n    ")
                ));
                out
            }
            Route::Market(id) => {
                format!("{client}market = client.discovery.get_market({})\n", py(id))
            }
            Route::TokenPrices(id) => call(
                "history.get_token_prices",
                id,
                self.kwargs(&HISTORY, &NUMBERS),
            ),
            Route::MarketMetrics(id) => call(
                "history.get_market_metrics",
                id,
                self.kwargs(&HISTORY, &NUMBERS),
            ),
            Route::TokenBook(_) => format!(
                "import os\nimport httpx\n\n\
                 # polymarketdata-sdk 0.1.0 has no method for the book at a moment;\n\
                 # httpx (which it installs) asks for it.\n\
                 book = httpx.get(\n    {},\n    params={{{}}},\n    \
                 headers={{\"X-API-Key\": os.environ[\"HINDSIGHT_API_KEY\"]}},\n).json()\n",
                py(&format!("{base}{}", self.path())),
                self.query
                    .iter()
                    .map(|(k, v)| format!("{}: {}", py(k), py(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// Asks this request of the `/v1` handlers as `caller`: its query
    /// parsed by the route's extractor, then the route's handler.
    pub async fn send(&self, state: &ApiState, caller: &Caller) -> Answer {
        let response = self.respond(state, caller.clone()).await;
        let status = response.status().as_u16();
        let body = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        Answer { status, body }
    }

    async fn respond(&self, state: &ApiState, caller: Caller) -> Response {
        if let Err(refused) = crate::auth::take(state, &caller).await {
            return refused.into_response();
        }
        let uri = self.path_and_query();
        let request = Request::builder()
            .uri(uri.as_str())
            .body(())
            .expect("an encoded path and query make a URI");
        let (mut parts, ()) = request.into_parts();
        let st = State(state.clone());
        macro_rules! query {
            ($ty:ty) => {
                match <$ty>::from_request_parts(&mut parts, state).await {
                    Ok(q) => q,
                    Err(e) => return e.into_response(),
                }
            };
        }
        match self.route.clone() {
            Route::Markets => {
                let q = query!(ListQuery<MarketFilter>);
                discovery::list_markets(st, caller, q).await.into_response()
            }
            Route::Market(id) => discovery::get_market(st, caller, Path(id))
                .await
                .into_response(),
            Route::TokenPrices(id) => {
                let q = query!(HistoryQuery);
                history::token_prices(st, caller, Path(id), q)
                    .await
                    .into_response()
            }
            Route::TokenBook(id) => {
                let q = query!(BookAtQuery);
                history::token_book(st, caller, Path(id), q)
                    .await
                    .into_response()
            }
            Route::MarketMetrics(id) => {
                let q = query!(HistoryQuery);
                history::market_metrics(st, caller, Path(id), q)
                    .await
                    .into_response()
            }
        }
    }
}

/// The signed-in organization as a `/v1` caller: its plan, now.
pub fn caller(state: &ApiState, me: &SignedIn) -> Result<Caller, DashError> {
    let plan = state.plans.get(&me.org.plan).cloned().ok_or_else(|| {
        DashError::NotFound(format!(
            "the organization's plan `{}` is not configured on this service; ask the operator",
            me.org.plan
        ))
    })?;
    let now = state.clock.now();
    Ok(Caller {
        key: ApiKeyRecord {
            key_id: format!("dashboard:{}", me.org.name),
            hash: [0; 32],
            organization: me.org.name.clone(),
            plan: me.org.plan.clone(),
            created_at: now,
            revoked_at: None,
        },
        plan,
        now,
    })
}
