//! The dashboard in real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `scripts/install-tools.sh`), driven over
//! WebDriver: follow a sign-in link, set a password, create a key, call
//! `/v1` with it through the official Python client, watch the usage chart
//! move, revoke the key and see the client get 401. Screenshots of each
//! step go to `$HINDSIGHT_SCREENSHOTS` (default `target/dashboard-screenshots`).
//!
//! Without Chromium, chromedriver or the client's virtualenv the test fails
//! and says what to install: a browser test that did not run must not pass.

use crate::dashboard::create_account;
use crate::helpers::*;
use fantoccini::{ClientBuilder, Locator};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "chromedriver";
const PASSWORD: &str = "a long enough password";

fn venv_python() -> PathBuf {
    let venv = std::env::var("HINDSIGHT_VENV").map_or_else(
        |_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/hindsight-venv"),
        PathBuf::from,
    );
    venv.join("bin/python")
}

fn screenshots_dir() -> PathBuf {
    let dir = std::env::var("HINDSIGHT_SCREENSHOTS").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// chromedriver on a free loopback port; killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_driver() -> Driver {
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
    let port = port0().await.local_addr().unwrap().port();
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
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client().get(&status).send().await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "chromedriver never answered on {}",
            driver.url
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver
}

/// Runs the official client against the app with `key`: `script` ends by
/// printing one line of JSON.
fn python(base: &str, key: &str, script: &str) -> serde_json::Value {
    let python = venv_python();
    assert!(
        python.exists(),
        "{} is missing: the browser test calls the API through the official Python client \
         (scripts/install-tools.sh creates the virtualenv with polymarketdata-sdk)",
        python.display()
    );
    let prelude = "import json, sys\n\
        from polymarketdata import PolymarketDataClient\n\
        from polymarketdata.errors import AuthenticationError\n\
        client = PolymarketDataClient(api_key=sys.argv[2], base_url=sys.argv[1] + '/v1', max_retries=0)\n";
    let out = Command::new(python)
        .arg("-c")
        .arg(format!("{prelude}{script}"))
        .arg(base)
        .arg(key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_new_owner_sets_a_password_creates_a_key_uses_it_from_python_and_revokes_it()
{
    let driver = start_driver().await;
    let shots = screenshots_dir();
    println!("dashboard screenshots: {}", shots.display());

    let app = spawn_app("dash-browser").await;
    let mut lines = vec![market_line("mb")];
    for i in 0..30 {
        lines.push(price_line("mb", "mb-yes", 1_756_684_800 + i * 60, 0.5));
    }
    assert_eq!(ingest(&app, lines.join("\n")).await.0, 200);
    wait_for(&app, "/v1/markets/mb", |_| true).await;
    let link = create_account(
        &app.data_dir,
        "browsers",
        "owner@browsers.example",
        "pro",
        &app.api,
    );

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
    let browser = ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session through chromedriver");
    let shot = |name: &'static str| {
        let browser = browser.clone();
        let path = shots.join(name);
        async move {
            let png = browser.screenshot().await.unwrap();
            std::fs::write(&path, png).unwrap();
        }
    };

    // The sign-in link: set a password.
    browser.goto(&link).await.unwrap();
    browser
        .find(Locator::Id("password"))
        .await
        .unwrap()
        .send_keys(PASSWORD)
        .await
        .unwrap();
    browser
        .find(Locator::Id("again"))
        .await
        .unwrap()
        .send_keys(PASSWORD)
        .await
        .unwrap();
    shot("01-set-password.png").await;
    browser
        .find(Locator::Css(
            "form[action='/dashboard/link'] button[type=submit]",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Id("key-name"))
        .await
        .expect("the keys page after setting the password");
    assert_eq!(browser.current_url().await.unwrap().path(), "/dashboard");
    shot("02-signed-in.png").await;

    // Create a key: shown once.
    browser
        .find(Locator::Id("key-name"))
        .await
        .unwrap()
        .send_keys("research notebook")
        .await
        .unwrap();
    browser
        .find(Locator::Css(
            "form[action='/dashboard/keys'] button[type=submit]",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let key = browser
        .wait()
        .for_element(Locator::Id("new-key"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(key.starts_with("hsk_") && key.len() == 68, "{key}");
    assert!(browser
        .find(Locator::Css("button[data-copy='new-key']"))
        .await
        .is_ok());
    shot("03-key-created.png").await;

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
    shot("04-usage.png").await;

    // Revoke it from the keys page: the client is refused at once.
    browser
        .goto(&format!("{}/dashboard", app.api))
        .await
        .unwrap();
    browser
        .find(Locator::Css(
            "button[aria-label='Revoke research notebook']",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css("span.badge.revoked"))
        .await
        .expect("the key shown revoked");
    shot("05-revoked.png").await;
    let refused = python(
        &app.api,
        &key,
        "try:\n    client.utility.health()\n    print(json.dumps({'status': 200}))\n\
         except AuthenticationError as e:\n    print(json.dumps({'status': e.status_code, 'message': str(e)}))\n",
    );
    assert_eq!(refused["status"], 401, "{refused}");
    browser.close().await.unwrap();
    for name in [
        "01-set-password.png",
        "02-signed-in.png",
        "03-key-created.png",
        "04-usage.png",
        "05-revoked.png",
    ] {
        let png = std::fs::read(shots.join(name)).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 5_000, "{name}");
    }
    drop(driver);
}

/// The scheme, host and port the browser is on.
async fn app_base(browser: &fantoccini::Client) -> String {
    let url = browser.current_url().await.unwrap();
    format!("{}://{}", url.scheme(), url.host_str().unwrap())
        + &url.port().map_or(String::new(), |p| format!(":{p}"))
}
