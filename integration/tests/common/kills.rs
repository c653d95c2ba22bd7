//! Killing a worker process at random moments: the loop the kill tests share, and what their
//! workers share (synced files, the store by name, a Postgres schema of the test's own).

#![allow(dead_code)] // each kill test uses a part of it

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idem::store::Store;
use idem::store::postgres::PostgresStore;
use idem::store::sqlite::SqliteStore;

/// The path the parent gave a worker in the environment variable `var`.
pub fn env_path(var: &str) -> PathBuf {
    PathBuf::from(std::env::var(var).expect("set by the parent"))
}

/// Appends a line and syncs it to disk (it survives the kill that follows).
pub fn append_synced(path: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open");
    file.write_all(line.as_bytes()).expect("append");
    file.sync_data().expect("sync");
}

/// The store the workers share: the SQLite file, or Postgres when the parent names it.
pub async fn open_store(postgres: Option<&str>, db: &Path) -> Box<dyn Store> {
    match postgres {
        Some(url) => Box::new(PostgresStore::open_url(url).await.expect("open postgres")),
        None => Box::new(SqliteStore::open_path(db).expect("open")),
    }
}

/// The number of kill cycles the environment variable `var` asks for, else `default`.
pub fn cycles(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Starts a worker: this test binary running only its ignored test `test`, given each of
/// `files` as an environment variable (name, path), and `postgres.1` as `postgres.0` when the
/// store is Postgres (the variable removed otherwise, so the worker opens the SQLite file).
pub fn worker(
    test: &str,
    files: &[(&str, &Path)],
    postgres: (&str, Option<&str>),
) -> std::process::Child {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        // Uncaptured, so that a panic's message goes to stderr, which the parent reads.
        .args([
            test,
            "--exact",
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .env_remove(postgres.0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (var, path) in files {
        command.env(var, path);
    }
    if let Some(url) = postgres.1 {
        command.env(postgres.0, url);
    }
    command.spawn().expect("spawn")
}

/// Runs `test` with the URL of a schema named `prefix` and a random suffix on the Postgres
/// server of `IDEM_TEST_POSTGRES_URL` (nothing without one), then drops the schema.
pub fn in_private_schema(prefix: &str, test: impl FnOnce(String)) {
    let Some(url) = idem::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let schema = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    let sep = if url.contains('?') { '&' } else { '?' };
    test(format!("{url}{sep}schema={schema}"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    });
}

/// Starts `child` (given its phase file) `cycles` times and kills each with SIGKILL after a
/// random delay of `base_ms` plus up to `spread_ms`; then a last child, never killed, finishes
/// what is left. Answers how many kills landed after each phase (the last mark in the child's
/// phase file; `-` before the first).
///
/// In every other cycle the delay counts from the child's first mark rather than from its
/// start, so that as many kills land among the calls on a store that is slow to open
/// (Postgres: a pool, the schema check) as on a quick one; the other cycles' kills land
/// while the store opens, too.
pub fn kill_cycles(
    dir: &Path,
    cycles: u32,
    seed: u64,
    (base_ms, spread_ms): (u64, u64),
    child: impl Fn(&Path) -> std::process::Child,
) -> HashMap<char, usize> {
    let mut kills: HashMap<char, usize> = HashMap::new();
    let mut seed = seed ^ u64::from(cycles);
    let mut random = |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    for cycle in 0..cycles {
        let phases = dir.join(format!("phases-{cycle}"));
        let mut running = child(&phases);
        if cycle % 2 == 1 {
            first_mark(&phases, &mut running);
        }
        std::thread::sleep(Duration::from_millis(base_ms + random(spread_ms)));
        let killed = running.try_wait().unwrap().is_none();
        running.kill().ok();
        let output = running.wait_with_output().unwrap();
        if killed {
            let text = std::fs::read_to_string(&phases).unwrap_or_default();
            let last = text
                .lines()
                .last()
                .and_then(|l| l.chars().next())
                .unwrap_or('-');
            *kills.entry(last).or_default() += 1;
        } else {
            assert!(
                output.status.success(),
                "an unkilled child failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    let phases = dir.join("phases-final");
    let last = child(&phases).wait_with_output().unwrap();
    assert!(
        last.status.success(),
        "the last child failed ({}): {}",
        last.status,
        String::from_utf8_lossy(&last.stderr)
    );
    kills
}

/// Waits until the child `running` has marked its phase file, has ended, or has had 30 s.
fn first_mark(phases: &Path, running: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::metadata(phases).is_ok_and(|m| m.len() > 0)
        && running.try_wait().unwrap().is_none()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How many times the children of a [`kill_cycles`] run in `dir` marked `phase`, over all
/// their phase files.
pub fn marks(dir: &Path, phase: char) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("phases-"))
        })
        .map(|path| {
            std::fs::read_to_string(path)
                .unwrap()
                .lines()
                .filter(|line| line.starts_with(phase))
                .count()
        })
        .sum()
}
