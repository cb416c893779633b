//! Explore the data: search markets with the filters of `/v1/markets`, and
//! a market's page: each token's price history, its order book at a
//! chosen moment (a depth chart), and the market's metrics.
//!
//! Every table and chart comes from one `/v1` request, asked in process
//! as the signed-in organization ([`super::v1`]); beside it the page shows
//! that request as a copyable `curl` and a copyable Python snippet of the
//! official client. The pickers offer only what the organization's plan
//! allows (its finest resolution, its lookback); anything else asked for
//! is answered with the API's own refusal, shown where the chart would be.

use super::charts;
use super::html::{self, esc};
use super::v1::{self, Answer, Route, V1Request};
use super::{public_url, require, DashError, SignedIn};
use crate::auth::Caller;
use crate::plans::Plan;
use crate::query::HISTORY_LIMIT_MAX;
use crate::ApiState;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use hindsight_schemas::{Resolution, Timestamp};
use serde_json::Value;
use std::fmt::Write;

/// Markets per page of the search unless asked otherwise.
pub const SEARCH_PAGE: usize = 25;
/// The ranges offered, in days (those within the plan's lookback).
pub const RANGES: [u32; 5] = [1, 7, 30, 90, 365];
const DAY_MS: i64 = 86_400_000;

/// The browser's query string, as pairs.
fn pairs(raw: Option<String>) -> Vec<(String, String)> {
    form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// The last non-empty value of `name`.
fn field<'a>(form: &'a [(String, String)], name: &str) -> Option<&'a str> {
    form.iter()
        .rev()
        .find(|(k, v)| k == name && !v.trim().is_empty())
        .map(|(_, v)| v.trim())
}

fn t_of(v: &Value) -> Option<Timestamp> {
    let text = v.as_str()?;
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|d| Timestamp(d.timestamp_millis()))
}

/// The request beside a table or chart: its path and query, a `curl`
/// and a Python snippet, each with a copy button.
fn request_panel(n: &str, request: &V1Request, base: &str) -> String {
    format!(
        r#"<aside class="request" aria-label="The /v1 request behind this"><h3>The <code>/v1</code> request</h3>
<p><code class="v1" id="v1-{n}">GET {}</code></p>
<pre class="snippet" id="curl-{n}"><code>{}</code></pre><button type="button" class="secondary" data-copy="curl-{n}">Copy curl</button>
<pre class="snippet" id="py-{n}"><code>{}</code></pre><button type="button" class="secondary" data-copy="py-{n}">Copy Python</button></aside>"#,
        esc(&request.path_and_query()),
        esc(&request.curl(base)),
        esc(&request.python(base)),
    )
}

fn refusal(answer: &Answer) -> String {
    format!(
        r#"<p class="error refused" role="alert" data-status="{}">{}</p>"#,
        answer.status,
        esc(&answer.detail())
    )
}

/// A signed-in explorer's request: the organization as a `/v1` caller,
/// the address its snippets use, the page's query.
struct Explorer {
    state: ApiState,
    me: SignedIn,
    caller: Caller,
    base: String,
    form: Vec<(String, String)>,
}

impl Explorer {
    /// The signed-in browser's explorer, or the redirect to sign in.
    async fn open(
        state: ApiState,
        headers: &HeaderMap,
        raw: Option<String>,
    ) -> Result<Result<Explorer, Response>, DashError> {
        let me = match require(&state, headers).await? {
            Ok(me) => me,
            Err(redirect) => return Ok(Err(redirect)),
        };
        Ok(Ok(Explorer {
            caller: v1::caller(&state, &me)?,
            base: public_url(&state, headers),
            form: pairs(raw),
            state,
            me,
        }))
    }

    async fn send(&self, request: &V1Request) -> Answer {
        request.send(&self.state, &self.caller).await
    }

    /// A card of one request: what `draw` makes of its answer (a 200),
    /// beside the request. A 404 is a note (`id="{n}-none"`), any other
    /// answer the API's refusal.
    async fn card(
        &self,
        n: &str,
        title: &str,
        request: &V1Request,
        draw: impl FnOnce(&Value) -> String,
    ) -> String {
        let answer = self.send(request).await;
        let figure = match answer.status {
            200 => draw(&answer.body),
            404 => format!(
                r#"<p class="muted" id="{n}-none">{}</p>"#,
                esc(&answer.detail())
            ),
            _ => refusal(&answer),
        };
        format!(
            r#"<section class="card"><h2>{}</h2><div class="explore-row"><figure class="grow">{figure}</figure>{}</div></section>"#,
            esc(title),
            request_panel(n, request, &self.base)
        )
    }

    fn page(&self, status: StatusCode, title: &str, body: &str) -> Response {
        let page = html::page(title, Some(&self.me.nav()), body);
        (status, super::html_page(page)).into_response()
    }
}

// ---- the search -------------------------------------------------------------------

/// The `/v1/markets` query of the search form: the official client's
/// arguments in its order (it always sends `limit`, `sort` and `order`),
/// then the filters it has no argument for.
fn search_query(form: &[(String, String)]) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    let mut put = |name: &'static str, default: Option<&str>| {
        if let Some(v) = field(form, name).or(default) {
            q.push((name, v.to_string()));
        }
    };
    put("search", None);
    put("event_id", None);
    put("event_slug", None);
    put("limit", Some(&SEARCH_PAGE.to_string()));
    put("cursor", None);
    put("sort", Some("updated_at"));
    put("order", Some("desc"));
    put("tags", None);
    if field(form, "tags").is_some() {
        put("tags_match", None);
    }
    put("start_date_min", None);
    put("start_date_max", None);
    put("end_date_min", None);
    put("end_date_max", None);
    q
}

fn select(id: &str, label: &str, options: &[(&str, &str)], current: Option<&str>) -> String {
    let mut out =
        format!(r#"<div><label for="{id}">{label}</label><select id="{id}" name="{id}">"#);
    for (value, text) in options {
        let selected = if current == Some(*value) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<option value="{}"{selected}>{}</option>"#,
            esc(value),
            esc(text)
        );
    }
    out.push_str("</select></div>");
    out
}

fn input(id: &str, label: &str, kind: &str, value: Option<&str>, hint: &str) -> String {
    format!(
        r#"<div><label for="{id}">{label}</label><input id="{id}" name="{id}" type="{kind}" value="{}" placeholder="{}"></div>"#,
        esc(value.unwrap_or_default()),
        esc(hint)
    )
}

fn search_form(form: &[(String, String)]) -> String {
    let f = |name| field(form, name);
    let mut out = String::from(
        r#"<form class="filters" method="get" action="/dashboard/markets" role="search" aria-label="Search markets">"#,
    );
    out.push_str(&input(
        "search",
        "Search",
        "search",
        f("search"),
        "question or slug",
    ));
    out.push_str(&input("event_id", "Event id", "text", f("event_id"), ""));
    out.push_str(&input(
        "event_slug",
        "Event slug",
        "text",
        f("event_slug"),
        "",
    ));
    out.push_str(&input(
        "tags",
        "Tags (comma-separated)",
        "text",
        f("tags"),
        "politics, sports",
    ));
    out.push_str(&select(
        "tags_match",
        "Tags match",
        &[("any", "any tag"), ("all", "all tags")],
        f("tags_match"),
    ));
    out.push_str(&input(
        "start_date_min",
        "Starts on or after",
        "date",
        f("start_date_min"),
        "",
    ));
    out.push_str(&input(
        "start_date_max",
        "Starts on or before",
        "date",
        f("start_date_max"),
        "",
    ));
    out.push_str(&input(
        "end_date_min",
        "Ends on or after",
        "date",
        f("end_date_min"),
        "",
    ));
    out.push_str(&input(
        "end_date_max",
        "Ends on or before",
        "date",
        f("end_date_max"),
        "",
    ));
    out.push_str(&select(
        "sort",
        "Sort by",
        &[
            ("updated_at", "last updated"),
            ("start_date", "start date"),
            ("end_date", "end date"),
        ],
        f("sort"),
    ));
    out.push_str(&select(
        "order",
        "Order",
        &[("desc", "descending"), ("asc", "ascending")],
        f("order"),
    ));
    out.push_str(&input(
        "limit",
        "Per page",
        "number",
        f("limit"),
        &SEARCH_PAGE.to_string(),
    ));
    out.push_str(r#"<div class="submit"><button type="submit">Search</button></div></form>"#);
    out
}

fn results(body: &Value, form: &[(String, String)]) -> String {
    let empty = Vec::new();
    let markets = body["data"].as_array().unwrap_or(&empty);
    let mut out = String::from(
        r#"<table id="markets"><caption class="sr-only">Markets found</caption><thead><tr><th scope="col">Question</th><th scope="col" class="opt">Slug</th><th scope="col">Status</th><th scope="col" class="opt">Ends</th><th scope="col">Tokens</th></tr></thead><tbody>"#,
    );
    if markets.is_empty() {
        out.push_str(r#"<tr><td colspan="5" class="muted">No market matches.</td></tr>"#);
    }
    for m in markets {
        let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
        let tokens: Vec<String> = m["tokens"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(|t| esc(t["label"].as_str().unwrap_or_default()))
            .collect();
        let _ = write!(
            out,
            r#"<tr><td><a href="/dashboard/markets/{}">{}</a></td><td class="opt"><code>{}</code></td><td>{}</td><td class="opt">{}</td><td>{}</td></tr>"#,
            esc(&percent_encoding::utf8_percent_encode(
                &s("id"),
                percent_encoding::NON_ALPHANUMERIC
            )
            .to_string()),
            esc(&s("question")),
            esc(&s("slug")),
            esc(&s("status")),
            esc(m["end_date"]
                .as_str()
                .map_or("-", |d| d.get(..10).unwrap_or(d))),
            tokens.join(", ")
        );
    }
    out.push_str("</tbody></table>");
    if let Some(next) = body["metadata"]["next_cursor"].as_str() {
        let query = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form.iter().filter(|(k, _)| k != "cursor"))
            .append_pair("cursor", next)
            .finish();
        let _ = write!(
            out,
            r#"<p><a class="button secondary" id="next-page" href="/dashboard/markets?{}">Next page</a></p>"#,
            esc(&query)
        );
    }
    out
}

/// `/dashboard/markets`: the search form, its results and its request.
pub async fn markets(
    State(state): State<ApiState>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, DashError> {
    let x = match Explorer::open(state, &headers, raw).await? {
        Ok(x) => x,
        Err(redirect) => return Ok(redirect),
    };
    let request = V1Request::new(Route::Markets, &search_query(&x.form));
    let answer = x.send(&request).await;
    let mut body = String::from(r#"<section class="card"><h1>Explore markets</h1>"#);
    body.push_str(&search_form(&x.form));
    body.push_str("</section>");
    let found = if answer.ok() {
        results(&answer.body, &x.form)
    } else {
        refusal(&answer)
    };
    let _ = write!(
        body,
        r#"<section class="card"><h2>Markets</h2><div class="explore-row"><div class="grow">{found}</div>{}</div></section>"#,
        request_panel("markets", &request, &x.base)
    );
    let status = if answer.ok() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    Ok(x.page(status, "Explore", &body))
}

// ---- a market ----------------------------------------------------------------------

/// What the market page shows: the pickers' values, checked.
struct View {
    days: u32,
    resolution: Resolution,
    /// The range: `[start, end)`, whole days ending with the day `end_day`.
    start: Timestamp,
    end: Timestamp,
    end_day: NaiveDate,
    book_at: Timestamp,
}

/// The resolutions the plan allows (no finer than its finest).
fn resolutions(plan: &Plan) -> Vec<Resolution> {
    Resolution::ALL
        .into_iter()
        .filter(|r| r.width_ms() >= plan.finest.width_ms())
        .collect()
}

/// The ranges the plan's lookback covers.
fn ranges(plan: &Plan) -> Vec<u32> {
    RANGES
        .into_iter()
        .filter(|d| *d <= plan.max_history_days)
        .collect()
}

fn day_of(t: Timestamp) -> NaiveDate {
    DateTime::from_timestamp_millis(t.0).map_or(NaiveDate::MIN, |d| d.date_naive())
}

fn millis(d: NaiveDateTime) -> Timestamp {
    Timestamp(d.and_utc().timestamp_millis())
}

/// Reads the pickers; an unknown value is a message for the page. The
/// defaults: `1h` (or the plan's finest, if coarser), 7 days (or the
/// plan's lookback), ending today (or the day the market closed), the book
/// at the range's end (or now, if earlier).
fn view(
    form: &[(String, String)],
    plan: &Plan,
    now: Timestamp,
    closed_at: Option<Timestamp>,
) -> Result<View, String> {
    let allowed = resolutions(plan);
    let resolution = match field(form, "resolution") {
        Some(text) => Resolution::parse(text).ok_or_else(|| {
            format!(
                "resolution {text:?} is not one of {}",
                Resolution::allowed_list()
            )
        })?,
        None => allowed
            .iter()
            .copied()
            .find(|r| *r == Resolution::H1)
            .or_else(|| allowed.first().copied())
            .unwrap_or(Resolution::D1),
    };
    let days = match field(form, "range") {
        Some(text) => text
            .strip_suffix('d')
            .and_then(|d| d.parse::<u32>().ok())
            .filter(|d| RANGES.contains(d))
            .ok_or_else(|| {
                let list: Vec<String> = RANGES.iter().map(|d| format!("{d}d")).collect();
                format!("range {text:?} is not one of {}", list.join(", "))
            })?,
        None => ranges(plan).into_iter().rfind(|d| *d <= 7).unwrap_or(1),
    };
    let end_day = match field(form, "end") {
        Some(text) => NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .map_err(|_| format!("end {text:?} is not a date (YYYY-MM-DD)"))?,
        None => day_of(closed_at.map_or(now, |c| c.min(now))),
    };
    let end = millis(
        end_day
            .succ_opt()
            .ok_or("end is past the calendar")?
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists"),
    );
    let start = Timestamp(end.0 - i64::from(days) * DAY_MS);
    let book_at = match field(form, "book_at") {
        Some(text) => NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M")
            .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S"))
            .map(millis)
            .map_err(|_| format!("book time {text:?} is not a time (YYYY-MM-DDTHH:MM, UTC)"))?,
        None => Timestamp((end.0 - 60_000).min(now.0).div_euclid(60_000) * 60_000),
    };
    Ok(View {
        days,
        resolution,
        start,
        end,
        end_day,
        book_at,
    })
}

fn pickers(action: &str, plan: &Plan, form: &[(String, String)], view: Option<&View>) -> String {
    let ranges: Vec<(String, String)> = ranges(plan)
        .into_iter()
        .map(|d| {
            (
                format!("{d}d"),
                format!("{d} day{}", if d == 1 { "" } else { "s" }),
            )
        })
        .collect();
    let ranges: Vec<(&str, &str)> = ranges
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let res: Vec<(&str, &str)> = resolutions(plan)
        .into_iter()
        .map(|r| (r.as_str(), r.as_str()))
        .collect();
    let days = view.map(|v| format!("{}d", v.days));
    let end = view.map(|v| v.end_day.format("%Y-%m-%d").to_string());
    let book = view.and_then(|v| {
        DateTime::<Utc>::from_timestamp_millis(v.book_at.0)
            .map(|d| d.format("%Y-%m-%dT%H:%M").to_string())
    });
    let mut out = format!(
        r#"<form class="filters" method="get" action="{}" aria-label="Range, resolution and book time">"#,
        esc(action)
    );
    out.push_str(&select(
        "range",
        "Range",
        &ranges,
        days.as_deref().or(field(form, "range")),
    ));
    out.push_str(&select(
        "resolution",
        "Resolution",
        &res,
        view.map(|v| v.resolution.as_str())
            .or(field(form, "resolution")),
    ));
    out.push_str(&input(
        "end",
        "Ending on (UTC)",
        "date",
        end.as_deref().or(field(form, "end")),
        "YYYY-MM-DD",
    ));
    out.push_str(&input(
        "book_at",
        "Order book at (UTC)",
        "datetime-local",
        book.as_deref().or(field(form, "book_at")),
        "YYYY-MM-DDTHH:MM",
    ));
    out.push_str(r#"<div class="submit"><button type="submit">Show</button></div></form>"#);
    out
}

fn plan_line(plan: &Plan) -> String {
    format!(
        r#"<p class="muted" id="plan-limits">Your organization's plan <strong>{}</strong> allows resolutions down to <code>{}</code> and {} days of history; the pickers offer only those.</p>"#,
        esc(&plan.name),
        plan.finest.as_str(),
        plan.max_history_days
    )
}

/// The points `(t, value of field)` of a history page's `data`.
fn series(body: &Value, field: &str) -> Vec<(Timestamp, f64)> {
    body["data"]
        .as_array()
        .map(|data| {
            data.iter()
                .filter_map(|p| Some((t_of(&p["t"])?, p[field].as_f64()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn levels(v: &Value) -> Vec<(f64, f64)> {
    v.as_array()
        .map(|levels| {
            levels
                .iter()
                .filter_map(|l| Some((l[0].as_f64()?, l[1].as_f64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// A note when the range had more points than one page.
fn more(body: &Value) -> &'static str {
    if body["metadata"]["next_cursor"].is_string() {
        r#"<p class="muted">The range has more points than one page: this is its first page. A shorter range or a coarser resolution shows it whole.</p>"#
    } else {
        ""
    }
}

/// `/dashboard/markets/{id_or_slug}`: a market's charts and requests.
pub async fn market(
    State(state): State<ApiState>,
    Path(id_or_slug): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, DashError> {
    let x = match Explorer::open(state, &headers, raw).await? {
        Ok(x) => x,
        Err(redirect) => return Ok(redirect),
    };
    let detail = V1Request::new(Route::Market(id_or_slug.clone()), &[]);
    let found = x.send(&detail).await;
    if found.status == 404 {
        return Err(DashError::NotFound(found.detail()));
    }
    let m = &found.body;
    let market_id = m["id"].as_str().unwrap_or(&id_or_slug).to_string();
    let question = m["question"].as_str().unwrap_or(&market_id).to_string();
    let action = format!("/dashboard/markets/{}", v1::segment(&market_id));
    let mut body = format!(
        r#"<p><a href="/dashboard/markets">← All markets</a></p><section class="card"><h1>{}</h1><p class="muted">Market <code>{}</code> · slug <code>{}</code> · {}</p>"#,
        esc(&question),
        esc(&market_id),
        esc(m["slug"].as_str().unwrap_or("-")),
        esc(m["status"].as_str().unwrap_or("-")),
    );
    if !found.ok() {
        body.push_str(&refusal(&found));
    }
    let plan = &x.caller.plan;
    body.push_str(&plan_line(plan));
    let view = view(&x.form, plan, x.caller.now, t_of(&m["closed_at"]));
    body.push_str(&pickers(&action, plan, &x.form, view.as_ref().ok()));
    // The market's own request is not a chart's: folded, so that the
    // charts come first.
    let _ = write!(
        body,
        r#"<details class="request-of"><summary>The <code>/v1</code> request of this market</summary>{}</details></section>"#,
        request_panel("market", &detail, &x.base)
    );
    let view = match view {
        Ok(view) => view,
        Err(why) => {
            let _ = write!(
                body,
                r#"<p class="card error" role="alert">{}</p>"#,
                esc(&why)
            );
            return Ok(x.page(StatusCode::BAD_REQUEST, &question, &body));
        }
    };
    let range = [
        ("start_ts", (view.start.0 / 1000).to_string()),
        ("end_ts", (view.end.0 / 1000).to_string()),
        ("resolution", view.resolution.as_str().to_string()),
        ("limit", HISTORY_LIMIT_MAX.to_string()),
    ];
    let span = (view.start, view.end);
    let res = view.resolution.as_str();
    let empty = Vec::new();
    for (i, token) in m["tokens"].as_array().unwrap_or(&empty).iter().enumerate() {
        let id = token["id"].as_str().unwrap_or_default().to_string();
        let label = token["label"].as_str().unwrap_or(&id).to_string();
        let n = format!("prices-{i}");
        let prices = V1Request::new(Route::TokenPrices(id.clone()), &range);
        let what = format!("Price of {label} at {res}");
        body.push_str(
            &x.card(&n, &format!("Price of “{label}”"), &prices, |page| {
                charts::line(&n, &what, &series(page, "p"), span, Some((0.0, 1.0))) + more(page)
            })
            .await,
        );
        let n = format!("book-{i}");
        let ts = (view.book_at.0 / 1000).to_string();
        let book = V1Request::new(Route::TokenBook(id), &[("ts", ts)]);
        body.push_str(
            &x.card(&n, &format!("Order book of “{label}”"), &book, |book| {
                let at = t_of(&book["t"]).map_or_else(|| "-".into(), html::when);
                let what = format!("Order book of {label}, snapshot of {at}");
                format!(
                    r#"{}<p class="muted">The latest snapshot at or before {}: taken {}.</p>"#,
                    charts::depth(&n, &what, &levels(&book["bids"]), &levels(&book["asks"])),
                    esc(&html::when(view.book_at)),
                    esc(&at)
                )
            })
            .await,
        );
    }
    let metrics = V1Request::new(Route::MarketMetrics(market_id), &range);
    body.push_str(
        &x.card("metrics", "Metrics", &metrics, |page| {
            let mut out = String::new();
            for name in ["volume", "liquidity", "spread"] {
                let what = format!("Market {name} at {res}");
                let chart = charts::line(
                    &format!("metrics-{name}"),
                    &what,
                    &series(page, name),
                    span,
                    None,
                );
                let _ = write!(out, "<h3>{name}</h3>{chart}");
            }
            out + more(page)
        })
        .await,
    );
    Ok(x.page(StatusCode::OK, &question, &body))
}
