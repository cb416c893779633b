//! Debian's nginx serving a byte string as a static file: the anchor for an
//! API page, the least work an HTTP server can do for the same bytes.
//!
//! nginx runs in the foreground from a config written to a temp directory
//! that also holds its pid, logs and temp paths, on a free loopback port;
//! started as root, its workers run as `nobody`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = "/usr/sbin/nginx";

pub struct Nginx {
    child: Child,
    dir: PathBuf,
    /// Where the file is served.
    pub url: String,
}

impl Nginx {
    /// Serves `body` at `{url}` until dropped; ready when it answers with
    /// exactly these bytes.
    pub async fn serve(client: &reqwest::Client, body: &[u8]) -> anyhow::Result<Nginx> {
        anyhow::ensure!(
            std::path::Path::new(BIN).exists(),
            "{BIN} is missing: run scripts/install-tools.sh (Debian's nginx)"
        );
        let dir =
            std::env::temp_dir().join(format!("hindsight-bench-nginx-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("www"))?;
        std::fs::write(dir.join("www/page.json"), body)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let d = dir.display();
        std::fs::write(
            dir.join("nginx.conf"),
            format!(
                "daemon off;
worker_processes auto;
user nobody nogroup;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 10000000;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    types {{ application/json json; }}
    server {{
        listen 127.0.0.1:{port};
        root {d}/www;
    }}
}}
"
            ),
        )?;
        let child = hindsight::allocator::with_system_thp(&mut Command::new(BIN))
            .args(nginx_args(&dir))
            .stdout(Stdio::null())
            .spawn()?;
        let nginx = Nginx {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}/page.json"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = client.get(&nginx.url).send().await {
                anyhow::ensure!(r.status() == 200, "nginx answered {}", r.status());
                anyhow::ensure!(r.bytes().await? == body, "nginx served other bytes");
                return Ok(nginx);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "nginx did not come up: {}",
                std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn nginx_args(dir: &std::path::Path) -> Vec<String> {
    let d = dir.display();
    vec![
        "-p".into(),
        format!("{d}/"),
        "-c".into(),
        format!("{d}/nginx.conf"),
        "-e".into(),
        format!("{d}/error.log"),
    ]
}

impl Drop for Nginx {
    /// A fast shutdown through the master (`-s stop`), which takes its
    /// workers down with it; killing the master alone would orphan them.
    fn drop(&mut self) {
        let stopped = Command::new(BIN)
            .args(nginx_args(&self.dir))
            .args(["-s", "stop"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
