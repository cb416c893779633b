//! Partitions really moving between live projectors mid-stream, on real
//! Apache Kafka 4.1 and Apache Cassandra 5.0 (`scripts/engines.sh`): two
//! projector processes in one consumer group over a shared CQL keyspace, a
//! third joining and then leaving while batches stream in through ingest.
//! Every acknowledged event must be counted exactly once, and the tables
//! must equal a clean rebuild of the log into a second keyspace.

mod common;
use common::cql::{assert_same_tables, Cql, Keyspace};
use common::kafka::{
    batch_lines, post_batch, rebuild_into, service, wait_caught_up, wait_http, Topics,
};
use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TICKS: usize = 100;

#[tokio::test(flavor = "multi_thread")]
async fn partitions_move_between_live_projectors_without_loss_or_double_counting() {
    let started = Instant::now();
    let dir = temp_dir("rebalance");
    let topics = Topics::init("rebalance", 6);
    let ks = Keyspace::migrate("rebalance");
    let port = free_port();
    let _ingest = Killed(service(
        &["ingest", "--listen", &format!("127.0.0.1:{port}")],
        &[topics.args(), ks.args()].concat(),
        &dir.join("ingest"),
    ));
    let store_args = [topics.consumer_args(), ks.args()].concat();
    let ports = [free_port(), free_port(), free_port()];
    let projector = |n: usize| {
        Killed(service(
            &[
                "projector",
                "--metrics-listen",
                &format!("127.0.0.1:{}", ports[n - 1]),
                "--projector-batch-max",
                "500",
            ],
            &store_args,
            &dir.join(format!("projector-{n}")),
        ))
    };
    let _one = projector(1);
    let _two = projector(2);
    let base = format!("http://127.0.0.1:{port}");
    wait_http(&format!("{base}/livez")).await;

    let cql = Cql::connect().await;
    let mut acked = BTreeMap::new();
    let mut third = None;
    let mut b = 0;
    // Batches stream in all along: after 6 s a third projector joins; once
    // it has applied events (partitions moved to it) and 4 s have passed it
    // leaves (SIGTERM: a clean leave); 4 s more of batches after that.
    let mut joined_at = None;
    let mut left_at = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = Instant::now();
        assert!(
            now < deadline,
            "the third projector was never given partitions"
        );
        if joined_at.is_none() && now > started + Duration::from_secs(6) {
            third = Some(projector(3));
            joined_at = Some(now);
        }
        if let (Some(j), None) = (joined_at, left_at) {
            if now > j + Duration::from_secs(4) {
                let applied = applied(ports[2]).await;
                if applied > 0 {
                    eprintln!(
                        "third projector applied {applied} events in {:.1} s, then leaves",
                        (now - j).as_secs_f64()
                    );
                    let p: Killed = third.take().unwrap();
                    sigterm(p.0.id());
                    drop(p);
                    left_at = Some(now);
                }
            }
        }
        if left_at.is_some_and(|l| now > l + Duration::from_secs(4)) {
            break;
        }
        let status = post_batch(&base, batch_lines("rb", b, TICKS), None).await;
        assert_eq!(status, 200, "batch {b}");
        acked.insert(format!("rb{b}-yes"), TICKS as i64);
        b += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acknowledged: i64 = acked.values().sum();

    let deadline = Instant::now() + Duration::from_secs(240);
    let counted = loop {
        let per_token = cql.counted_per_token(&ks.name).await;
        for (token, n) in &per_token {
            assert!(
                *n <= acked.get(token).copied().unwrap_or(0),
                "{token} counted {n} times, acknowledged {:?}",
                acked.get(token)
            );
        }
        let counted: i64 = per_token.values().sum();
        if counted == acknowledged {
            break counted;
        }
        assert!(
            Instant::now() < deadline,
            "acknowledged {acknowledged}, counted {counted}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    report(format_args!(
        "acknowledged {acknowledged}, counted {counted} ({b} batches)"
    ));
    let (one, two) = (applied(ports[0]).await, applied(ports[1]).await);
    report(format_args!(
        "projector 1 applied {one}, projector 2 applied {two}"
    ));
    assert!(one > 0 && two > 0, "both projectors held partitions");

    wait_caught_up(&topics, &cql, &ks.name).await;
    let incremental = cql.snapshot(&ks.name).await;
    let clean = Keyspace::migrate("rebalance_clean");
    rebuild_into(&topics, &clean, &dir);
    assert_same_tables(&incremental, &cql.snapshot(&clean.name).await);
    eprintln!(
        "tables equal a clean rebuild ({} rows); {:.1} s",
        incremental.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Events a projector applied (its `/metrics`), 0 before it has any.
async fn applied(port: u16) -> u64 {
    let Ok(r) = client()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
    else {
        return 0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("hindsight_projector_events_applied_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A clean stop, as an orchestrator scaling down would ask.
fn sigterm(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::path::Path::new(&format!("/proc/{pid}/cmdline")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.rsplit(") ").next().unwrap_or("").starts_with('Z'))
    {
        assert!(
            Instant::now() < deadline,
            "projector {pid} did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
