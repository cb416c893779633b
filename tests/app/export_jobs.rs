//! Export jobs (`POST /v1/exports`) on the embedded default: a job's file
//! is byte for byte the streamed export of the same parameters, in CSV and
//! Parquet, written in many small chunks; jobs are their organization's
//! only, gated by the plan and counted by the rate limit; a job whose
//! replica died holding it runs again once its lease runs out and still
//! downloads the same bytes; the streamed route refuses, with 413 naming
//! `POST /v1/exports`, an export over its row limit.

use crate::export::{ingested, input, DAY, HOURS};
use crate::helpers::*;
use hindsight_api::jobs::JobConfig;
use hindsight_contracts::{ExportJobStore, JobStatus};
use hindsight_schemas::time::Clock;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Small chunks: every file here spans many of them.
fn options() -> Options {
    Options {
        export_jobs: JobConfig {
            chunk_bytes: 1000,
            poll: Duration::from_millis(20),
            ..JobConfig::default()
        },
        ..Options::default()
    }
}

async fn send(
    req: reqwest::RequestBuilder,
    key: &str,
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let r = req.header("X-API-Key", key).send().await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.bytes().await.unwrap().to_vec())
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

async fn create(base: &str, key: &str, query: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    let (status, headers, bytes) =
        send(client().post(format!("{base}/v1/exports?{query}")), key).await;
    (status, headers, json(&bytes))
}

/// Polls the job until it is done (or panics after 30 s, or if it fails).
async fn done(base: &str, key: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, bytes) = send(client().get(format!("{base}/v1/exports/{id}")), key).await;
        let job = json(&bytes);
        assert_eq!(status, 200, "{job}");
        assert_ne!(job["status"], "failed", "{job}");
        if job["status"] == "done" {
            return job;
        }
        assert!(Instant::now() < deadline, "the job never finished: {job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_job_downloads_the_bytes_of_the_streamed_export_in_csv_and_parquet() {
    let app = spawn_app_with("export-jobs", options()).await;
    ingested(&app, &input()).await;
    let key = app.key("enterprise").await;
    let range = format!("start_ts={DAY}&end_ts={}", DAY + HOURS * 3600);
    let mut ids = Vec::new();
    for (kind, target, res, format) in [
        ("prices", "market_id=m1-slug", "1m", "csv"),
        ("prices", "market_id=m1", "1m", "parquet"),
        ("books", "token_id=m1-yes", "1m", "csv"),
        ("metrics", "market_id=m1", "1m", "parquet"),
        ("candles", "token_id=m1-yes", "1m", "csv"),
        ("prices", "token_id=m1-yes", "tick", "parquet"),
        ("books", "market_id=m1", "tick", "csv"),
    ] {
        let query = format!("{target}&{range}&resolution={res}&format={format}");
        let (status, sync_headers, sync) = send(
            client().get(app.api_url(&format!("/v1/export/{kind}?{query}"))),
            &key,
        )
        .await;
        assert_eq!(status, 200, "{kind} {query}");
        assert!(
            sync.len() > 2000,
            "{kind} {format}: {} bytes fit in few chunks",
            sync.len()
        );

        let (status, headers, job) = create(&app.api, &key, &format!("kind={kind}&{query}")).await;
        assert_eq!(status, 202, "{job}");
        let id = job["id"].as_str().unwrap().to_string();
        assert_eq!(headers["location"], format!("/v1/exports/{id}"));
        assert_eq!(
            (job["kind"].as_str(), job["format"].as_str()),
            (Some(kind), Some(format))
        );
        assert!(
            job["status"] == "queued" || job["status"] == "running",
            "{job}"
        );
        assert!(job["download_url"].is_null(), "{job}");
        let total = job["total_rows"].as_u64().unwrap();
        assert!(total > 0, "{job}");

        let job = done(&app.api, &key, &id).await;
        assert_eq!(job["rows"].as_u64(), Some(total), "{job}");
        assert_eq!(job["progress"], 1.0);
        assert_eq!(job["bytes"].as_u64(), Some(sync.len() as u64));
        assert!(job["expires_at"].is_string(), "{job}");
        let url = job["download_url"].as_str().unwrap();
        assert_eq!(url, format!("/v1/exports/{id}/download"));

        let (status, headers, file) = send(client().get(app.api_url(url)), &key).await;
        assert_eq!(status, 200);
        assert!(
            file == sync,
            "{kind} {format}: the job's file differs from the streamed export"
        );
        assert_eq!(headers["content-length"], sync.len().to_string().as_str());
        assert_eq!(headers["content-type"], sync_headers["content-type"]);
        assert_eq!(
            headers["content-disposition"],
            sync_headers["content-disposition"]
        );
        ids.push(id);
        // Jobs are listed by creation time: the next is a second later.
        app.clock.advance(Duration::from_secs(1));
    }
    let (status, _, list) = send(client().get(app.api_url("/v1/exports")), &key).await;
    assert_eq!(status, 200);
    let listed: Vec<String> = json(&list)["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect();
    ids.reverse();
    assert_eq!(listed, ids, "the caller's jobs, newest first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_jobs_are_their_organizations_gated_by_the_plan_and_rate_counted() {
    let app = spawn_app_with("export-jobs-owners", options()).await;
    ingested(&app, &input()).await;
    let (ours, colleague) = (
        app.key_of("org-a", "pro").await,
        app.key_of("org-a", "pro").await,
    );
    let stranger = app.key_of("org-b", "enterprise").await;
    let range = format!("start_ts={DAY}&end_ts={}", DAY + HOURS * 3600);
    let (status, headers, job) = create(
        &app.api,
        &ours,
        &format!("kind=prices&token_id=m1-yes&{range}&resolution=1h"),
    )
    .await;
    assert_eq!(status, 202, "{job}");
    let limit: u64 = headers["x-ratelimit-limit"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let left: u64 = headers["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        (limit, left),
        (600, 599),
        "creating a job is one request of the key's minute"
    );
    let id = job["id"].as_str().unwrap();
    done(&app.api, &colleague, id).await;

    for path in [
        format!("/v1/exports/{id}"),
        format!("/v1/exports/{id}/download"),
    ] {
        let (status, _, body) = send(client().get(app.api_url(&path)), &stranger).await;
        assert_eq!(
            status,
            404,
            "another organization's key reads {path}: {}",
            json(&body)
        );
        assert_eq!(json(&body)["detail"], "Export job not found");
    }
    let (_, _, list) = send(client().get(app.api_url("/v1/exports")), &stranger).await;
    assert_eq!(json(&list)["data"], serde_json::json!([]));
    let (status, headers, _) = send(client().get(app.api_url("/v1/exports")), &ours).await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-ratelimit-remaining"], "598",
        "listing is counted too"
    );

    // The plan gates a job as it gates the streamed export.
    let free = app.key_of("org-c", "free").await;
    for (query, want) in [
        (
            format!("kind=books&token_id=m1-yes&{range}&resolution=1h"),
            403,
        ),
        (
            format!("kind=prices&token_id=m1-yes&{range}&resolution=1m"),
            403,
        ),
        // Trades take no resolution (one given is ignored); free has none.
        (
            format!("kind=trades&token_id=m1-yes&{range}&resolution=1h"),
            403,
        ),
        (format!("token_id=m1-yes&{range}&resolution=1h"), 422),
        (format!("kind=metrics&{range}&resolution=1h"), 422),
    ] {
        let (status, _, body) = create(&app.api, &free, &query).await;
        assert_eq!(status, want, "{query}: {body}");
        if status != 202 {
            assert!(
                body["detail"].is_string() || body["detail"].is_array(),
                "{body}"
            );
        }
    }
    let (status, _, body) = create(
        &app.api,
        &ours,
        &format!("kind=prices&token_id=nope&{range}&resolution=1h"),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (status, _, body) = create(
        &app.api,
        &free,
        &format!("kind=ticks&token_id=m1-yes&{range}&resolution=1h"),
    )
    .await;
    assert_eq!(
        (status, &body["detail"][0]["loc"]),
        (422, &serde_json::json!(["query", "kind"]))
    );

    // A job not done yet has no file: one a live replica holds, leased
    // far ahead.
    let store = hindsight_sqlite::SqliteStore::open(&app.data_dir).unwrap();
    let now = app.clock.now();
    let running = hindsight_contracts::ExportJob {
        status: JobStatus::Running,
        attempt: 1,
        lease_until: Some(hindsight_schemas::Timestamp(now.0 + 86_400_000)),
        ..hindsight_contracts::ExportJob::queued(
            "not-yet".into(),
            "org:org-a".into(),
            job_request(),
            1,
            now,
        )
    };
    store.create_job(running).await.unwrap();
    let (status, _, body) = send(
        client().get(app.api_url("/v1/exports/not-yet/download")),
        &ours,
    )
    .await;
    assert_eq!(status, 409, "{}", json(&body));
    assert!(
        json(&body)["detail"].as_str().unwrap().contains("running"),
        "{}",
        json(&body)
    );
}

fn job_request() -> String {
    format!(
        r#"{{"params":{{"kind":"prices","token_id":"m1-yes","start_ts":"{DAY}","end_ts":"{}","resolution":"1m","format":"csv"}},"filename":"prices-m1-yes-1m.csv"}}"#,
        DAY + 3600
    )
}

/// A replica that claimed a job and died (its lease left running, a
/// partial chunk written) is replaced: once the lease runs out, a live
/// replica claims the job in a new attempt, writes the file from its first
/// chunk, and the download is the streamed export's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_replica_died_runs_again_after_its_lease_and_downloads_the_same_bytes() {
    // This app's worker looks for jobs once an hour: it never takes one.
    let idle = Options {
        export_jobs: JobConfig {
            poll: Duration::from_secs(3600),
            ..options().export_jobs
        },
        ..Options::default()
    };
    let app = spawn_app_with("export-jobs-restart", idle).await;
    ingested(&app, &input()).await;
    let key = app.key("enterprise").await;
    let query = format!(
        "market_id=m1&start_ts={DAY}&end_ts={}&resolution=1m&format=parquet",
        DAY + HOURS * 3600
    );
    let (status, _, sync) = send(
        client().get(app.api_url(&format!("/v1/export/prices?{query}"))),
        &key,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, job) = create(&app.api, &key, &format!("kind=prices&{query}")).await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();

    // The replica that dies: claims the job for 30 s, writes half a chunk.
    let dead = hindsight_sqlite::SqliteStore::open(&app.data_dir).unwrap();
    let lease = Duration::from_secs(30);
    let now = app.clock.now();
    let claimed = dead
        .claim_job(
            now,
            hindsight_schemas::Timestamp(now.0 + lease.as_millis() as i64),
        )
        .await
        .unwrap()
        .expect("the queued job is claimable");
    assert_eq!((claimed.id.as_str(), claimed.attempt), (id.as_str(), 1));
    dead.put_chunk(&id, 1, 0, b"PAR1 half a file".to_vec())
        .await
        .unwrap();
    drop(dead);

    let replica = spawn_api_replica(&app, &[]).await;
    // While the lease holds, the live replica leaves the job alone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, _, now_job) = send(
        client().get(replica.url(&format!("/v1/exports/{id}"))),
        &key,
    )
    .await;
    let now_job = json(&now_job);
    assert_eq!(
        (now_job["status"].as_str(), now_job["rows"].as_u64()),
        (Some("running"), Some(0)),
        "{now_job}"
    );

    app.clock.advance(lease);
    let job = done(&replica.api, &key, &id).await;
    let store = hindsight_sqlite::SqliteStore::open(&app.data_dir).unwrap();
    let stored = store.job(&id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.attempt),
        (JobStatus::Done, 2),
        "{stored:?}"
    );
    assert_eq!(job["bytes"].as_u64(), Some(sync.len() as u64));
    let (status, _, file) = send(
        client().get(replica.url(&format!("/v1/exports/{id}/download"))),
        &key,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        file == sync,
        "the rerun job's file differs from the streamed export"
    );
    assert_eq!(
        store.chunk(&id, 1, 0).await.unwrap(),
        None,
        "the dead attempt's chunk is gone"
    );
}

/// Over the row limit the streamed route answers 413 and names the job
/// route; the job of the same export runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_over_the_row_limit_is_refused_with_413_naming_export_jobs() {
    let opts = Options {
        export_jobs: JobConfig {
            max_sync_rows: 100,
            ..options().export_jobs
        },
        ..Options::default()
    };
    let app = spawn_app_with("export-jobs-limit", opts).await;
    ingested(&app, &input()).await;
    let key = app.key("enterprise").await;
    let range = format!("start_ts={DAY}&end_ts={}", DAY + HOURS * 3600);
    let small = format!("token_id=m1-yes&{range}&resolution=1h");
    let (status, _, _) = send(
        client().get(app.api_url(&format!("/v1/export/prices?{small}"))),
        &key,
    )
    .await;
    assert_eq!(status, 200, "3 rows fit");
    let large = format!("token_id=m1-yes&{range}&resolution=1m");
    let (status, _, body) = send(
        client().get(app.api_url(&format!("/v1/export/prices?{large}"))),
        &key,
    )
    .await;
    let detail = json(&body)["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(status, 413, "{detail}");
    assert!(
        detail.contains("180 rows") && detail.contains("POST /v1/exports?kind=prices"),
        "{detail}"
    );
    let (status, _, job) = create(&app.api, &key, &format!("kind=prices&{large}")).await;
    assert_eq!(status, 202, "{job}");
    let job = done(&app.api, &key, job["id"].as_str().unwrap()).await;
    assert_eq!(job["rows"], 180);

    // Ticks are counted as buckets are (`count_ticks`, without reading
    // them): over the limit, a tick-level export is a job too.
    let ticks = format!("token_id=m1-yes&{range}&resolution=tick");
    let (status, _, body) = send(
        client().get(app.api_url(&format!("/v1/export/prices?{ticks}"))),
        &key,
    )
    .await;
    let detail = json(&body)["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(status, 413, "{detail}");
    assert!(detail.contains("541 rows"), "{detail}");
    let (status, _, job) = create(&app.api, &key, &format!("kind=prices&{ticks}")).await;
    assert_eq!(status, 202, "{job}");
    assert_eq!(job["total_rows"], 541);
    let job = done(&app.api, &key, job["id"].as_str().unwrap()).await;
    assert_eq!(job["rows"], 541);
}
