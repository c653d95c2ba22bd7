//! Several OS processes share one store: every intent's effect happens exactly once.
//!
//! Each test starts 4 copies of this test binary as workers (the ignored `worker` test), each with
//! 16 concurrent tasks racing over the same 200 intents, against one SQLite file, the Postgres
//! server of `IDEM_TEST_POSTGRES_URL` and the Redis server of `IDEM_TEST_REDIS_URL`. Each tool
//! body appends the intent to an effect ledger; the parent reads it afterwards.

#[path = "common/race.rs"]
mod race;

use idem::store::conformance::test_server_url;

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
