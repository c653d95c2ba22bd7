//! A real Restate server for tests and the `restate_payment` example: `restate-server` 1.7.12
//! (the npm package `@restatedev/restate-server`, whose platform package carries the binary) on
//! free loopback ports with its data in a temporary directory, stopped by pid; and a service
//! process, restarted whenever it dies. Include it with `#[path = "common/restate.rs"] mod restate;`.

#![allow(dead_code)] // each user takes a part of it

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The server version the tests are written against, and the npm packages that carry it.
pub const VERSION: &str = "1.7.12";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Where npm installs the server when it is not on this machine yet.
fn npm_prefix() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache").join("idem-restate")
}

fn installed_binary(prefix: &Path) -> Option<PathBuf> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => other,
    };
    let path = prefix
        .join("node_modules/@restatedev")
        .join(format!("restate-server-{}-{arch}", std::env::consts::OS))
        .join("bin/restate-server");
    path.is_file().then_some(path)
}

/// The `restate-server` binary: `IDEM_RESTATE_SERVER`, else one on the `PATH`, else the one npm
/// installed under `~/.cache/idem-restate` (installing it there first, if npm is here).
pub fn server_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("IDEM_RESTATE_SERVER") {
        return Ok(PathBuf::from(path));
    }
    if let Some(path) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("restate-server"))
            .find(|p| p.is_file())
    }) {
        return Ok(path);
    }
    let prefix = npm_prefix();
    if let Some(path) = installed_binary(&prefix) {
        return Ok(path);
    }
    std::fs::create_dir_all(&prefix).map_err(|e| format!("{}: {e}", prefix.display()))?;
    let out = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--prefix"])
        .arg(&prefix)
        .arg(format!("@restatedev/restate-server@{VERSION}"))
        .arg(format!("@restatedev/restate@{VERSION}"))
        .output()
        .map_err(|e| format!("npm is not available to install restate-server: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "npm install @restatedev/restate-server@{VERSION} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    installed_binary(&prefix).ok_or_else(|| {
        format!(
            "npm installed @restatedev/restate-server@{VERSION}, but no binary for this platform"
        )
    })
}

/// A Restate server of its own: killed (by pid) and its data removed when dropped.
pub struct Restate {
    child: Child,
    ingress: u16,
    admin: u16,
    _data: tempfile::TempDir,
    http: reqwest::Client,
}

impl Restate {
    /// Starts a server and waits until its ingress and admin answer.
    pub fn start() -> Result<Restate, String> {
        let binary = server_binary()?;
        let data = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (ingress, admin, fabric) = (free_port(), free_port(), free_port());
        let log =
            std::fs::File::create(data.path().join("server.log")).map_err(|e| e.to_string())?;
        let child = Command::new(&binary)
            .arg("--base-dir")
            .arg(data.path())
            .args([
                "--bind-ip",
                "127.0.0.1",
                "--listen-mode",
                "tcp",
                "--no-logo",
            ])
            .args(["--bind-port", &fabric.to_string()])
            .args(["--node-name", "idem-test", "--default-num-partitions", "2"])
            .env(
                "RESTATE_INGRESS__BIND_ADDRESS",
                format!("127.0.0.1:{ingress}"),
            )
            .env("RESTATE_ADMIN__BIND_ADDRESS", format!("127.0.0.1:{admin}"))
            .env("RESTATE_DISABLE_TELEMETRY", "true")
            // Retry a failed attempt soon, and never give up within a test.
            .env("RESTATE_DEFAULT_RETRY_POLICY__INITIAL_INTERVAL", "50ms")
            .env("RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL", "500ms")
            .env("RESTATE_DEFAULT_RETRY_POLICY__MAX_ATTEMPTS", "10000")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let server = Restate {
            child,
            ingress,
            admin,
            _data: data,
            http: reqwest::Client::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        for port in [admin, ingress] {
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if Instant::now() > deadline {
                    return Err(format!("restate-server did not listen on {port} in 60 s"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(server)
    }

    /// The ingress port.
    pub fn ingress(&self) -> u16 {
        self.ingress
    }

    /// Registers the service deployment listening on `port`, through the admin API.
    pub async fn register(&self, port: u16) -> Result<(), String> {
        let url = format!("http://127.0.0.1:{}/deployments", self.admin);
        let body = serde_json::json!({"uri": format!("http://127.0.0.1:{port}"), "force": true});
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = self.http.post(&url).json(&body).send().await;
            let last = match answer {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(format!("registering the deployment failed: {last}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Calls `service/handler` through the ingress with `body` and waits for the result, however
    /// many attempts Restate makes.
    pub async fn call(
        &self,
        service: &str,
        handler: &str,
        body: &serde_json::Value,
    ) -> Result<String, String> {
        let url = format!("http://127.0.0.1:{}/{service}/{handler}", self.ingress);
        let answer = self
            .http
            .post(&url)
            .json(body)
            .timeout(Duration::from_secs(300))
            .send()
            .await
            .map_err(|e| format!("{service}/{handler}: {e}"))?;
        let status = answer.status();
        let text = answer.text().await.map_err(|e| e.to_string())?;
        if status.is_success() {
            Ok(text)
        } else {
            Err(format!("{service}/{handler}: {status}: {text}"))
        }
    }
}

impl Drop for Restate {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// A service process (`PROGRAM serve PORT`, with `env`), started again whenever it exits, until
/// dropped: then killed by pid.
pub struct Service {
    port: u16,
    stop: Arc<AtomicBool>,
    restarts: Arc<AtomicU32>,
    current: Arc<Mutex<Option<u32>>>,
    supervisor: Option<std::thread::JoinHandle<()>>,
}

impl Service {
    /// Starts the service and its supervisor; returns once it listens.
    pub fn start(program: &Path, env: Vec<(String, String)>) -> Service {
        let port = free_port();
        let stop = Arc::new(AtomicBool::new(false));
        let restarts = Arc::new(AtomicU32::new(0));
        let current = Arc::new(Mutex::new(None));
        let supervisor = {
            let (program, stop, restarts, current) = (
                program.to_owned(),
                stop.clone(),
                restarts.clone(),
                current.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let mut child = Command::new(&program)
                        .args(["serve", &port.to_string()])
                        .envs(env.iter().cloned())
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
                    *current.lock().unwrap() = Some(child.id());
                    let _ = child.wait();
                    *current.lock().unwrap() = None;
                    if !stop.load(Ordering::SeqCst) {
                        restarts.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the service did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Service {
            port,
            stop,
            restarts,
            current,
            supervisor: Some(supervisor),
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many times it died and was started again.
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::SeqCst)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let Some(supervisor) = self.supervisor.take() else {
            return;
        };
        // Kill whatever runs until the supervisor has seen the stop (it may be starting one).
        while !supervisor.is_finished() {
            if let Some(pid) = *self.current.lock().unwrap() {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = supervisor.join();
    }
}
