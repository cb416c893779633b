//! The real engines for tests: Apache Kafka 4.1 and Apache Cassandra 5.0,
//! started once per machine by `scripts/engines.sh` (each test isolates
//! itself with its own topic prefix, consumer group and keyspace, so tests
//! share the engines and run in parallel).
//!
//! A missing engine fails the test with the command that starts it: a
//! skipped test must never count as passed.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

const HOW: &str = "start the real engines first: \
    `export HINDSIGHT_ENGINES_RUN=/tmp/engines-$USER; eval \"$(scripts/engines.sh start)\"` \
    (Apache Kafka 4.1 and Cassandra 5.0 on loopback; `scripts/engines.sh stop` afterwards)";

fn required(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!("{var} is not set: {HOW}"),
    }
}

/// `HINDSIGHT_KAFKA_BROKERS`, or a failure saying how to start Kafka.
pub fn brokers() -> String {
    required("HINDSIGHT_KAFKA_BROKERS")
}

/// `HINDSIGHT_SCYLLA_NODES` (Cassandra here), or a failure saying how.
pub fn cql_nodes() -> String {
    required("HINDSIGHT_SCYLLA_NODES")
}

/// The engines' run directory (pid files), needed by tests that kill them.
pub fn engines_run() -> PathBuf {
    PathBuf::from(required("HINDSIGHT_ENGINES_RUN"))
}

/// A name no other test or earlier run uses: `{name}_{pid}_{micros}`, in
/// the characters topic names, group ids and CQL keyspaces all accept.
pub fn unique(name: &str) -> String {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 10_000_000_000;
    format!("{name}_{}_{micros}", std::process::id())
}

/// A Kafka deployment of one test: its topics and projector group.
#[derive(Clone)]
pub struct Topics {
    pub brokers: String,
    pub prefix: String,
    pub group: String,
}

impl Topics {
    /// Creates `{prefix}.*` topics with `partitions` each (`kafka init`).
    pub fn init(name: &str, partitions: u32) -> Topics {
        let prefix = unique(name);
        let t = Topics {
            brokers: brokers(),
            group: format!("{prefix}-projector"),
            prefix,
        };
        let out = super::hindsight()
            .args([
                "kafka",
                "init",
                "--kafka-partitions",
                &partitions.to_string(),
            ])
            .args(t.args())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kafka init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        t
    }

    /// The flags that point a hindsight command at these topics (every
    /// command that appends to or reads the log takes them).
    pub fn args(&self) -> Vec<String> {
        [
            "--kafka-brokers",
            &self.brokers,
            "--kafka-topic-prefix",
            &self.prefix,
        ]
        .map(String::from)
        .to_vec()
    }

    /// [`Topics::args`] and the consumer group: for `projector` and
    /// `rebuild`, the commands that consume (others refuse the flag).
    pub fn consumer_args(&self) -> Vec<String> {
        let mut args = self.args();
        args.extend(["--kafka-group".to_string(), self.group.clone()]);
        args
    }
}

/// SIGKILLs an engine (`kafka` or `cassandra`) started by `engines.sh`.
pub fn kill_engine(engine: &str) {
    let pid_file = engines_run().join(format!("{engine}.pid"));
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| panic!("{}: {e}; {HOW}", pid_file.display()));
    let status = Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -9 {engine} ({})", pid.trim());
    // Until the JVM is gone its port is still taken.
    let proc = PathBuf::from(format!("/proc/{}", pid.trim()));
    while std::fs::read_to_string(proc.join("stat"))
        .is_ok_and(|s| !s.rsplit(") ").next().unwrap_or("").starts_with('Z'))
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Restarts a killed engine on the same port and data
/// (`scripts/engines.sh start-again`), returning once it answers.
pub fn start_again(engine: &str) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/engines.sh");
    let out = Command::new(script)
        .args(["start-again", engine])
        .env("HINDSIGHT_ENGINES_RUN", engines_run())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "engines.sh start-again {engine}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a hindsight service (`ingest`, `projector`, `api`) with extra flags
/// and its own data directory; stdout discarded, stderr inherited.
pub fn service(args: &[&str], extra: &[String], data_dir: &std::path::Path) -> std::process::Child {
    service_env(args, extra, data_dir, &[])
}

/// [`service`] with extra environment variables (a test-only fault hook).
pub fn service_env(
    args: &[&str],
    extra: &[String],
    data_dir: &std::path::Path,
    env: &[(&str, &str)],
) -> std::process::Child {
    super::hindsight()
        .envs(env.iter().copied())
        .args(args)
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .env("HINDSIGHT_INGEST_TOKEN", super::INGEST_TOKEN)
        .env(
            "HINDSIGHT_LOG",
            std::env::var("HINDSIGHT_TEST_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits until `url` answers HTTP at all.
pub async fn wait_http(url: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while super::client().get(url).send().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Batch `b` of a fault test: a market `{tag}{b}` and `ticks` price ticks
/// of its own token `{tag}{b}-yes`, so that per token, counted ticks tell
/// whether an acknowledged batch arrived whole and exactly once.
pub fn batch_lines(tag: &str, b: usize, ticks: usize) -> String {
    let m = format!("{tag}{b}");
    let mut lines = vec![super::market_line(&m)];
    for k in 0..ticks {
        lines.push(super::price_line(
            &m,
            &format!("{m}-yes"),
            1_756_684_800 + (k as i64) * 7 + b as i64,
            ((k * 31 + b) % 1000) as f64 / 1000.0,
        ));
    }
    lines.join("\n")
}

/// POSTs a body to an ingest base URL; the status, 0 when no answer.
pub async fn post_batch(base: &str, body: String, key: Option<&str>) -> u16 {
    let mut req = super::client()
        .post(format!("{base}/ingest/v1/events"))
        .bearer_auth(super::INGEST_TOKEN)
        .body(body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    match req.send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// `hindsight backfill` of NDJSON lines into the topics.
pub fn backfill(topics: &Topics, dir: &std::path::Path, lines: &[String]) {
    let file = dir.join("events.ndjson");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let out = super::hindsight()
        .args(["backfill", "--no-progress"])
        .args(topics.args())
        .arg("--data-dir")
        .arg(dir.join("backfill"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "backfill: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `hindsight rebuild` of the whole log into a fresh keyspace.
pub fn rebuild_into(topics: &Topics, ks: &super::cql::Keyspace, dir: &std::path::Path) {
    let t0 = std::time::Instant::now();
    let out = super::hindsight()
        .arg("rebuild")
        .args(topics.consumer_args())
        .args(ks.args())
        .arg("--data-dir")
        .arg(dir.join("rebuild"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rebuild: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "{} ({:.1} s)",
        String::from_utf8_lossy(&out.stdout).trim(),
        t0.elapsed().as_secs_f64()
    );
}

/// Per log partition id (as the read store keys them), the offset after the
/// last record a `read_committed` consumer delivers: where a projector that
/// has read everything stands. The high watermark can lie beyond it: a
/// keyed batch is a Kafka transaction, whose commit marker (and any aborted
/// attempt) takes offsets no consumer delivers.
pub fn committed_ends(topics: &Topics) -> std::collections::BTreeMap<i32, i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::message::Message;
    use std::time::{Duration, Instant};
    let mut ends = std::collections::BTreeMap::new();
    // One reader per topic: an end-of-partition event names the partition
    // only. With no transaction open (the test's appends are over), a
    // read_committed reader reaches the end of every partition.
    for (k, kind) in hindsight_kafka::topics::KINDS.iter().enumerate() {
        let name = format!("{}.{kind}", topics.prefix);
        let reader: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &topics.brokers)
            // Needed to assign partitions; never joined, never committed.
            .set("group.id", format!("{}-ends", topics.prefix))
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let meta = reader
            .fetch_metadata(Some(&name), Duration::from_secs(10))
            .unwrap();
        let mut assignment = rdkafka::TopicPartitionList::new();
        let mut open = std::collections::BTreeSet::new();
        for p in meta.topics()[0].partitions() {
            let (_, high) = reader
                .fetch_watermarks(&name, p.id(), Duration::from_secs(10))
                .unwrap();
            if high > 0 {
                assignment
                    .add_partition_offset(&name, p.id(), rdkafka::Offset::Beginning)
                    .unwrap();
                open.insert(p.id());
            }
        }
        if open.is_empty() {
            continue;
        }
        reader.assign(&assignment).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !open.is_empty() {
            assert!(
                Instant::now() < deadline,
                "{name}: partitions {open:?} never ended"
            );
            match reader.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    let id = hindsight_kafka::topics::partition_id(k, m.partition()) as i32;
                    ends.insert(id, m.offset() + 1);
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    open.remove(&p);
                }
                Some(Err(e)) => panic!("reading {name}: {e}"),
                None => {}
            }
        }
    }
    ends
}

/// Waits until the keyspace's consumed positions reach the end of every
/// non-empty partition of the topics: the projectors have written all
/// there is (row counts alone can match while a catalog record or the
/// last consumed position is still being written).
pub async fn wait_caught_up(topics: &Topics, cql: &super::cql::Cql, ks: &str) {
    use scylla::value::CqlValue;
    let ends = {
        let topics = topics.clone();
        tokio::task::spawn_blocking(move || committed_ends(&topics))
            .await
            .unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let consumed: std::collections::BTreeMap<i32, i64> = cql
            .rows(&format!("SELECT partition, next_offset FROM {ks}.consumed"))
            .await
            .into_iter()
            .filter_map(|r| match (&r[0], &r[1]) {
                (Some(CqlValue::Int(p)), Some(CqlValue::BigInt(o))) => Some((*p, *o)),
                _ => None,
            })
            .collect();
        if consumed == ends {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "projectors never reached the end of the log: consumed {consumed:?}, log ends {ends:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
