//! The dashboard's browser test on the distributed deployment: ingest,
//! projector and API each their own `hindsight` process, on the real
//! Kafka and Cassandra of `scripts/engines.sh` (an engine missing fails
//! the test). In headless Chromium an owner whose account was created in
//! Cassandra by `hindsight accounts create` sets a password, creates a key,
//! and explores a market ingested through Kafka: the price chart has the
//! expected number of points, and the Python snippet beside it, run with
//! the key, fetches the same points. The flows are those of the in-process
//! test (`tests/app/dashboard_browser.rs`), from `tests/common/browser.rs`.

#[path = "common/browser.rs"]
mod chromium;
mod common;

use common::cql::Keyspace;
use common::kafka::{post_batch, service, wait_http, Topics};
use common::{client, free_port, hindsight, temp_dir, Killed};
use std::time::{Duration, Instant};

/// `hindsight accounts create` on the keyspace: the owner's sign-in link.
fn create_account(ks: &Keyspace, dir: &std::path::Path, api: &str) -> String {
    let out = hindsight()
        .args([
            "accounts",
            "create",
            "--org",
            "distributed",
            "--email",
            "owner@distributed.example",
            "--plan",
            "enterprise",
            "--public-url",
            api,
        ])
        .args(ks.args())
        .arg("--data-dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "accounts create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

async fn get(url: &str, key: &str) -> serde_json::Value {
    let response = client().get(url).header("X-API-Key", key).send().await;
    response.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn in_chromium_on_kafka_and_cassandra_an_owner_explores_a_market_and_its_snippet_fetches_the_chart(
) {
    let driver = chromium::start_driver().await;
    let shots = chromium::screenshots_dir();
    let dir = temp_dir("distributed-dashboard");
    let topics = Topics::init("dash", 2);
    let ks = Keyspace::migrate("dash");
    let (ingest_port, api_port) = (free_port(), free_port());
    let ingest = format!("http://127.0.0.1:{ingest_port}");
    let api = format!("http://127.0.0.1:{api_port}");
    let _procs = [
        Killed(service(
            &["ingest", "--listen", &format!("127.0.0.1:{ingest_port}")],
            &[topics.args(), ks.args()].concat(),
            &dir.join("ingest"),
        )),
        Killed(service(
            &[
                "projector",
                "--metrics-listen",
                "127.0.0.1:0",
                "--kafka-instance-id",
                "projector-0",
            ],
            &[topics.consumer_args(), ks.args()].concat(),
            &dir.join("projector"),
        )),
        Killed(service(
            &["api", "--listen", &format!("127.0.0.1:{api_port}")],
            &ks.args(),
            &dir.join("api"),
        )),
    ];
    for base in [&ingest, &api] {
        wait_http(&format!("{base}/livez")).await;
    }
    assert_eq!(
        post_batch(&ingest, chromium::fixture("dsh"), None).await,
        200
    );
    let link = create_account(&ks, &dir.join("accounts"), &api);

    let browser = chromium::session(&driver).await;
    chromium::set_password(&browser, &link, None).await;
    let key = chromium::create_key(&browser, "distributed notebook").await;
    chromium::shot(&browser, &shots, "d1-distributed-key.png").await;

    // Projected through Kafka into Cassandra, and in the API replica's
    // catalog (it follows the store's change feed every few seconds).
    let deadline = Instant::now() + Duration::from_secs(120);
    let prices = format!(
        "{api}/v1/tokens/dsh-yes/prices?start_ts={}&end_ts={}&resolution=1m&limit=200",
        chromium::DAY,
        chromium::DAY + 86_400
    );
    loop {
        let points = get(&prices, &key).await["data"]
            .as_array()
            .map_or(0, Vec::len);
        let listed = get(&format!("{api}/v1/markets?search=dsh"), &key).await["data"]
            .as_array()
            .map_or(0, Vec::len);
        if points == chromium::YES_POINTS && listed == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "projected {points} of {} points, {listed} market listed",
            chromium::YES_POINTS
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    chromium::explore_market(
        &browser,
        &api,
        "dsh",
        chromium::DAY_VIEW,
        chromium::YES_POINTS,
        &key,
        (&shots, "d2-distributed-explore"),
    )
    .await;
    browser.close().await.unwrap();
    drop(driver);
}
