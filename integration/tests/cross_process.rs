//! Several OS processes share one store: every intent's effect happens exactly once.
//!
//! Each test starts 4 copies of this test binary as workers (the ignored `worker` test), each with
//! 16 concurrent tasks racing over the same 200 intents, against one SQLite file, the Postgres
//! server of `IDEM_TEST_POSTGRES_URL` and the Redis server of `IDEM_TEST_REDIS_URL`. Each tool
//! body appends the intent to an effect ledger; the parent reads it afterwards.
//!
//! One more test puts a process that only writes beside a store that only replays, on one
//! SQLite file: the store's read-lock keeper must not hold that writer's WAL back.

#[path = "common/race.rs"]
mod race;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use idem::store::conformance::test_server_url;
use idem::{Idem, Outcome, idempotent};

#[test]
#[ignore = "run by the tests below as a child process"]
fn worker() {
    race::worker_main();
}

#[test]
fn several_processes_share_one_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    race::race_once(format!(
        "sqlite://{}",
        dir.path().join("shared.db").display()
    ));
}

#[test]
fn several_processes_share_one_postgres_server() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    race::race_once(url);
}

#[test]
fn several_processes_share_one_redis_server() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    race::race_once(url);
}

/// The commits of the writer process, each of one row of about a page, paced like commits that
/// wait for `fsync` (a millisecond apart).
const WRITER_COMMITS: u32 = 3_000;

/// The WAL's size after each of its commits, as the writer process sees it; it prints the
/// largest.
#[test]
#[ignore = "run by `a_busy_store_holds_back_no_writer_in_another_process` as a child process"]
fn wal_writer() {
    let path = std::env::var("IDEM_WAL_WRITER_DB").expect("set by the parent");
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL; CREATE TABLE IF NOT EXISTS writer (v BLOB NOT NULL)",
    )
    .expect("table");
    let wal = format!("{path}-wal");
    let mut largest = 0;
    for _ in 0..WRITER_COMMITS {
        conn.execute("INSERT INTO writer VALUES (zeroblob(3000))", [])
            .expect("insert");
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("largest_wal_bytes={largest}");
}

#[idempotent(key = "n", mutating, name = "cross.lookup")]
async fn lookup(n: u32) -> Result<u32, std::convert::Infallible> {
    Ok(n)
}

/// A store that replays without pause holds a read transaction open on its keeper connection
/// nearly all the time; another process writing to the same file must still be able to restart
/// its WAL. The keeper stands aside when it sees another connection's commit, so the writer's
/// WAL stays near SQLite's own bound (1,000 pages before a checkpoint, about 4 MiB) instead of
/// growing with every commit (36 MiB here with the standing aside turned off, 4.4 MiB with it). Real
/// `fcntl` locks between two processes, where the store's own tests use a second connection.
#[test]
fn a_busy_store_holds_back_no_writer_in_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // No replay cache: every replay reads the file.
    let url = format!("sqlite://{}?replay_cache=0", path.display());
    let idem = rt.block_on(Idem::open(&url)).expect("open");
    let scope = idem.scope("t");
    let first = rt.block_on(scope.run(lookup(1))).expect("call");
    assert!(first.is_fresh());

    let (stop, replays) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let replaying = rt.spawn({
        let (stop, replays) = (stop.clone(), replays.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                match scope.run(lookup(1)).await.expect("replay") {
                    Outcome::Replayed(1) => replays.fetch_add(1, Ordering::Relaxed),
                    other => panic!("a replay answered {other:?}"),
                };
            }
        }
    });
    while replays.load(Ordering::Relaxed) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let writer = Command::new(std::env::current_exe().unwrap())
        .args(["wal_writer", "--exact", "--ignored", "--nocapture"])
        .env("IDEM_WAL_WRITER_DB", &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run the writer");
    let during = replays.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    rt.block_on(replaying).expect("the replays");
    let stdout = String::from_utf8_lossy(&writer.stdout);
    assert!(
        writer.status.success(),
        "the writer failed: {stdout}{}",
        String::from_utf8_lossy(&writer.stderr)
    );
    let largest: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("largest_wal_bytes="))
        .expect("the writer reports its WAL")
        .parse()
        .unwrap();
    assert!(during > 1_000, "only {during} replays beside the writer");
    assert!(
        largest < 8 << 20,
        "{WRITER_COMMITS} commits beside a busy store grew the WAL to {largest} bytes"
    );
}
