//! The distributed deployment end to end, every service its own process on
//! real Apache Kafka 4.1 and Apache Cassandra 5.0 (`scripts/engines.sh`):
//! two ingest replicas, two projectors in one consumer group, two API
//! replicas. The same input goes to `hindsight dev` (embedded log and
//! store), and every `/v1` history and discovery answer of both API
//! replicas must equal dev's. Then cursors continue across the replicas,
//! and a rate limit holds across them.

mod common;
use common::cql::{Cql, Keyspace};
use common::kafka::{post_batch, service, wait_caught_up, wait_http, Topics};
use common::*;
use std::time::{Duration, Instant};

const DAY: i64 = 1_756_684_800;
const MARKETS: usize = 12;
const TICKS: i64 = 400;

/// Market `m`'s batch: its catalog line, then ticks of both tokens over two
/// days (so every resolution has several buckets).
fn batch(m: usize) -> String {
    let id = format!("e2e{m}");
    let mut lines = vec![market_line(&id)];
    for k in 0..TICKS {
        let ts = DAY + k * 431 + m as i64;
        let p = ((k * 37 + m as i64 * 11) % 997) as f64 / 997.0;
        lines.push(price_line(&id, &format!("{id}-yes"), ts, p));
        lines.push(price_line(&id, &format!("{id}-no"), ts, 1.0 - p));
    }
    lines.join("\n")
}

/// The requests both deployments answer: catalog and history.
fn requests() -> Vec<String> {
    let mut out = vec![
        "/v1/markets".to_string(),
        "/v1/markets?limit=5".to_string(),
        "/v1/events".to_string(),
        "/v1/series".to_string(),
        "/v1/tags".to_string(),
    ];
    for m in 0..MARKETS {
        let id = format!("e2e{m}");
        out.push(format!("/v1/markets/{id}"));
        out.push(format!("/v1/markets/{id}-slug"));
        for res in ["1m", "1h", "6h", "1d"] {
            for token in ["yes", "no"] {
                out.push(format!(
                    "/v1/tokens/{id}-{token}/prices?start_ts={DAY}&end_ts={}&resolution={res}",
                    DAY + 2 * 86_400
                ));
            }
        }
    }
    out.push("/v1/tokens/none-such/prices?resolution=1h".to_string());
    out
}

async fn answer(base: &str, key: &str, path: &str) -> (u16, serde_json::Value) {
    let r = client()
        .get(format!("{base}{path}"))
        .header("X-API-Key", key)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_service_its_own_process_answers_like_the_embedded_deployment() {
    let started = Instant::now();
    let dir = temp_dir("distributed-e2e");
    let topics = Topics::init("e2e", 6);
    let ks = Keyspace::migrate("e2e");
    let both = [topics.consumer_args(), ks.args()].concat();
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let mut procs = Vec::new();
    for (i, port) in ports[..2].iter().enumerate() {
        procs.push(Killed(service(
            &["ingest", "--listen", &format!("127.0.0.1:{port}")],
            &[topics.args(), ks.args()].concat(),
            &dir.join(format!("ingest-{i}")),
        )));
    }
    for i in 0..2 {
        procs.push(Killed(service(
            &[
                "projector",
                "--metrics-listen",
                "127.0.0.1:0",
                "--kafka-instance-id",
                &format!("projector-{i}"),
            ],
            &both,
            &dir.join(format!("projector-{i}")),
        )));
    }
    for (i, port) in ports[2..].iter().enumerate() {
        procs.push(Killed(service(
            &["api", "--listen", &format!("127.0.0.1:{port}")],
            &ks.args(),
            &dir.join(format!("api-{i}")),
        )));
    }
    // The distributed deployment's key lives in Cassandra.
    let key = create_key(&ks, &dir, "enterprise");
    let ingests: Vec<String> = ports[..2]
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let apis: Vec<String> = ports[2..]
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    for base in ingests.iter().chain(&apis) {
        wait_http(&format!("{base}/livez")).await;
    }
    let dev = Dev::start("distributed-e2e-dev", &[]);

    // The same batches: alternately through each ingest replica, and to dev.
    for m in 0..MARKETS {
        let body = batch(m);
        assert_eq!(
            post_batch(&ingests[m % 2], body.clone(), None).await,
            200,
            "batch {m}"
        );
        let (status, _) = ingest(&dev, body).await;
        assert_eq!(status, 200, "dev batch {m}");
    }
    let ticks = MARKETS as i64 * TICKS * 2;
    let cql = Cql::connect().await;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (dist, embedded) = (
            cql.counted(&ks.name).await,
            scalar(
                &dev.data_dir.join("store.db"),
                "SELECT SUM(ticks) FROM price_bucket_blocks WHERE res = 1440",
            ),
        );
        assert!(
            dist <= ticks && embedded <= ticks,
            "double-counted: {dist}, {embedded}"
        );
        if dist == ticks && embedded == ticks {
            report(format_args!(
                "acknowledged {ticks}, counted {dist} (distributed), {embedded} (embedded)"
            ));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "counted {dist} / {embedded} of {ticks}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_caught_up(&topics, &cql, &ks.name).await;

    let requests = requests();
    let mut nonempty = 0;
    for path in &requests {
        let want = answer(&dev.base, API_KEY, path).await;
        for api in &apis {
            // An API replica learns catalog changes from the store's change
            // feed every few seconds: it may be briefly behind.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let got = answer(api, &key, path).await;
                if got == want {
                    break;
                }
                if Instant::now() > deadline {
                    assert_eq!(
                        got, want,
                        "{api}{path} differs from the embedded deployment"
                    );
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        if want.0 == 200 {
            nonempty += 1;
        }
    }
    assert!(
        nonempty >= requests.len() - 1,
        "only {nonempty} requests answered 200"
    );
    report(format_args!(
        "{} /v1 requests answered identically by both API replicas and dev ({nonempty} with 200); {:.1} s",
        requests.len(),
        started.elapsed().as_secs_f64()
    ));

    // Paging alternately through both replicas: each continues the other's
    // cursors (they share the cursor secret), and the pages hold every point.
    let mut points = 0;
    let mut cursor = String::new();
    for page in 0.. {
        let path = format!(
            "/v1/tokens/e2e0-yes/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=37{cursor}",
            DAY + 2 * 86_400
        );
        let (status, body) = answer(&apis[page % 2], &key, &path).await;
        assert_eq!(status, 200, "page {page}: {body}");
        points += body["data"].as_array().unwrap().len() as i64;
        match body["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(points, TICKS, "every 1m bucket of e2e0-yes (one tick each)");

    // Rate limits hold across the replicas on the CQL store: a burst split
    // over both never admits more than the plan (free: 60 a minute; racing
    // requests at the limit may all be refused), and refused requests leave
    // no trace: one at a time afterwards, exactly the rest is admitted.
    let free = create_key(&ks, &dir, "free");
    let burst = (0..100).map(|i| {
        let (base, key) = (apis[i % 2].clone(), free.clone());
        tokio::spawn(async move { answer(&base, &key, "/v1/health").await.0 })
    });
    let mut admitted = 0;
    for call in burst {
        match call.await.unwrap() {
            200 => admitted += 1,
            429 => {}
            other => panic!("a burst request answered {other}"),
        }
    }
    assert!(admitted <= 60, "{admitted} of 100 admitted");
    let mut more = 0;
    loop {
        match answer(&apis[more % 2], &free, "/v1/health").await.0 {
            200 => more += 1,
            429 => break,
            other => panic!("answered {other}"),
        }
    }
    assert_eq!(admitted + more, 60, "{admitted} in the burst, {more} after");
    let (_, usage) = answer(&apis[1], &free, "/v1/usage").await;
    assert_eq!(usage["limits"]["requests_remaining"], 0, "{usage}");
    report(format_args!(
        "rate limit across replicas: {admitted} of a 100-request burst, then {more}"
    ));
    drop(procs);
}

/// A key of `plan` in the keyspace, created with the real CLI.
fn create_key(ks: &Keyspace, dir: &std::path::Path, plan: &str) -> String {
    let ks_args = ks.args();
    let mut args = vec!["create", "--org", "e2e", "--plan", plan];
    args.extend(ks_args.iter().map(String::as_str));
    keys_cli(&dir.join("keys"), &args).trim().to_string()
}
