//! Private servers for tests that need their own: a Postgres cluster made with `initdb` in a
//! temporary directory, a `redis-server`, each on a free loopback port, stopped when dropped.
//! Include it with `#[path = "common/servers.rs"] mod servers;`.

#![allow(dead_code)] // each test binary uses a part of it

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A throwaway Postgres cluster. As root, its commands run as the `postgres` user.
pub struct PrivatePostgres {
    bin: PathBuf,
    data: PathBuf,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl PrivatePostgres {
    fn command(&self, program: &str) -> Command {
        command_as_postgres(&self.bin.join(program))
    }

    pub fn create() -> Self {
        Self::create_with(|_| {})
    }

    /// Like [`PrivatePostgres::create`], with `configure` run on the data directory after
    /// `initdb` and before the first start (it may write files there: they are handed to the
    /// server's user).
    pub fn create_with(configure: impl FnOnce(&Path)) -> Self {
        let bin = Command::new("pg_config")
            .arg("--bindir")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .expect("pg_config --bindir names the Postgres binaries");
        let dir = tempfile::tempdir().unwrap();
        if is_root() {
            run(Command::new("chown").arg("postgres").arg(dir.path()));
        }
        let data = dir.path().join("data");
        let pg = PrivatePostgres {
            bin,
            data,
            port: free_port(),
            _dir: dir,
        };
        run(pg
            .command("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&pg.data));
        configure(&pg.data);
        if is_root() {
            run(Command::new("chown").args(["-R", "postgres"]).arg(&pg.data));
        }
        pg.start();
        pg
    }

    pub fn start(&self) {
        let socket_dir = self.data.parent().unwrap();
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.data.join("server.log"))
            .arg("-o")
            .arg(format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {}",
                self.port,
                socket_dir.display()
            ))
            .args(["-w", "start"]));
        wait_for_port(self.port, "postgres");
    }

    /// A crash: no checkpoint, no goodbye to the clients; recovery replays the WAL.
    pub fn kill(&self) {
        run(self.command("pg_ctl").arg("-D").arg(&self.data).args([
            "-m",
            "immediate",
            "-w",
            "stop",
        ]));
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs `sql` as `postgres` over the server's local socket.
    pub fn psql(&self, sql: &str) {
        run(self
            .command("psql")
            .arg("-h")
            .arg(self.data.parent().unwrap())
            .arg("-p")
            .arg(self.port.to_string())
            .args([
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ]));
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn command_as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// A throwaway Redis that writes every command to its append-only file before answering.
pub struct PrivateRedis {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PrivateRedis {
    pub fn create() -> Self {
        let mut redis = PrivateRedis {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        redis.start();
        redis
    }

    pub fn start(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        self.child = Some(child);
        wait_for_port(self.port, "redis-server");
    }

    /// A crash: SIGKILL, nothing flushed beyond what `appendfsync always` already wrote.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A throwaway PgBouncer in `pool_mode = transaction` in front of the Postgres server `upstream`
/// names (host, port, database, user), with `pool_size` server connections for every client.
///
/// It runs under a shell that kills it when its standard input closes, which happens when the
/// test process exits, however it exits: a test binary may keep one in a `static`.
pub struct PrivateBouncer {
    pub port: u16,
    _dir: tempfile::TempDir,
    _watch: Child,
}

impl PrivateBouncer {
    pub fn start(upstream: &str, pool_size: usize) -> Self {
        let config: tokio_postgres::Config = upstream.parse().expect("a Postgres URL");
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            other => panic!("PgBouncer forwards to a TCP host, not {other:?}"),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let database = config
            .get_dbname()
            .expect("a database in the URL")
            .to_owned();
        let user = config.get_user().expect("a user in the URL").to_owned();
        let dir = tempfile::tempdir().unwrap();
        let listen = free_port();
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(
            dir.path().join("pgbouncer.ini"),
            format!(
                "[databases]\n{database} = host={host} port={port} dbname={database} user={user}\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = transaction\ndefault_pool_size = {pool_size}\n\
                 max_client_conn = 500\nlog_connections = 0\nlog_disconnections = 0\n\
                 logfile = {}\npidfile = {}\n",
                path("userlist.txt"),
                path("pgbouncer.log"),
                path("pgbouncer.pid"),
            ),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("userlist.txt"),
            format!("\"{user}\" \"\"\n"),
        )
        .unwrap();
        let as_user = if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path()));
            "-u postgres"
        } else {
            ""
        };
        let watch = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "pgbouncer {as_user} \"$1\" & child=$!; read _ignored; kill $child"
            ))
            .arg("sh")
            .arg(dir.path().join("pgbouncer.ini"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            // Its log goes to `pgbouncer.log` as well.
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer (Debian package pgbouncer)");
        wait_for_port(listen, "pgbouncer");
        PrivateBouncer {
            port: listen,
            _dir: dir,
            _watch: watch,
        }
    }

    /// The URL of `database` as `user` through the pooler.
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }
}
