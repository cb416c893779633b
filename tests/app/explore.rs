//! The explorer's pages over HTTP: the search and a market's charts are
//! drawn from the `/v1` request printed beside them (asking that request
//! with a key gets the points drawn), the pickers offer what the plan
//! allows, and what it does not is explained on the page.

use crate::dashboard::{between, create_account, Browser};
use crate::dashboard_browser::chromium::{fixture, DAY, DAY_VIEW, NO_POINTS, YES_POINTS};
use crate::helpers::*;

/// A signed-in browser of a new organization on `plan`.
async fn signed_in(app: &TestApp, org: &str, plan: &str) -> Browser {
    let link = create_account(
        &app.data_dir,
        org,
        &format!("owner@{org}.example"),
        plan,
        &app.api,
    );
    let mut browser = Browser::new(&app.api);
    assert_eq!(
        browser
            .set_password(&link, "a long enough password")
            .await
            .status,
        303
    );
    browser
}

fn unescape(text: &str) -> String {
    text.replace("&amp;", "&")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
}

/// The `/v1` path and query printed beside chart `n`.
pub fn v1_of(page: &str, n: &str) -> String {
    let shown = between(page, &format!(r#"id="v1-{n}">GET "#), "</code>")
        .unwrap_or_else(|| panic!("no request {n} on the page"));
    unescape(&shown)
}

/// The SVG element `id` of the page.
pub fn svg(page: &str, id: &str) -> String {
    between(page, &format!(r#"id="{id}""#), "</svg>")
        .unwrap_or_else(|| panic!("no chart {id} on the page: {page}"))
}

async fn seeded(name: &str) -> TestApp {
    let app = spawn_app(name).await;
    assert_eq!(ingest(&app, fixture("ex")).await.0, 200);
    wait_for(
        &app,
        &format!(
            "/v1/tokens/ex-yes/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=200",
            DAY + 86_400
        ),
        |b| b["data"].as_array().is_some_and(|d| d.len() == YES_POINTS),
    )
    .await;
    wait_for(
        &app,
        &format!(
            "/v1/markets/ex/metrics?start_ts={DAY}&end_ts={}&resolution=1m",
            DAY + 86_400
        ),
        |b| b["data"].as_array().is_some_and(|d| d.len() == 5),
    )
    .await;
    app
}

#[tokio::test]
async fn explore_pages_send_a_browser_without_a_session_to_sign_in() {
    let app = spawn_app("explore-auth").await;
    let mut browser = Browser::new(&app.api);
    for path in ["/dashboard/markets", "/dashboard/markets/ex"] {
        let page = browser.get(path).await;
        assert_eq!(
            (page.status, page.location()),
            (303, Some("/dashboard/sign-in")),
            "{path}"
        );
    }
}

#[tokio::test]
async fn each_chart_draws_the_points_its_printed_v1_request_answers() {
    let app = seeded("explore-draws").await;
    let key = app.key("pro").await;
    let mut browser = signed_in(&app, "drawers", "pro").await;
    let page = browser
        .get(&format!("/dashboard/markets/ex{DAY_VIEW}"))
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let html = page.body;
    assert!(html.contains(r#"<a href="/dashboard/markets">Explore</a>"#));

    // Prices of each token: as many circles as the request's points.
    for (n, token, points) in [
        ("prices-0", "ex-yes", YES_POINTS),
        ("prices-1", "ex-no", NO_POINTS),
    ] {
        let request = v1_of(&html, n);
        assert_eq!(
            request,
            format!(
                "/v1/tokens/{token}/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=200",
                DAY + 86_400
            )
        );
        let (status, _, body) = get_as(&app, Some(&key), &request).await;
        assert_eq!(status, 200, "{body}");
        let answered = body["data"].as_array().unwrap().len();
        let chart = svg(&html, n);
        assert_eq!(answered, points);
        assert_eq!(
            chart.matches(r#"<circle class="pt""#).count(),
            answered,
            "{chart}"
        );
        assert!(chart.contains(&format!(r#"data-points="{answered}""#)));
        // The snippets ask exactly that request.
        let curl = between(&html, &format!(r#"id="curl-{n}"><code>"#), "</code>").unwrap();
        assert_eq!(
            unescape(&curl),
            format!(
                "curl -sS -H \"X-API-Key: $HINDSIGHT_API_KEY\" '{}{request}'",
                app.api
            )
        );
        let python =
            unescape(&between(&html, &format!(r#"id="py-{n}"><code>"#), "</code>").unwrap());
        assert!(
            python.contains(&format!(
                "page = client.history.get_token_prices(\n    \"{token}\",\n    start_ts={DAY},\n    end_ts={},\n    resolution=\"1m\",\n    limit=200,\n)",
                DAY + 86_400
            )),
            "{python}"
        );
        assert!(
            python.contains(&format!("base_url=\"{}/v1\"", app.api)),
            "{python}"
        );
    }
    // The last price drawn is the last price answered, in the chart's name.
    assert!(svg(&html, "prices-0").contains("30 points from 2025-09-01 00:00 to 2025-09-01 00:29 UTC; lowest 0.3, highest 0.59, last 0.59"));

    // The book at 00:20 is the snapshot of 00:10: 3 bid and 2 ask levels.
    let request = v1_of(&html, "book-0");
    assert_eq!(
        request,
        format!("/v1/tokens/ex-yes/book?ts={}", DAY + 1_200)
    );
    let (status, _, body) = get_as(&app, Some(&key), &request).await;
    assert_eq!(status, 200, "{body}");
    let depth = svg(&html, "book-0");
    assert_eq!(
        depth.matches(r#"<circle class="lvl bid""#).count(),
        body["bids"].as_array().unwrap().len()
    );
    assert_eq!(
        depth.matches(r#"<circle class="lvl ask""#).count(),
        body["asks"].as_array().unwrap().len()
    );
    assert!(
        depth.contains(
            "3 bid levels (best 0.45, 35 in total), 2 ask levels (best 0.55, 10 in total)"
        ),
        "{depth}"
    );
    // No snapshot of the other token: said, not drawn.
    assert!(html.contains(r#"id="book-1-none">No book snapshot of token ex-no at or before"#));

    // Metrics: one request, a chart per metric.
    let request = v1_of(&html, "metrics");
    let (status, _, body) = get_as(&app, Some(&key), &request).await;
    assert_eq!(status, 200, "{body}");
    for name in ["volume", "liquidity", "spread"] {
        let chart = svg(&html, &format!("metrics-{name}"));
        assert_eq!(
            chart.matches(r#"<circle class="pt""#).count(),
            body["data"].as_array().unwrap().len()
        );
    }
    assert!(svg(&html, "metrics-volume").contains("lowest 10, highest 14, last 14"));
}

#[tokio::test]
async fn the_pickers_offer_what_the_plan_allows_and_the_page_explains_a_refusal() {
    let app = seeded("explore-plans").await;
    let mut browser = signed_in(&app, "thrifty", "free").await;
    let html = browser.get("/dashboard/markets/ex").await.body;
    let resolutions = between(
        &html,
        r#"<select id="resolution" name="resolution">"#,
        "</select>",
    )
    .unwrap();
    for allowed in ["1h", "6h", "1d"] {
        assert!(
            resolutions.contains(&format!(r#"value="{allowed}""#)),
            "{resolutions}"
        );
    }
    for finer in ["1m", "5m", "15m"] {
        assert!(
            !resolutions.contains(&format!(r#"value="{finer}""#)),
            "{resolutions}"
        );
    }
    assert!(resolutions.contains(r#"<option value="1h" selected>"#));
    let ranges = between(&html, r#"<select id="range" name="range">"#, "</select>").unwrap();
    assert!(
        ranges.contains(r#"value="30d""#) && !ranges.contains(r#"value="90d""#),
        "{ranges}"
    );
    assert!(html.contains("allows resolutions down to <code>1h</code> and 30 days of history"));

    // A finer resolution asked in the address: the API's refusal, on the page.
    let page = browser.get("/dashboard/markets/ex?resolution=1m").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains(r#"data-status="403">Your plan does not allow resolution 1m; the finest allowed is 1h.</p>"#),
        "{}",
        page.body
    );
    // So is a range past its lookback.
    let page = browser.get("/dashboard/markets/ex?range=90d").await;
    assert!(
        page.body
            .contains("start_ts is beyond your plan&#39;s lookback of 30 days."),
        "{}",
        page.body
    );
    // Pickers that make no sense: said which and why, with the form.
    let page = browser
        .get("/dashboard/markets/ex?range=2d&resolution=1h")
        .await;
    assert_eq!(page.status, 400);
    assert!(
        page.body
            .contains(r#"range &quot;2d&quot; is not one of 1d, 7d, 30d, 90d, 365d"#),
        "{}",
        page.body
    );
    let page = browser.get("/dashboard/markets/ex?end=yesterday").await;
    assert_eq!(page.status, 400);
    assert!(
        page.body.contains("is not a date (YYYY-MM-DD)"),
        "{}",
        page.body
    );
    // An unknown market: the API's 404, as a page.
    let page = browser.get("/dashboard/markets/nope").await;
    assert_eq!(page.status, 404);
    assert!(page.body.contains("Market not found"));
}

#[tokio::test]
async fn the_explorers_requests_take_from_the_organizations_rate_limit() {
    let app = seeded("explore-rate").await;
    let mut browser = signed_in(&app, "busy", "free").await;
    // The free plan's 60 requests a minute (the test clock stands still):
    // each market page asks several, so a dozen loads must reach the limit.
    let first = browser.get("/dashboard/markets/ex").await.body;
    assert!(!first.contains(r#"data-status="429""#), "{first}");
    let mut limited = None;
    for load in 2..=20 {
        let page = browser.get("/dashboard/markets/ex").await.body;
        if page.contains(r#"data-status="429""#) {
            limited = Some((load, page));
            break;
        }
    }
    let (load, page) = limited.expect("20 market pages never met the free plan's limit");
    assert!(load > 2, "limited at load {load}");
    assert!(
        page.contains("rate limit exceeded, try again later"),
        "{page}"
    );
    // The organization's count is its own: a key's requests still pass.
    let (status, _, _) = get_as(&app, Some(API_KEY), "/v1/markets/ex").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_search_takes_the_v1_markets_filters_and_pages_through_them() {
    let app = spawn_app("explore-search").await;
    let lines = ["s1", "s2", "s3"].map(market_line).join("\n");
    assert_eq!(ingest(&app, lines).await.0, 200);
    wait_for(&app, "/v1/markets?limit=10", |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 3)
    })
    .await;
    let key = app.key("pro").await;
    let mut browser = signed_in(&app, "searchers", "pro").await;

    let page = browser
        .get("/dashboard/markets?search=&limit=2&sort=start_date&order=asc")
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let request = v1_of(&page.body, "markets");
    assert_eq!(request, "/v1/markets?limit=2&sort=start_date&order=asc");
    let (_, _, body) = get_as(&app, Some(&key), &request).await;
    let table = between(&page.body, r#"<table id="markets">"#, "</table>").unwrap();
    for m in body["data"].as_array().unwrap() {
        let id = m["id"].as_str().unwrap();
        assert!(
            table.contains(&format!(
                r#"<a href="/dashboard/markets/{id}">Will {id} happen?</a>"#
            )),
            "{table}"
        );
    }
    assert_eq!(table.matches("<tr><td>").count(), 2);
    let python = unescape(&between(&page.body, r#"id="py-markets"><code>"#, "</code>").unwrap());
    assert!(python.contains("page = client.discovery.list_markets(\n    limit=2,\n    sort=\"start_date\",\n    order=\"asc\",\n)"), "{python}");

    // The next page: the third market.
    let next = unescape(&between(&page.body, r#"id="next-page" href=""#, "\"").unwrap());
    let page = browser.get(&next).await;
    let table = between(&page.body, r#"<table id="markets">"#, "</table>").unwrap();
    assert_eq!(table.matches("<tr><td>").count(), 1, "{table}");
    assert!(!page.body.contains("id=\"next-page\""));

    // A search and a filter the client has no argument for.
    let page = browser
        .get("/dashboard/markets?search=s2&tags=politics&tags_match=all")
        .await;
    let request = v1_of(&page.body, "markets");
    assert_eq!(
        request,
        "/v1/markets?search=s2&limit=25&sort=updated_at&order=desc&tags=politics&tags_match=all"
    );
    let python = unescape(&between(&page.body, r#"id="py-markets"><code>"#, "</code>").unwrap());
    assert!(python.contains("# polymarketdata-sdk 0.1.0's list_markets has no argument for: tags, tags_match (the curl sends them)"), "{python}");
    assert!(page.body.contains("No market matches."));

    // What /v1 refuses, the page explains.
    let page = browser.get("/dashboard/markets?limit=0").await;
    assert_eq!(page.status, 400);
    assert!(
        page.body.contains(r#"data-status="422">limit: "#),
        "{}",
        page.body
    );
}
