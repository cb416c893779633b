//! The processes the benchmarks measure: the release `hindsight` binary
//! next to this one, an API server started from it on a free loopback port
//! (killed when dropped, so a failed section leaves nothing running), and
//! memory figures read from /proc.
//!
//! The server runs as a separate process on purpose: its memory and CPU are
//! its own, not mixed with the load generator's.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The release `hindsight` binary beside this benchmark's own.
pub fn release_binary() -> anyhow::Result<PathBuf> {
    let bin = std::env::current_exe()?.with_file_name("hindsight");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: run `cargo build --release` first",
        bin.display()
    );
    Ok(bin)
}

/// A field of `/proc/{who}/status` in MB: `VmRSS:` (resident now) or
/// `VmHWM:` (the most ever resident); `who` is a pid or `self`. NaN when
/// the process is gone.
pub fn memory_mb(who: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{who}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// `hindsight api` listening on a free loopback port.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:{port}`
    pub base: String,
}

impl Server {
    /// Starts `hindsight api --listen 127.0.0.1:{free port}`; `configure`
    /// adds the backend's flags and environment.
    pub fn api(configure: impl FnOnce(&mut Command)) -> anyhow::Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut command = Command::new(release_binary()?);
        command
            .args(["api", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null());
        configure(&mut command);
        Ok(Server {
            child: command.spawn()?,
            base: format!("http://127.0.0.1:{port}"),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the server now, in MB (`field` as [`memory_mb`]).
    pub fn memory_mb(&self, field: &str) -> f64 {
        memory_mb(&self.pid().to_string(), field)
    }

    /// Waits up to a minute until `path` answers 200 with a body `ready`
    /// accepts (the store loaded, the page whole), with `key`.
    pub async fn until_ready(
        &self,
        client: &reqwest::Client,
        path: &str,
        key: &str,
        ready: impl Fn(&str) -> bool,
    ) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.base);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::from("no answer");
        loop {
            if let Ok(r) = client.get(&url).header("X-API-Key", key).send().await {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                if status == 200 && ready(&body) {
                    return Ok(());
                }
                last = format!("{status}: {}", body.chars().take(200).collect::<String>());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{url} was not ready within a minute (last answer {last})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
