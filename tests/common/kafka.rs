//! A real Kafka-protocol broker for tests: tansu, with SQLite storage in a
//! temporary directory (never `memory://`, which loses messages).
#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Tansu {
    child: Option<Child>,
    pub dir: PathBuf,
    pub port: u16,
}

impl Tansu {
    pub fn start(dir: &Path) -> Tansu {
        std::fs::create_dir_all(dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut t = Tansu {
            child: None,
            dir: dir.to_path_buf(),
            port,
        };
        t.restart();
        t
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port and storage.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new("tansu")
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "sqlite://tansu.db",
            ])
            .current_dir(&self.dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu is installed (scripts/install-tools.sh installs it)");
        self.child = Some(child);
        let addr: SocketAddr = self.brokers().parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not start listening");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the broker (as a crash would).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `hindsight kafka init` against the broker.
pub fn init_topics(brokers: &str, partitions: u32) {
    let out = Command::new(super::bin())
        .args([
            "kafka",
            "init",
            "--kafka-brokers",
            brokers,
            "--kafka-partitions",
            &partitions.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kafka init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
