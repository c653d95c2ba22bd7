//! Duplicates that wait for the result, across processes, on SQLite, Postgres and Redis.
//!
//! Each test starts copies of this test binary as workers (the ignored `waiter` test), each with
//! 16 tasks calling one key of a tool that declares `wait`; the body writes `start` and `done`
//! lines to a ledger, so the parent counts how many bodies began and how many finished.
//!
//! - 64 callers in 4 processes: one body, 64 answers with its value (1 `Fresh`, 63 `Replayed`),
//!   none `InFlight`.
//! - The holder killed (SIGKILL) mid-body while 48 callers in 3 processes wait: one of them takes
//!   the key over once its lease lapses, the 47 others replay that body's value; two bodies began
//!   in all (the dead one and the takeover), one finished.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem::store::conformance::test_server_url;
use idem::{Error, Idem, Outcome, idempotent};

const TASKS: usize = 16;

fn ledger() -> PathBuf {
    std::env::var("IDEM_WAIT_LEDGER")
        .expect("set by the parent")
        .into()
}

fn note(line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger())
        .unwrap();
    writeln!(file, "{line}").unwrap();
}

/// The tool the callers share: its body notes its start, takes `IDEM_WAIT_BODY_MS` (or hangs,
/// with `IDEM_WAIT_HANG`), notes its end and answers a value of its own.
#[idempotent(key = "job", mutating, name = "wait.send", lease = "1s", wait = "30s")]
async fn send(job: String) -> Result<u64, std::convert::Infallible> {
    let value = std::process::id() as u64 * 1_000_000 + u64::from(rand_u16());
    note(&format!("start {value}"));
    if std::env::var_os("IDEM_WAIT_HANG").is_some() {
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    let ms: u64 = std::env::var("IDEM_WAIT_BODY_MS").map_or(1_000, |v| v.parse().unwrap());
    tokio::time::sleep(Duration::from_millis(ms)).await;
    note(&format!("done {value}"));
    let _ = job;
    Ok(value)
}

fn rand_u16() -> u16 {
    uuid::Uuid::new_v4().as_u128() as u16
}

#[test]
#[ignore = "run by the tests below as a child process"]
fn waiter() {
    let url = std::env::var("IDEM_WAIT_URL").expect("set by the parent");
    let tenant = std::env::var("IDEM_WAIT_TENANT").expect("set by the parent");
    let tasks: usize = std::env::var("IDEM_WAIT_TASKS").map_or(TASKS, |v| v.parse().unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let lines = runtime.block_on(async {
        let idem = Idem::open(&url).await.expect("open");
        let scope = idem.scope(tenant);
        let calls: Vec<_> = (0..tasks)
            .map(|_| {
                let scope = scope.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let answer = scope.run(send("job-1".into())).await;
                    (answer, started.elapsed())
                })
            })
            .collect();
        let mut lines = Vec::new();
        for call in calls {
            let (answer, took) = call.await.unwrap();
            let took = took.as_millis();
            lines.push(match answer {
                Ok(Outcome::Fresh(v)) => format!("fresh {v} {took}"),
                Ok(Outcome::Replayed(v)) => format!("replayed {v} {took}"),
                Ok(Outcome::InFlight(_)) => format!("in_flight 0 {took}"),
                Ok(other) => format!("other {other:?} {took}"),
                Err(Error::Store(e)) => format!("store_error {e} {took}"),
                Err(e) => format!("error {e} {took}"),
            });
        }
        lines
    });
    for line in lines {
        println!("ANSWER {line}");
    }
}

/// The workers of one test: the store, a tenant of its own, the ledger.
struct Run {
    url: String,
    tenant: String,
    ledger: PathBuf,
    _dir: tempfile::TempDir,
}

impl Run {
    fn new(url: impl Into<String>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Run {
            url: url.into(),
            tenant: format!("wait-{}", uuid::Uuid::new_v4().simple()),
            ledger: dir.path().join("ledger.log"),
            _dir: dir,
        }
    }

    /// On Postgres, 4 connections a process: the tests of this file run at once, each with up
    /// to 5 processes, within the server's 100 connections.
    fn postgres(url: String) -> Self {
        let separator = if url.contains('?') { '&' } else { '?' };
        Run::new(format!("{url}{separator}pool_size=4"))
    }

    fn sqlite() -> Self {
        let run = Run::new("");
        let url = format!("sqlite://{}", run._dir.path().join("wait.db").display());
        Run { url, ..run }
    }

    fn start(&self, tasks: usize, hang: bool) -> Child {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["waiter", "--exact", "--ignored", "--nocapture"])
            .env("IDEM_WAIT_URL", &self.url)
            .env("IDEM_WAIT_TENANT", &self.tenant)
            .env("IDEM_WAIT_LEDGER", &self.ledger)
            .env("IDEM_WAIT_TASKS", tasks.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if hang {
            cmd.env("IDEM_WAIT_HANG", "1");
        }
        cmd.spawn().expect("spawn a worker")
    }

    /// The answers of the workers: (kind, value, milliseconds).
    fn answers(&self, children: Vec<Child>) -> Vec<(String, u64, u128)> {
        let mut answers = Vec::new();
        for child in children {
            let output = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "worker failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            for line in stdout.lines().filter_map(|l| l.strip_prefix("ANSWER ")) {
                let fields: Vec<&str> = line.split(' ').collect();
                let (kind, took) = (fields[0], fields[fields.len() - 1]);
                assert!(
                    kind == "fresh" || kind == "replayed",
                    "every caller gets the result: {line}"
                );
                answers.push((
                    kind.to_owned(),
                    fields[1].parse().unwrap(),
                    took.parse().unwrap(),
                ));
            }
        }
        answers
    }

    /// The bodies that began and those that finished, by value.
    fn ledger(&self) -> (Vec<u64>, Vec<u64>) {
        let text = std::fs::read_to_string(&self.ledger).unwrap_or_default();
        let values = |prefix: &str| -> Vec<u64> {
            text.lines()
                .filter_map(|l| l.strip_prefix(prefix))
                .map(|v| v.parse().unwrap())
                .collect()
        };
        (values("start "), values("done "))
    }
}

/// 64 callers in 4 processes, one body: all get its value.
fn sixty_four_callers_get_one_result(run: Run) {
    let children: Vec<Child> = (0..4).map(|_| run.start(TASKS, false)).collect();
    let answers = run.answers(children);
    let (started, done) = run.ledger();
    assert_eq!(started.len(), 1, "one body ran: {started:?}");
    assert_eq!(done, started);
    assert_eq!(answers.len(), 64);
    let fresh = answers.iter().filter(|a| a.0 == "fresh").count();
    assert_eq!(fresh, 1, "one caller ran it, the others replayed it");
    assert!(
        answers.iter().all(|a| a.1 == done[0]),
        "every caller got the body's value"
    );
    let slowest = answers.iter().map(|a| a.2).max().unwrap();
    println!("64 callers, 1 body; the slowest answered after {slowest} ms");
}

/// The holder dies mid-body while 48 callers in 3 processes wait: one takes over, once.
fn a_killed_holder_is_taken_over_once(run: Run) {
    let mut holder = run.start(1, true);
    let deadline = Instant::now() + Duration::from_secs(30);
    while run.ledger().0.is_empty() {
        assert!(Instant::now() < deadline, "the holder's body began");
        std::thread::sleep(Duration::from_millis(10));
    }
    let waiters: Vec<Child> = (0..3).map(|_| run.start(TASKS, false)).collect();
    // The waiters are waiting (the holder renews its 1 s lease) when it dies.
    std::thread::sleep(Duration::from_millis(1_500));
    holder.kill().unwrap();
    holder.wait().unwrap();
    let answers = run.answers(waiters);
    let (started, done) = run.ledger();
    assert_eq!(
        started.len(),
        2,
        "the dead body and one takeover: {started:?}"
    );
    assert_eq!(done.len(), 1, "one body finished: {done:?}");
    assert_eq!(answers.len(), 48);
    assert_eq!(answers.iter().filter(|a| a.0 == "fresh").count(), 1);
    assert!(
        answers.iter().all(|a| a.1 == done[0]),
        "every waiter got the takeover's value"
    );
}

#[test]
fn on_sqlite_sixty_four_callers_in_four_processes_get_one_result() {
    sixty_four_callers_get_one_result(Run::sqlite());
}

#[test]
fn on_postgres_sixty_four_callers_in_four_processes_get_one_result() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    sixty_four_callers_get_one_result(Run::postgres(url));
}

#[test]
fn on_redis_sixty_four_callers_in_four_processes_get_one_result() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    sixty_four_callers_get_one_result(Run::new(url));
}

#[test]
fn on_sqlite_a_killed_holder_is_taken_over_once_by_its_waiters() {
    a_killed_holder_is_taken_over_once(Run::sqlite());
}

#[test]
fn on_postgres_a_killed_holder_is_taken_over_once_by_its_waiters() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    a_killed_holder_is_taken_over_once(Run::postgres(url));
}

#[test]
fn on_redis_a_killed_holder_is_taken_over_once_by_its_waiters() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    a_killed_holder_is_taken_over_once(Run::new(url));
}
