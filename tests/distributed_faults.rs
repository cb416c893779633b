//! Faults on the distributed deployment, on real Apache Kafka 4.1 and
//! Apache Cassandra 5.0 (`scripts/engines.sh`; `HINDSIGHT_ENGINES_RUN` must
//! name their run directory, since these tests SIGKILL the engines and
//! restart them with `scripts/engines.sh start-again`). Each test prints the
//! events acknowledged and counted, requires every acknowledged event
//! counted exactly once, and ends with tables equal to a clean rebuild of
//! the log into a second keyspace.
//!
//! The tests kill shared engines (or a process mid-append), so they run one
//! at a time (a lock), and in a test binary of their own (cargo runs test
//! binaries one after another, so no other test sees the engines die).

mod common;
use common::cql::{assert_same_tables, Cql, Keyspace};
use common::kafka::{
    backfill, batch_lines, kill_engine, post_batch, rebuild_into, service, service_env,
    start_again, wait_caught_up, wait_http, Topics,
};
use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Held for a whole test (an async lock: it is held across awaits, and
/// each test has its own runtime).
static ENGINES: Mutex<()> = Mutex::const_new(());

const TICKS: usize = 200;

/// Waits until every acknowledged token is counted exactly as acknowledged;
/// fails at once on a token counted more often than it was sent. Returns
/// the acknowledged events counted.
async fn wait_all_counted(
    cql: &Cql,
    ks: &str,
    acked: &BTreeMap<String, i64>,
    sent: &BTreeMap<String, i64>,
) -> i64 {
    let acknowledged: i64 = acked.values().sum();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let per_token = cql.counted_per_token(ks).await;
        for (token, n) in &per_token {
            let most = sent.get(token).copied().unwrap_or(0);
            assert!(*n <= most, "{token} counted {n}, but only {most} were sent");
        }
        let counted: i64 = acked
            .keys()
            .map(|t| per_token.get(t).copied().unwrap_or(0))
            .sum();
        if counted == acknowledged {
            return counted;
        }
        if Instant::now() > deadline {
            let short: Vec<String> = acked
                .iter()
                .filter(|(t, n)| per_token.get(*t) != Some(*n))
                .map(|(t, n)| format!("{t}: {} of {n}", per_token.get(t).copied().unwrap_or(0)))
                .collect();
            panic!("acknowledged {acknowledged}, counted {counted}; short: {short:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Requires the incremental tables, once the projectors have written the
/// whole log, to equal a clean `rebuild` of it into a keyspace named after
/// `clean`.
async fn assert_equal_to_a_clean_rebuild(
    topics: &Topics,
    cql: &Cql,
    ks: &Keyspace,
    clean: &str,
    dir: &std::path::Path,
    started: Instant,
) {
    wait_caught_up(topics, cql, &ks.name).await;
    let incremental = cql.snapshot(&ks.name).await;
    let clean = Keyspace::migrate(clean);
    rebuild_into(topics, &clean, dir);
    assert_same_tables(&incremental, &cql.snapshot(&clean.name).await);
    report(format_args!(
        "tables equal a clean rebuild; {:.1} s",
        started.elapsed().as_secs_f64()
    ));
}

/// Backfilled markets `{tag}{from}..{to}`, each its own token of TICKS
/// ticks (backfill acknowledges every line it appends).
fn backfill_batches(
    topics: &Topics,
    dir: &std::path::Path,
    tag: &str,
    range: std::ops::Range<usize>,
    acked: &mut BTreeMap<String, i64>,
) {
    let lines: Vec<String> = range.clone().map(|b| batch_lines(tag, b, TICKS)).collect();
    backfill(topics, dir, &lines);
    for b in range {
        acked.insert(format!("{tag}{b}-yes"), TICKS as i64);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn projectors_sigkilled_ten_times_mid_stream_lose_and_double_nothing() {
    let _engines = ENGINES.lock().await;
    let started = Instant::now();
    let dir = temp_dir("fault-projector");
    let topics = Topics::init("fault_projector", 4);
    let ks = Keyspace::migrate("fault_projector");
    let cql = Cql::connect().await;
    let mut acked = BTreeMap::new();
    let mut next = 300;
    backfill_batches(&topics, &dir, "fp", 0..next, &mut acked);
    let store_args = [topics.consumer_args(), ks.args()].concat();
    // Static membership: a restarted projector takes its predecessor's
    // partitions back at once, as under an orchestrator.
    let projector = |n: usize| {
        Killed(service(
            &[
                "projector",
                "--metrics-listen",
                "127.0.0.1:0",
                "--projector-batch-max",
                "400",
                "--kafka-instance-id",
                &format!("projector-{n}"),
            ],
            &store_args,
            &dir.join(format!("projector-{n}")),
        ))
    };
    let mut running = [projector(0), projector(1)];
    let mut kills = 0;
    let mut last = 0;
    while kills < 10 {
        let acknowledged: i64 = acked.values().sum();
        let counted = cql.counted(&ks.name).await;
        if counted >= acknowledged {
            // Caught up before ten kills: more events, so the next kill
            // lands mid-stream too.
            backfill_batches(&topics, &dir, "fp", next..next + 100, &mut acked);
            next += 100;
            continue;
        }
        if counted > last {
            let victim = kills % 2;
            running[victim].0.kill().unwrap(); // SIGKILL
            running[victim].0.wait().unwrap();
            kills += 1;
            last = counted;
            eprintln!("kill {kills}: projector {victim} at {counted} of {acknowledged} counted");
            running[victim] = projector(victim);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let counted = wait_all_counted(&cql, &ks.name, &acked, &acked).await;
    let acknowledged: i64 = acked.values().sum();
    report(format_args!(
        "acknowledged {acknowledged}, counted {counted}, {kills} SIGKILLs mid-stream"
    ));
    // Every event is counted once its rows are written; its step's positions
    // come after them, so the projectors stay up until those are written too.
    wait_caught_up(&topics, &cql, &ks.name).await;
    drop(running);
    assert_equal_to_a_clean_rebuild(&topics, &cql, &ks, "fault_projector_clean", &dir, started)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_broker_sigkilled_during_ingest_and_restarted_loses_no_acknowledged_event() {
    let _engines = ENGINES.lock().await;
    let started = Instant::now();
    let dir = temp_dir("fault-broker");
    let topics = Topics::init("fault_broker", 3);
    let ks = Keyspace::migrate("fault_broker");
    let cql = Cql::connect().await;
    let port = free_port();
    let _ingest = Killed(service(
        &[
            "ingest",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--kafka-delivery-timeout-ms",
            "3000",
        ],
        &[topics.args(), ks.args()].concat(),
        &dir.join("ingest"),
    ));
    let _projector = Killed(service(
        &["projector", "--metrics-listen", "127.0.0.1:0"],
        &[topics.consumer_args(), ks.args()].concat(),
        &dir.join("projector"),
    ));
    let base = format!("http://127.0.0.1:{port}");
    wait_http(&format!("{base}/livez")).await;

    let (mut acked, mut sent) = (BTreeMap::new(), BTreeMap::new());
    let mut refused = 0;
    let mut restart = None;
    for b in 0..60 {
        if b == 20 {
            kill_engine("kafka");
            eprintln!("broker SIGKILLed after batch 19");
            // Restart in the background while batches keep coming.
            restart = Some(tokio::task::spawn_blocking(|| {
                std::thread::sleep(Duration::from_secs(3));
                start_again("kafka");
                eprintln!("broker restarted");
            }));
        }
        if b == 40 {
            restart.take().unwrap().await.unwrap();
        }
        let token = format!("fb{b}-yes");
        sent.insert(token.clone(), TICKS as i64);
        match post_batch(&base, batch_lines("fb", b, TICKS), None).await {
            200 => {
                acked.insert(token, TICKS as i64);
            }
            503 => refused += 1,
            other => panic!("batch {b}: status {other}"),
        }
    }
    assert!(
        refused > 0,
        "no batch was refused while the broker was down"
    );
    assert!(
        (40..60).all(|b| acked.contains_key(&format!("fb{b}-yes"))),
        "batches after the restart were refused"
    );
    let counted = wait_all_counted(&cql, &ks.name, &acked, &sent).await;
    let acknowledged: i64 = acked.values().sum();
    report(format_args!(
        "acknowledged {acknowledged}, counted {counted}; {} batches acknowledged, {refused} refused with 503",
        acked.len()
    ));

    assert_equal_to_a_clean_rebuild(&topics, &cql, &ks, "fault_broker_clean", &dir, started).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cassandra_sigkilled_during_projection_and_restarted_loses_no_event() {
    let _engines = ENGINES.lock().await;
    let started = Instant::now();
    let dir = temp_dir("fault-cassandra");
    let topics = Topics::init("fault_cassandra", 4);
    let ks = Keyspace::migrate("fault_cassandra");
    let mut acked = BTreeMap::new();
    backfill_batches(&topics, &dir, "fc", 0..400, &mut acked);
    let acknowledged: i64 = acked.values().sum();
    let _projector = Killed(service(
        &[
            "projector",
            "--metrics-listen",
            "127.0.0.1:0",
            "--projector-batch-max",
            "1000",
        ],
        &[topics.consumer_args(), ks.args()].concat(),
        &dir.join("projector"),
    ));
    let cql = Cql::connect().await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let at = loop {
        let counted = cql.counted(&ks.name).await;
        if counted >= acknowledged / 5 {
            break counted;
        }
        assert!(Instant::now() < deadline, "projector made no progress");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(at < acknowledged, "projection finished before the kill");
    kill_engine("cassandra");
    eprintln!("cassandra SIGKILLed at {at} of {acknowledged} counted");
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::spawn_blocking(|| start_again("cassandra"))
        .await
        .unwrap();
    eprintln!("cassandra restarted");
    let cql = Cql::connect().await;
    let counted = wait_all_counted(&cql, &ks.name, &acked, &acked).await;
    report(format_args!(
        "acknowledged {acknowledged}, counted {counted}"
    ));

    assert_equal_to_a_clean_rebuild(&topics, &cql, &ks, "fault_cassandra_clean", &dir, started)
        .await;
}

/// What an ingest replica answered to a keyed POST.
struct Answer {
    /// 0 when the connection died without an answer.
    status: u16,
    replayed: bool,
    retry_after: Option<u64>,
    detail: String,
}

async fn post_keyed(base: &str, body: &str, key: &str) -> Answer {
    let sent = client()
        .post(format!("{base}/ingest/v1/events"))
        .bearer_auth(INGEST_TOKEN)
        .header("Idempotency-Key", key)
        .body(body.to_string())
        .send()
        .await;
    let Ok(r) = sent else {
        return Answer {
            status: 0,
            replayed: false,
            retry_after: None,
            detail: String::new(),
        };
    };
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let retry_after = header("retry-after").and_then(|v| v.parse().ok());
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap_or_default();
    Answer {
        status,
        replayed,
        retry_after,
        detail: body["detail"].as_str().unwrap_or_default().to_string(),
    }
}

/// Where replica A dies, and whether B's retry then finds the batch in the
/// log (replayed) or appends it.
const CRASH_POINTS: [(&str, bool); 4] = [
    // Key claimed, nothing sent: B takes the key over once A's lease ends.
    ("after-claim", false),
    // Every record sent in A's open transaction: B's init_transactions
    // aborts it, and B appends.
    ("after-flush", false),
    // Key marked committing, A's transaction still open: B reads A's marker
    // (aborted by B's fencing) and appends.
    ("after-committing", false),
    // A's transaction committed, the key not yet done: B reads A's marker
    // (committed) and replays A's answer without appending.
    ("after-commit", true),
];

#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_batch_whose_replica_dies_mid_append_lands_once_when_retried_on_another() {
    let _engines = ENGINES.lock().await;
    let started = Instant::now();
    let dir = temp_dir("fault-keyed");
    let topics = Topics::init("fault_keyed", 3);
    let ks = Keyspace::migrate("fault_keyed");
    let cql = Cql::connect().await;
    // Both replicas claim keys in the same keyspace; a 2 s delivery timeout
    // makes the lease 6 s.
    let ingest_args = [topics.args(), ks.args()].concat();
    let replica = |name: &str, fault: Option<&str>| {
        let port = free_port();
        let env: Vec<(&str, &str)> = fault
            .map(|point| ("HINDSIGHT_FAULT_ABORT_AT", point))
            .into_iter()
            .collect();
        let child = Killed(service_env(
            &[
                "ingest",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--kafka-delivery-timeout-ms",
                "2000",
            ],
            &ingest_args,
            &dir.join(name),
            &env,
        ));
        (child, format!("http://127.0.0.1:{port}"))
    };
    let _projector = Killed(service(
        &["projector", "--metrics-listen", "127.0.0.1:0"],
        &[topics.consumer_args(), ks.args()].concat(),
        &dir.join("projector"),
    ));
    let (_b, b) = replica("b", None);
    wait_http(&format!("{b}/livez")).await;

    let (mut acked, mut sent) = (BTreeMap::new(), BTreeMap::new());
    for (n, (point, replays)) in CRASH_POINTS.iter().enumerate() {
        let (mut a, a_base) = replica(&format!("a-{point}"), Some(point));
        wait_http(&format!("{a_base}/livez")).await;
        let key = format!("keyed-{point}");
        let body = batch_lines("fk", n, TICKS);
        sent.insert(format!("fk{n}-yes"), TICKS as i64);
        let died = post_keyed(&a_base, &body, &key).await;
        assert_eq!(
            died.status, 0,
            "replica A answered although it dies {point}"
        );
        let exit = a.0.wait().unwrap();
        assert!(!exit.success(), "replica A exited {exit} at {point}");
        // The client retries on replica B until it is acknowledged.
        let retried = Instant::now();
        let mut waits = 0;
        let answer = loop {
            let answer = post_keyed(&b, &body, &key).await;
            match answer.status {
                200 => break answer,
                503 => {
                    waits += 1;
                    let wait = answer.retry_after.unwrap_or(1).min(2);
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                }
                other => panic!("{point}: replica B answered {other}: {}", answer.detail),
            }
            assert!(
                retried.elapsed() < Duration::from_secs(90),
                "{point}: replica B never acknowledged the retry"
            );
        };
        assert_eq!(
            answer.replayed,
            *replays,
            "{point}: B's answer was {}a replay",
            if answer.replayed { "" } else { "not " }
        );
        acked.insert(format!("fk{n}-yes"), TICKS as i64);
        report(format_args!(
            "A died {point}; B acknowledged the retry after {:.1} s ({waits} answers 503 while A's lease ran; {})",
            retried.elapsed().as_secs_f64(),
            if answer.replayed { "replayed A's committed batch" } else { "appended it" }
        ));
    }

    // The same keys with another body, on either replica: 409, nothing
    // appended (the other body's token must never be counted).
    let (_a, a) = replica("a-again", None);
    wait_http(&format!("{a}/livez")).await;
    for (n, (point, _)) in CRASH_POINTS.iter().enumerate() {
        let key = format!("keyed-{point}");
        let base = if n % 2 == 0 { &a } else { &b };
        let other = post_keyed(base, &batch_lines("fx", n, TICKS), &key).await;
        assert_eq!(
            other.status, 409,
            "{point}: another body under the key: {}",
            other.detail
        );
        assert!(
            other.detail.starts_with(&format!(
                "Idempotency-Key {key} was used for a different body"
            )),
            "{}",
            other.detail
        );
        // The first body on the other replica is a replay.
        let again = post_keyed(base, &batch_lines("fk", n, TICKS), &key).await;
        assert_eq!(
            (again.status, again.replayed),
            (200, true),
            "{point}: {}",
            again.detail
        );
    }

    let counted = wait_all_counted(&cql, &ks.name, &acked, &sent).await;
    let acknowledged: i64 = acked.values().sum();
    report(format_args!(
        "acknowledged {acknowledged}, counted {counted}: none lost, none twice"
    ));
    assert_equal_to_a_clean_rebuild(&topics, &cql, &ks, "fault_keyed_clean", &dir, started).await;
}
