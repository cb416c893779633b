//! A stopped service lets go of what it opened: nothing it started keeps
//! running with its backends, so their files and page caches are closed
//! with the last handle. (The export job worker used to run until the
//! process ended, holding the embedded store open after the service had
//! stopped: ~45 MB of SQLite page caches and the deleted files, in a
//! process that runs services one after the other, as the benchmarks do.)

use crate::helpers::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// Files of this process open under `dir`.
fn open_files_under(dir: &Path) -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .map(|target| target.display().to_string())
        .collect()
}

/// Waits up to 5 s for every file under `dir` to be closed, and returns
/// those still open.
async fn still_open_after_stop(dir: &Path) -> Vec<String> {
    let started = Instant::now();
    loop {
        let open = open_files_under(dir);
        if open.is_empty() || started.elapsed() > Duration::from_secs(5) {
            return open;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `app` until it answers, stops it, and returns the files of its
/// data directory still open once they had 5 s to close.
async fn open_after_stopping(app: TestApp) -> Vec<String> {
    let dir = app.data_dir.clone();
    let status = reqwest::get(app.api_url("/livez")).await.unwrap().status();
    assert_eq!(status, 200);
    assert!(
        !open_files_under(&dir).is_empty(),
        "the running services have their data directory open"
    );
    app.stop().await;
    still_open_after_stop(&dir).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_dev_service_closes_every_file_of_its_data_directory() {
    let app = spawn_dev("shutdown-dev").await;
    assert_eq!(open_after_stopping(app).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_ingest_projector_and_api_services_close_every_file_of_their_data_directory() {
    let app = spawn_app("shutdown-services").await;
    assert_eq!(open_after_stopping(app).await, Vec::<String>::new());
}
