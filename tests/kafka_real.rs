//! The Kafka event log on real Apache Kafka 4.1 (`scripts/engines.sh`):
//! the services as separate processes, `kafka init` keeping the source of
//! truth, and the consumer's rebalance signal. Each test has its own topics
//! and consumer group, so they share one broker and run in parallel.

mod common;
use common::kafka::{backfill, brokers, Topics};
use common::*;
use hindsight_contracts::LogConsumer;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DAY: i64 = 1_756_684_800;

/// Runs a hindsight service with extra flags.
fn spawn(args: &[&str], extra: &[String], data_dir: &Path) -> Child {
    hindsight()
        .args(args)
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .env("HINDSIGHT_INGEST_TOKEN", INGEST_TOKEN)
        .env(
            "HINDSIGHT_LOG",
            std::env::var("HINDSIGHT_TEST_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

async fn wait_http(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while client().get(url).send().await.is_err() {
        assert!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ingest_projector_and_api_as_separate_processes() {
    let dir = temp_dir("kafka-e2e");
    let topics = Topics::init("e2e", 3);
    let (ingest_port, api_port) = (free_port(), free_port());
    let data = dir.join("data");
    let _ingest = Killed(spawn(
        &["ingest", "--listen", &format!("127.0.0.1:{ingest_port}")],
        &topics.args(),
        &dir.join("ingest"),
    ));
    let _projector = Killed(spawn(
        &["projector", "--metrics-listen", "127.0.0.1:0"],
        &topics.consumer_args(),
        &data,
    ));
    // The API reads the store the projector writes.
    let keyed = {
        let out = hindsight()
            .args([
                "keys",
                "create",
                "--org",
                "kafka",
                "--plan",
                "enterprise",
                "--data-dir",
            ])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let _api = Killed(spawn(
        &["api", "--listen", &format!("127.0.0.1:{api_port}")],
        &[],
        &data,
    ));
    wait_http(&format!("http://127.0.0.1:{ingest_port}/livez")).await;
    wait_http(&format!("http://127.0.0.1:{api_port}/livez")).await;

    let mut body = vec![market_line("k1")];
    let mut yes = Vec::new();
    for k in 0..600 {
        let p = (k % 17) as f64 / 20.0;
        yes.push(p);
        body.push(price_line("k1", "k1-yes", DAY + k * 6, p));
    }
    let r = client()
        .post(format!("http://127.0.0.1:{ingest_port}/ingest/v1/events"))
        .bearer_auth(INGEST_TOKEN)
        .body(body.join("\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ack: serde_json::Value = r.json().await.unwrap();
    assert_eq!(ack["accepted"], 601);

    let url = format!("http://127.0.0.1:{api_port}/v1/tokens/k1-yes/prices?start_ts={DAY}&end_ts={}&resolution=1h", DAY + 3600);
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let r = client()
            .get(&url)
            .header("X-API-Key", &keyed)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let b: serde_json::Value = r.json().await.unwrap();
        if status == 200 && b["data"].as_array().is_some_and(|d| d.len() == 1) {
            let avg = b["data"][0]["p"].as_f64().unwrap();
            if (avg - yes.iter().sum::<f64>() / 600.0).abs() < 1e-12 {
                break b;
            }
        }
        assert!(Instant::now() < deadline, "not visible: {status} {b}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(body["market_id"], "k1");
}

/// Topic configs as the broker reports them (DescribeConfigs).
async fn topic_configs(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> BTreeMap<String, String> {
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let r = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &opts)
        .await
        .unwrap();
    let resource = r.into_iter().next().unwrap().unwrap();
    resource
        .entries
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_init_keeps_events_forever_and_repairs_a_topic_that_would_delete_them() {
    let dir = temp_dir("kafka-retention");
    let topics = Topics::init("retention", 2);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let names: Vec<String> = ["prices", "books", "metrics", "catalog"]
        .iter()
        .map(|k| format!("{}.{k}", topics.prefix))
        .collect();
    for name in &names {
        let c = topic_configs(&admin, name).await;
        assert_eq!(c["retention.ms"], "-1", "{name}");
        assert_eq!(c["retention.bytes"], "-1", "{name}");
        assert_eq!(c["cleanup.policy"], "delete", "{name}");
    }
    // The markers of keyed appends are no part of the log's truth: kept a
    // week (a retry reads them up to 24 h later), never compacted.
    let markers = topic_configs(&admin, &format!("{}.ingest-markers", topics.prefix)).await;
    assert_eq!(markers["retention.ms"], "604800000");
    assert_eq!(markers["cleanup.policy"], "delete");

    // An operator (or a topic made by hand) gives one topic the broker's
    // 7-day default and another compaction; `compression.type` is an
    // unrelated setting that must survive the repair.
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let damage = [
        AlterConfig::new(ResourceSpecifier::Topic(&names[0]))
            .set("retention.ms", "604800000")
            .set("compression.type", "lz4"),
        AlterConfig::new(ResourceSpecifier::Topic(&names[3])).set("cleanup.policy", "compact"),
    ];
    for r in admin.alter_configs(&damage, &opts).await.unwrap() {
        r.unwrap();
    }
    assert_eq!(
        topic_configs(&admin, &names[0]).await["retention.ms"],
        "604800000"
    );

    // Every service refuses such a log: it verifies the topics at start.
    let file = dir.join("one.ndjson");
    std::fs::write(&file, market_line("r1")).unwrap();
    let out = hindsight()
        .args(["backfill", "--no-progress"])
        .args(topics.args())
        .arg("--data-dir")
        .arg(dir.join("b"))
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "backfill accepted a 7-day topic");
    assert!(
        err.contains(&format!(
            "topic {} would delete events (retention.ms=604800000)",
            names[0]
        )) && err.contains("hindsight kafka init"),
        "{err}"
    );

    // `kafka init` on the existing topics repairs them and says so.
    let out = hindsight()
        .args(["kafka", "init"])
        .args(topics.args())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("fixed {}: was retention.ms=604800000", names[0])),
        "{said}"
    );
    // (AlterConfigs without the old settings also reset the catalog topic's
    // retention to the broker's 7 days: reported too.)
    assert!(
        said.lines()
            .any(|l| l.starts_with(&format!("fixed {}: was", names[3]))
                && l.contains("cleanup.policy=compact")),
        "{said}"
    );
    assert!(
        said.contains(&format!("exists {} (retention forever)", names[1])),
        "{said}"
    );
    for name in &names {
        let c = topic_configs(&admin, name).await;
        assert_eq!(c["retention.ms"], "-1", "{name}");
        assert_eq!(c["retention.bytes"], "-1", "{name}");
        assert_eq!(c["cleanup.policy"], "delete", "{name}");
    }
    assert_eq!(
        topic_configs(&admin, &names[0]).await["compression.type"],
        "lz4"
    );
    backfill(&topics, &dir, &[market_line("r1")]);
}

/// One poll of one member, as the projector sees it.
struct Observed {
    changed: bool,
    assignment: BTreeSet<u32>,
    partitions: BTreeSet<u32>,
}

/// A group member polling and committing like a projector, recording
/// what each poll returned, until `stop`.
fn member(
    topics: &Topics,
    batch: usize,
    pace: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Observed>> {
    let config = hindsight_kafka::KafkaConfig {
        brokers: topics.brokers.clone(),
        topic_prefix: topics.prefix.clone(),
        partitions: 0,
        replication: 1,
        group: topics.group.clone(),
        instance_id: None,
        max_in_flight: 1,
    };
    tokio::spawn(async move {
        let mut c = hindsight_kafka::KafkaConsumer::join(&config, None).unwrap();
        let mut seen = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let got = c.poll(batch, Duration::from_millis(100)).await.unwrap();
            let changed = c.assignment_changed();
            let assignment = c.assignment().unwrap().into_iter().collect();
            let mut last = BTreeMap::new();
            for d in &got {
                last.insert(d.position.partition, d.position);
            }
            let upto: Vec<_> = last.values().copied().collect();
            if !upto.is_empty() {
                // A commit refused because the group is rebalancing is what
                // a projector retries: the records come again.
                let _ = c.commit(&upto).await;
            }
            seen.push(Observed {
                changed,
                assignment,
                partitions: last.keys().copied().collect(),
            });
            tokio::time::sleep(pace).await;
        }
        seen
    })
}

/// Checks one member's polls: no record of a partition it does not hold,
/// and `assignment_changed` true on the poll that first returns records of
/// a partition it did not hold at the previous poll. Returns how many polls
/// saw the assignment change.
fn check_member(name: &str, seen: &[Observed]) -> usize {
    let mut before = BTreeSet::new();
    let mut changes = 0;
    for (i, o) in seen.iter().enumerate() {
        for p in &o.partitions {
            assert!(
                o.assignment.contains(p),
                "{name} poll {i}: records of partition {p:#x}, which it does not hold ({:?})",
                o.assignment
            );
            assert!(
                before.contains(p) || o.changed,
                "{name} poll {i}: records of newly assigned partition {p:#x} before assignment_changed()"
            );
        }
        changes += o.changed as usize;
        before = o.assignment.clone();
    }
    changes
}

#[tokio::test(flavor = "multi_thread")]
async fn assignment_changed_is_true_before_any_record_of_a_new_assignment() {
    let dir = temp_dir("kafka-assignment");
    let topics = Topics::init("assign", 6);
    let mut lines = Vec::new();
    for m in 0..60 {
        lines.push(market_line(&format!("a{m}")));
        for k in 0..1000 {
            lines.push(price_line(
                &format!("a{m}"),
                &format!("a{m}-yes"),
                DAY + k,
                0.5,
            ));
        }
    }
    backfill(&topics, &dir, &lines);

    let started = Instant::now();
    let stop_a = Arc::new(AtomicBool::new(false));
    let a = member(&topics, 20, Duration::from_millis(10), stop_a.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Two more members join, one at a time, and leave again: partitions
    // move away from `a` and back to it, mid-stream.
    let mut others = Vec::new();
    for _ in 0..2 {
        let stop = Arc::new(AtomicBool::new(false));
        let b = member(&topics, 20, Duration::from_millis(10), stop.clone());
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.store(true, Ordering::SeqCst);
        others.push(b.await.unwrap());
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    stop_a.store(true, Ordering::SeqCst);
    let a = a.await.unwrap();

    let changes = check_member("a", &a);
    for (i, b) in others.iter().enumerate() {
        check_member(&format!("member {}", i + 2), b);
        assert!(
            b.iter().any(|o| !o.partitions.is_empty()),
            "member {} never got records: partitions did not move",
            i + 2
        );
    }
    let sizes: BTreeSet<usize> = a.iter().map(|o| o.assignment.len()).collect();
    assert!(
        sizes.len() >= 2 && changes >= 3,
        "a's assignment never changed size ({sizes:?}, {changes} changes)"
    );
    let polls_with_records = a.iter().filter(|o| !o.partitions.is_empty()).count();
    eprintln!(
        "member a: {} polls ({polls_with_records} with records), {changes} saw a rebalance, assignment sizes {sizes:?}; {:.1} s",
        a.len(),
        started.elapsed().as_secs_f64()
    );
}
