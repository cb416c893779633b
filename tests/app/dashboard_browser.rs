//! The dashboard in real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `scripts/install-tools.sh`), driven over
//! WebDriver: follow a sign-in link, set a password, create a key, call
//! `/v1` with it through the official Python client, watch the usage chart
//! move, explore a market and its price chart (run the Python snippet shown
//! beside it), revoke the key and see the client get 401. Screenshots of
//! each step go to `$HINDSIGHT_SCREENSHOTS` (default
//! `target/dashboard-screenshots`). The same flows run against the
//! distributed deployment in `tests/distributed_dashboard.rs`.
//!
//! Without Chromium, chromedriver or the client's virtualenv the test fails
//! and says what to install: a browser test that did not run must not pass.

#[path = "../common/browser.rs"]
pub mod chromium;

use crate::dashboard::create_account;
use crate::helpers::*;
use chromium::{fixture, DAY_VIEW, YES_POINTS};
use chromium::{python as run_python, screenshots_dir, session, shot, start_driver};
use fantoccini::Locator;

/// Runs the official client against the app with `key`: `script` ends by
/// printing one line of JSON.
fn python(base: &str, key: &str, script: &str) -> serde_json::Value {
    let prelude = "import json, sys\n\
        from polymarketdata import PolymarketDataClient\n\
        from polymarketdata.errors import AuthenticationError\n\
        client = PolymarketDataClient(api_key=sys.argv[2], base_url=sys.argv[1] + '/v1', max_retries=0)\n";
    let stdout = run_python(&format!("{prelude}{script}"), key, &[base, key]);
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_new_owner_sets_a_password_creates_a_key_uses_it_from_python_explores_and_revokes_it(
) {
    let driver = start_driver().await;
    let shots = screenshots_dir();
    println!("dashboard screenshots: {}", shots.display());

    let app = spawn_app("dash-browser").await;
    assert_eq!(ingest(&app, fixture("mb")).await.0, 200);
    wait_for(&app, "/v1/markets/mb", |_| true).await;
    let link = create_account(
        &app.data_dir,
        "browsers",
        "owner@browsers.example",
        "pro",
        &app.api,
    );
    let browser = session(&driver).await;

    // The sign-in link: set a password.
    chromium::set_password(&browser, &link, Some((&shots, "01-set-password.png"))).await;
    assert_eq!(browser.current_url().await.unwrap().path(), "/dashboard");
    shot(&browser, &shots, "02-signed-in.png").await;

    // Create a key: shown once.
    let key = chromium::create_key(&browser, "research notebook").await;
    assert!(browser
        .find(Locator::Css("button[data-copy='new-key']"))
        .await
        .is_ok());
    shot(&browser, &shots, "03-key-created.png").await;

    let total = |browser: fantoccini::Client| async move {
        browser
            .goto(&format!("{}/dashboard/usage", app_base(&browser).await))
            .await
            .unwrap();
        browser
            .find(Locator::Id("usage-total"))
            .await
            .unwrap()
            .attr("data-total")
            .await
            .unwrap()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(total(browser.clone()).await, 0);

    // The official client, with the key from the page.
    let seen = python(
        &app.api,
        &key,
        "health = client.utility.health()\n\
         markets = client.discovery.list_markets(limit=10)\n\
         market = client.discovery.get_market('mb')\n\
         print(json.dumps({'markets': [m.id for m in markets.data]}))\n",
    );
    assert_eq!(seen["markets"], serde_json::json!(["mb"]));
    // The usage chart moved: three requests, all 2xx.
    assert_eq!(total(browser.clone()).await, 3);
    let bars = browser
        .find_all(Locator::Css("#usage-total rect.s2xx"))
        .await
        .unwrap();
    assert_eq!(bars.len(), 1);
    shot(&browser, &shots, "04-usage.png").await;

    // Explore: the market's price chart, and its snippet run with the key.
    chromium::explore_market(
        &browser,
        &app.api,
        "mb",
        DAY_VIEW,
        YES_POINTS,
        &key,
        (&shots, "06-explore"),
    )
    .await;

    // Revoke it from the keys page: the client is refused at once.
    browser
        .goto(&format!("{}/dashboard", app.api))
        .await
        .unwrap();
    chromium::click_then(
        &browser,
        "button[aria-label='Revoke research notebook']",
        Locator::Css("span.badge.revoked"),
        "the key shown revoked",
    )
    .await;
    shot(&browser, &shots, "05-revoked.png").await;
    let refused = python(
        &app.api,
        &key,
        "try:\n    client.utility.health()\n    print(json.dumps({'status': 200}))\n\
         except AuthenticationError as e:\n    print(json.dumps({'status': e.status_code, 'message': str(e)}))\n",
    );
    assert_eq!(refused["status"], 401, "{refused}");
    browser.close().await.unwrap();
    drop(driver);
}

/// The scheme, host and port the browser is on.
async fn app_base(browser: &fantoccini::Client) -> String {
    let url = browser.current_url().await.unwrap();
    format!("{}://{}", url.scheme(), url.host_str().unwrap())
        + &url.port().map_or(String::new(), |p| format!(":{p}"))
}
