//! Real headless Chromium for the dashboard's browser tests (Debian's
//! `chromium` and `chromium-driver`, installed by
//! `scripts/install-tools.sh`), and the browser flows those tests share,
//! whichever deployment serves the dashboard: the in-process one
//! (`tests/app/dashboard_browser.rs`) and the distributed one on Kafka and
//! Cassandra (`tests/distributed_dashboard.rs`). Included by `#[path]`, so
//! it depends on neither test binary's helpers.
//!
//! Without Chromium, chromedriver or the official client's virtualenv the
//! tests fail and say what to install: a browser test that did not run
//! must not pass.
#![allow(dead_code)]

use fantoccini::{Client, ClientBuilder, Locator};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "chromedriver";
pub const PASSWORD: &str = "a long enough password";

/// 2025-09-01T00:00:00Z, in Unix seconds: the day of [`fixture`].
pub const DAY: i64 = 1_756_684_800;
/// Price ticks of `{m}-yes` (one a minute from [`DAY`]) and of `{m}-no`.
pub const YES_POINTS: usize = 30;
pub const NO_POINTS: usize = 12;
/// The market page's pickers for the fixture's day at `1m`, the book
/// after its snapshot.
pub const DAY_VIEW: &str = "?range=1d&resolution=1m&end=2025-09-01&book_at=2025-09-01T00:20";

/// The lines of a market `m` (tokens `{m}-yes` "Yes" and `{m}-no` "No")
/// with prices on both tokens, one book snapshot of `{m}-yes` (3 bid and
/// 2 ask levels) and 5 minutes of metrics.
pub fn fixture(m: &str) -> String {
    let mut lines = vec![format!(
        r#"{{"kind":"market","id":"{m}","slug":"{m}-slug","question":"Will {m} happen?","status":"open","tokens":[{{"id":"{m}-yes","label":"Yes"}},{{"id":"{m}-no","label":"No"}}],"updated_at":"2025-08-15T00:00:00Z"}}"#
    )];
    let price = |token: &str, ts: i64, p: f64| {
        format!(r#"{{"kind":"price","market_id":"{m}","token_id":"{token}","ts":{ts},"p":{p}}}"#)
    };
    for i in 0..YES_POINTS as i64 {
        lines.push(price(
            &format!("{m}-yes"),
            DAY + i * 60,
            0.3 + i as f64 / 100.0,
        ));
    }
    for i in 0..NO_POINTS as i64 {
        lines.push(price(&format!("{m}-no"), DAY + i * 60, 0.6));
    }
    lines.push(format!(
        r#"{{"kind":"book","market_id":"{m}","token_id":"{m}-yes","ts":{},"bids":[[0.45,10],[0.44,20],[0.4,5]],"asks":[[0.55,7],[0.6,3]]}}"#,
        DAY + 600
    ));
    for i in 0..5 {
        lines.push(format!(
            r#"{{"kind":"metrics","market_id":"{m}","ts":{},"volume":{},"liquidity":5,"spread":0.1}}"#,
            DAY + i * 60,
            10 + i
        ));
    }
    lines.join("\n")
}

pub fn venv_python() -> PathBuf {
    let venv = std::env::var("HINDSIGHT_VENV").map_or_else(
        |_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/hindsight-venv"),
        PathBuf::from,
    );
    venv.join("bin/python")
}

/// `$HINDSIGHT_SCREENSHOTS`, default `target/dashboard-screenshots`.
pub fn screenshots_dir() -> PathBuf {
    let dir = std::env::var("HINDSIGHT_SCREENSHOTS").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// chromedriver on a free loopback port; killed when dropped.
pub struct Driver {
    child: Child,
    pub url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn start_driver() -> Driver {
    for (tool, path) in [("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)] {
        let found = Command::new(path)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            found,
            "{tool} ({path}) is missing: the dashboard's browser test needs Debian's `chromium` \
             and `chromium-driver` (scripts/install-tools.sh installs them)"
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromedriver");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let status = format!("{}/status", driver.url);
    let deadline = Instant::now() + Duration::from_secs(20);
    while reqwest::get(&status).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver never answered on {}",
            driver.url
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver
}

/// A headless Chromium session through `driver`.
pub async fn session(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,900"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session through chromedriver")
}

/// Saves a screenshot of the page as `dir/name` (a PNG of some size).
pub async fn shot(browser: &Client, dir: &Path, name: &str) {
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 5_000, "{name}");
    std::fs::write(dir.join(name), png).unwrap();
}

/// Runs Python `code` in the official client's virtualenv with
/// `HINDSIGHT_API_KEY` set to `key` and `args` after it; its stdout.
pub fn python(code: &str, key: &str, args: &[&str]) -> String {
    let python = venv_python();
    assert!(
        python.exists(),
        "{} is missing: the browser test calls the API through the official Python client \
         (scripts/install-tools.sh creates the virtualenv with polymarketdata-sdk)",
        python.display()
    );
    let out = Command::new(python)
        .arg("-c")
        .arg(code)
        .args(args)
        .env("HINDSIGHT_API_KEY", key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python client failed: {}\n{code}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Whether asking an element of the page before a click failed because
/// that page is gone: WebDriver's stale element reference, or, while
/// chromedriver is between the two documents, Chrome's inspector saying
/// the node "does not belong to the document" (seen once in CI).
fn is_gone(e: &fantoccini::error::CmdError) -> bool {
    e.is_stale_element_reference() || e.to_string().contains("does not belong to the document")
}

/// Clicks the element `css` (a form's submit: every click here loads a
/// page) and waits for `then` on the page it leads to. It first waits for
/// the page it was on to be gone (that page's root stale): `then` may be
/// on that page too — the explore page lists the market a search then
/// finds — and an element found there goes stale in the caller's hands.
pub async fn click_then(
    browser: &Client,
    css: &str,
    then: Locator<'_>,
    what: &str,
) -> fantoccini::elements::Element {
    let old = browser.find(Locator::Css("html")).await.unwrap();
    browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} to click: {e}"))
        .click()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match old.tag_name().await {
            Err(e) if is_gone(&e) => break,
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: clicking {css} loaded no page in 10 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    browser
        .wait()
        .for_element(then)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Follows a sign-in link and sets the password: the keys page. With
/// `shot_as`, a screenshot of the filled form.
pub async fn set_password(browser: &Client, link: &str, shot_as: Option<(&Path, &str)>) {
    browser.goto(link).await.unwrap();
    for field in ["password", "again"] {
        browser
            .find(Locator::Id(field))
            .await
            .unwrap()
            .send_keys(PASSWORD)
            .await
            .unwrap();
    }
    if let Some((dir, name)) = shot_as {
        shot(browser, dir, name).await;
    }
    click_then(
        browser,
        "form[action='/dashboard/link'] button[type=submit]",
        Locator::Id("key-name"),
        "the keys page after setting the password",
    )
    .await;
}

/// Creates a key named `name` on the keys page: the secret shown once.
pub async fn create_key(browser: &Client, name: &str) -> String {
    browser
        .find(Locator::Id("key-name"))
        .await
        .unwrap()
        .send_keys(name)
        .await
        .unwrap();
    let key = click_then(
        browser,
        "form[action='/dashboard/keys'] button[type=submit]",
        Locator::Id("new-key"),
        "the new key shown",
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(key.starts_with("hsk_") && key.len() == 68, "{key}");
    key
}

/// Explore, signed in on `base`: search for `market` from the nav's
/// Explore link, open it from the results, show the range `view` (a
/// query string of the market page's pickers), and see token 0's price
/// chart with `points` points; then run the Python snippet printed beside
/// the chart with `key` and get the same points. Screenshots
/// `{prefix}-search.png` and `{prefix}-market.png`.
pub async fn explore_market(
    browser: &Client,
    base: &str,
    market: &str,
    view: &str,
    points: usize,
    key: &str,
    (shots, prefix): (&Path, &str),
) {
    browser.goto(&format!("{base}/dashboard")).await.unwrap();
    browser
        .find(Locator::LinkText("Explore"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let search = browser
        .wait()
        .for_element(Locator::Id("search"))
        .await
        .unwrap();
    search.send_keys(market).await.unwrap();
    let link = click_then(
        browser,
        "form[role=search] button[type=submit]",
        Locator::Css(&format!("#markets a[href='/dashboard/markets/{market}']")),
        "the market among the search results",
    )
    .await;
    shot(browser, shots, &format!("{prefix}-search.png")).await;
    link.click().await.unwrap();
    browser
        .wait()
        .for_element(Locator::Id("prices-0"))
        .await
        .expect("the market page with a price chart");
    browser
        .goto(&format!("{base}/dashboard/markets/{market}{view}"))
        .await
        .unwrap();
    let chart = browser
        .wait()
        .for_element(Locator::Id("prices-0"))
        .await
        .unwrap();
    let drawn = browser
        .find_all(Locator::Css("#prices-0 circle.pt"))
        .await
        .unwrap()
        .len();
    assert_eq!(drawn, points, "points drawn on the price chart");
    let label = chart.attr("aria-label").await.unwrap().unwrap_or_default();
    assert!(
        label.contains(&format!(": {points} points from ")),
        "{label}"
    );
    shot(browser, shots, &format!("{prefix}-market.png")).await;
    // The chart's card, scrolled into view: the chart and its request.
    let card = browser
        .find(Locator::XPath("//section[.//*[@id='prices-0']]"))
        .await
        .unwrap();
    let png = card.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 5_000);
    std::fs::write(shots.join(format!("{prefix}-price-chart.png")), png).unwrap();
    // The snippet beside the chart, run as printed, fetches what is drawn.
    let snippet = browser
        .find(Locator::Id("py-prices-0"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let out = python(&format!("{snippet}\nprint(len(page.data))\n"), key, &[]);
    assert_eq!(
        out.trim(),
        points.to_string(),
        "the Python snippet's points"
    );
}
