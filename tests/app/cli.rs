//! The command line as operators and scripts use it: each subcommand shows
//! its own flags only, and boolean variables take `1`/`0`.

use crate::helpers::*;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

fn help(subcommand: &str) -> String {
    let out = hindsight().args([subcommand, "--help"]).output().unwrap();
    assert!(out.status.success(), "{subcommand} --help");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn each_subcommand_shows_only_its_own_flags() {
    let projector = help("projector");
    for absent in [
        "--ingest-token",
        "--ingest-max-body-bytes",
        "--kafka-max-in-flight",
        "--kafka-delivery-timeout-ms",
        "--kafka-partitions",
        "--kafka-replication",
        "--scylla-replication",
        "--listen ",
        "--no-demo",
    ] {
        assert!(
            !projector.contains(absent),
            "projector --help shows {absent}:\n{projector}"
        );
    }
    for present in [
        "--kafka-brokers",
        "--kafka-group",
        "--kafka-instance-id",
        "--scylla-nodes",
        "--scylla-write-concurrency",
        "--metrics-listen",
        "--projector-batch-max",
        "--projector-step-rows-max",
        "--data-dir",
    ] {
        assert!(
            projector.contains(present),
            "projector --help lacks {present}"
        );
    }
    let api = help("api");
    assert!(!api.contains("--kafka"), "{api}");
    assert!(!api.contains("--scylla-write-concurrency"), "{api}");
    assert!(!api.contains("--scylla-replication"), "{api}");
    // Ingest reads the store's catalog and claims idempotency keys in it
    // (Kafka mode); it never writes bucket rows.
    let ingest = help("ingest");
    assert!(ingest.contains("--scylla-nodes"), "{ingest}");
    assert!(!ingest.contains("--scylla-write-concurrency"), "{ingest}");
    assert!(!ingest.contains("--scylla-replication"), "{ingest}");
    assert!(!ingest.contains("--kafka-group"), "{ingest}");
    assert!(ingest.contains("--kafka-max-in-flight"), "{ingest}");
    let backfill = help("backfill");
    assert!(backfill.contains("--scylla-nodes"), "{backfill}");
    assert!(
        !backfill.contains("--scylla-write-concurrency"),
        "{backfill}"
    );
    assert!(!backfill.contains("--kafka-group"), "{backfill}");
    assert!(!backfill.contains("--kafka-partitions"), "{backfill}");
    assert!(help("kafka").contains("--kafka-partitions"));
    assert!(help("scylla").contains("--scylla-replication"));
}

/// Starts `hindsight dev` with `env` and returns its welcome text (up to
/// "Stop with Ctrl-C."), killing it afterwards.
fn dev_welcome(name: &str, env: &[(&str, &str)]) -> String {
    let dir = temp_dir(name);
    let mut child = hindsight()
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .envs(env.iter().copied())
        .env("HINDSIGHT_DEMO_HISTORY_HOURS", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut text = String::new();
    while let Some(Ok(line)) = lines.next() {
        text += &line;
        text += "\n";
        if line.starts_with("Stop with Ctrl-C") || Instant::now() > deadline {
            break;
        }
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        text.contains("Stop with Ctrl-C"),
        "dev did not start: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn boolean_variables_accept_one_and_zero() {
    let without = dev_welcome("no-demo-1", &[("HINDSIGHT_NO_DEMO", "1")]);
    assert!(!without.contains("Demo markets"), "{without}");
    let with = dev_welcome("no-demo-0", &[("HINDSIGHT_NO_DEMO", "0")]);
    assert!(with.contains("Demo markets"), "{with}");

    let dir = temp_dir("no-progress");
    let file = dir.join("events.ndjson");
    std::fs::write(&file, market_line("np") + "\n").unwrap();
    let out = hindsight()
        .args(["backfill", "--data-dir"])
        .arg(&dir)
        .arg(&file)
        .env("HINDSIGHT_NO_PROGRESS", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 appended"));
}

#[test]
fn a_service_says_where_it_listens() {
    let dir = temp_dir("listening-line");
    let mut child = hindsight()
        .args(["api", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .env_remove("HINDSIGHT_LOG")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The default log filter shows the line; nothing else is logged at
    // start, so it is the first line on stderr.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines.next().and_then(Result::ok).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    let addr = line
        .split("hindsight api listening on http://")
        .nth(1)
        .unwrap_or_else(|| panic!("no listening line: {line:?}"));
    let addr: String = addr
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ':'))
        .collect();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{line}");
}

/// Every serving subcommand bounds its connections by flag and variable,
/// refuses a zero bound, and `dev` can put its ops routes apart.
#[test]
fn every_serving_subcommand_takes_connection_bounds_and_an_ops_address() {
    for subcommand in ["dev", "ingest", "api", "projector"] {
        let text = help(subcommand);
        for (flag, var) in [
            (
                "--http-header-timeout-secs",
                "HINDSIGHT_HTTP_HEADER_TIMEOUT_SECS",
            ),
            (
                "--http-idle-timeout-secs",
                "HINDSIGHT_HTTP_IDLE_TIMEOUT_SECS",
            ),
            (
                "--http-request-timeout-secs",
                "HINDSIGHT_HTTP_REQUEST_TIMEOUT_SECS",
            ),
            ("--http-max-connections", "HINDSIGHT_HTTP_MAX_CONNECTIONS"),
            ("--metrics-listen", "HINDSIGHT_METRICS_LISTEN"),
        ] {
            assert!(
                text.contains(flag) && text.contains(var),
                "{subcommand} --help lacks {flag} / {var}:\n{text}"
            );
        }
    }
    let out = hindsight()
        .args(["dev", "--http-max-connections", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--http-max-connections"), "{err}");
    let out = hindsight()
        .args(["api", "--listen", "127.0.0.1:0"])
        .env("HINDSIGHT_HTTP_HEADER_TIMEOUT_SECS", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--http-header-timeout-secs"), "{err}");
}

/// With the CQL store, API replicas share no data directory: each must be
/// given the cursor secret, and `api` refuses to start without one (before
/// connecting to anything). A secret too short to be one is refused too.
#[test]
fn the_api_needs_a_cursor_secret_on_the_cql_store_and_a_long_enough_one() {
    for subcommand in ["api", "dev"] {
        let text = help(subcommand);
        assert!(
            text.contains("--cursor-secret") && text.contains("HINDSIGHT_CURSOR_SECRET"),
            "{subcommand} --help lacks --cursor-secret:\n{text}"
        );
    }
    let dir = temp_dir("cursor-secret-cql");
    let refusal = |args: &[&str], secret: Option<&str>| {
        let mut cmd = hindsight();
        cmd.args(["api", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .args(args)
            .env_remove("HINDSIGHT_CURSOR_SECRET");
        if let Some(secret) = secret {
            cmd.env("HINDSIGHT_CURSOR_SECRET", secret);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{err}");
        err
    };
    let err = refusal(&["--scylla-nodes", "127.0.0.1:1"], None);
    assert!(
        err.contains("HINDSIGHT_CURSOR_SECRET (or --cursor-secret) is required with the CQL store"),
        "{err}"
    );
    assert!(!dir.join("cursor.secret").exists(), "no secret of its own");
    let err = refusal(&[], Some("0123456789abcdef0123456789abcdef,short"));
    assert!(
        err.contains("cursor secret 2 is 5 bytes; at least 32"),
        "{err}"
    );
}
