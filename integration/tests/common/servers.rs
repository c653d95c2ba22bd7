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

    /// A stall (a paused VM, a machine swapping): SIGSTOP to the server and every backend;
    /// sockets stay open, nothing answers. [`PrivatePostgres::resume`] ends it.
    pub fn pause(&self) {
        self.signal_all("-STOP");
    }

    /// Ends a [`PrivatePostgres::pause`].
    pub fn resume(&self) {
        self.signal_all("-CONT");
    }

    fn signal_all(&self, signal: &str) {
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid")).unwrap();
        let pid = pid.lines().next().unwrap().trim().to_owned();
        let children = Command::new("pgrep").args(["-P", &pid]).output().unwrap();
        let mut pids = vec![pid];
        pids.extend(
            String::from_utf8_lossy(&children.stdout)
                .split_whitespace()
                .map(str::to_owned),
        );
        run(Command::new("kill").arg(signal).args(&pids));
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
        // A paused server would not hear the stop.
        if let Ok(pid) = std::fs::read_to_string(self.data.join("postmaster.pid")) {
            let pid = pid.lines().next().unwrap_or_default().trim().to_owned();
            let _ = Command::new("pkill").args(["-CONT", "-P", &pid]).status();
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
        }
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

    /// A stall: SIGSTOP; sockets stay open, nothing answers. [`PrivateRedis::resume`] ends it.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Ends a [`PrivateRedis::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        run(Command::new("kill").args([signal, &pid]));
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
/// It runs [`watched`]: a test binary may keep one in a `static`.
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
        let mut args = Vec::new();
        if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path()));
            // PgBouncer refuses to run as root; it switches user itself.
            args.extend(["-u".to_owned(), "postgres".to_owned()]);
        }
        args.push(dir.path().join("pgbouncer.ini").display().to_string());
        let watch = watched("pgbouncer", &args);
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

/// A free loopback port `p` whose cluster bus port `p + 10000` is free too.
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Starts `program args…` under a shell that kills it (SIGKILL) when its standard input closes:
/// when the handle is dropped, or the test process exits however it exits.
pub fn watched(program: &str, args: &[String]) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg("\"$@\" & child=$!; read _ignored; kill -9 $child")
        .arg("sh")
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

/// A throwaway Redis Cluster: `masters` primaries with one replica each, made with
/// `redis-cli --cluster create` on free loopback ports, without persistence, with a 1 s node
/// timeout so that a failover takes a couple of seconds.
pub struct PrivateCluster {
    pub ports: Vec<u16>,
    /// The server's program: `redis-server`, or Valkey's.
    program: String,
    _dir: tempfile::TempDir,
    /// Each node's `redis-server` arguments, to start it again.
    args: Vec<Vec<String>>,
    nodes: std::sync::Mutex<Vec<Child>>,
}

impl PrivateCluster {
    pub fn start(masters: usize) -> Self {
        Self::start_with("redis-server", masters)
    }

    /// The same cluster of `program` (a `valkey-server`; `redis-cli` creates it all the same).
    pub fn start_with(program: &str, masters: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < masters * 2 {
            let port = free_cluster_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let args: Vec<Vec<String>> = ports
            .iter()
            .map(|port| {
                let node_dir = dir.path().join(port.to_string());
                std::fs::create_dir(&node_dir).unwrap();
                let args: Vec<String> = [
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "1000",
                    // A replica syncs at once (the default waits 5 s to batch replicas): a
                    // replica that never synced never takes over.
                    "--repl-diskless-sync-delay",
                    "0",
                    "--appendonly",
                    "no",
                    "--save",
                    "",
                    "--dir",
                    &node_dir.display().to_string(),
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                args
            })
            .collect();
        let nodes = args.iter().map(|a| watched(program, a)).collect();
        for port in &ports {
            wait_for_port(*port, "redis-server (cluster node)");
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for port in &ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        run(create.args(["--cluster-replicas", "1", "--cluster-yes"]));
        let cluster = PrivateCluster {
            ports,
            program: program.to_owned(),
            _dir: dir,
            args,
            nodes: std::sync::Mutex::new(nodes),
        };
        cluster.wait_until_ok(&cluster.ports);
        cluster.wait_until_synced(&cluster.ports);
        cluster
    }

    /// Waits until every replica among `ports` is in sync with its primary.
    pub fn wait_until_synced(&self, ports: &[u16]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in ports {
            loop {
                let info = self.info(*port, "info", "replication");
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(Instant::now() < deadline, "a replica did not sync");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Starts the (killed) node on `port` again: it rejoins as a replica of the primary that
    /// took its place.
    pub fn restart(&self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).expect("a node");
        let child = watched(&self.program, &self.args[i]);
        self.nodes.lock().unwrap().push(child);
        wait_for_port(port, "redis-server (cluster node)");
        self.wait_until_ok(&[port]);
        self.wait_until_synced(&[port]);
    }

    /// The primary that holds `key` (the one that answers for it instead of `MOVED`), once the
    /// cluster agrees on one.
    pub fn primary_of(&self, key: &str) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let owners: Vec<u16> = self
                .primaries()
                .into_iter()
                .filter(|port| matches!(self.cli(*port, &["EXISTS", key]).trim(), "0" | "1"))
                .collect();
            if let [owner] = owners[..] {
                return owner;
            }
            assert!(
                Instant::now() < deadline,
                "no one primary holds {key}: {owners:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every node in `ports` says `cluster_state:ok`.
    pub fn wait_until_ok(&self, ports: &[u16]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in ports {
            while !self
                .info(*port, "cluster", "info")
                .contains("cluster_state:ok")
            {
                assert!(Instant::now() < deadline, "the cluster did not settle");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// `redis-cli` against the node on `port`.
    fn redis_cli(port: u16) -> Command {
        let mut cli = Command::new("redis-cli");
        cli.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
        cli
    }

    /// What the node on `port` answers to `args` (nothing when it is down).
    fn cli(&self, port: u16, args: &[&str]) -> String {
        Self::redis_cli(port)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    fn info(&self, port: u16, a: &str, b: &str) -> String {
        self.cli(port, &[a, b])
    }

    /// The ports of the nodes that are primaries now.
    pub fn primaries(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|port| {
                self.info(*port, "info", "replication")
                    .contains("role:master")
            })
            .collect()
    }

    /// The primaries that have a connected replica.
    pub fn primaries_with_a_replica(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|port| {
                let info = self.info(*port, "info", "replication");
                info.contains("role:master") && !info.contains("connected_slaves:0")
            })
            .collect()
    }

    /// What a network partition followed by a crash does to the primary on `port`: its
    /// replica is frozen (SIGSTOP), the primary drops the replication link and goes on
    /// acknowledging writes for `window`, then dies (SIGKILL) and the replica resumes (SIGCONT),
    /// without what was acknowledged in the window; after the node timeout it takes over.
    pub fn partition_then_kill(&self, port: u16, window: Duration) {
        let info = self.info(port, "info", "replication");
        let replica: u16 = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("slave0:"))
            .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("port=")))
            .and_then(|p| p.parse().ok())
            .expect("the primary names its replica");
        let replica_pid = self.pid(replica);
        run(Command::new("kill").args(["-STOP", &replica_pid]));
        run(Self::redis_cli(port).args(["CLIENT", "KILL", "TYPE", "replica"]));
        std::thread::sleep(window);
        self.kill(port);
        run(Command::new("kill").args(["-CONT", &replica_pid]));
    }

    fn pid(&self, port: u16) -> String {
        self.info(port, "info", "server")
            .lines()
            .find_map(|l| l.trim().strip_prefix("process_id:"))
            .expect("the node says its pid")
            .to_owned()
    }

    /// Kills the node on `port` with SIGKILL (its replica takes over after the node timeout).
    pub fn kill(&self, port: u16) {
        run(Command::new("kill").args(["-9", &self.pid(port)]));
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}
