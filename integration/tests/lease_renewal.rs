//! Lease renewal, counted: a body that runs ten times its lease while eight retries of the same
//! call arrive throughout runs once, on memory, SQLite, Postgres and Redis (and more than once
//! with renewal turned off: the test can fail); a runtime without tokio's time driver renews
//! too; a body learns that its lease was lost and its completion is refused; and a renewing
//! owner killed with SIGKILL lets a retry take over one lease later, on SQLite, Postgres and
//! Redis (the owner is a copy of this test binary running the ignored `renewing_owner`).

mod common;

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{CountingStore, effect, effects, unique};
use futures_timer::Delay;
use idem::clock::{Clock, ManualClock, SystemClock};
use idem::store::conformance::test_server_url;
use idem::{Error, Idem, Outcome, idempotent};

/// The lease of the tools below: long enough that a loaded CI machine never misses two renewals
/// in a row (they come every third of it), short enough to run ten of them in a test.
const LEASE: Duration = Duration::from_secs(1);

const RETRIES: u32 = 8;

/// Runs for `hold_ms` (left out of the fingerprint, so a retry may say 0), waiting on a timer
/// that needs no tokio time driver.
#[idempotent(
    key = "run_id",
    mutating,
    lease = "1s",
    skip = "hold_ms",
    name = "lease.deploy"
)]
async fn deploy(run_id: String, hold_ms: u64) -> Result<u64, Infallible> {
    effect(&run_id);
    if std::env::var_os("IDEM_LEASE_OWNER").is_some() {
        let mut out = std::io::stdout();
        writeln!(out, "IDEM-BODY-STARTED").unwrap();
        out.flush().unwrap();
    }
    Delay::new(Duration::from_millis(hold_ms)).await;
    Ok(hold_ms)
}

/// Runs for `hold_ms` unless its lease is lost first; answers whether it was.
#[idempotent(
    key = "run_id",
    mutating,
    lease = "1s",
    skip = "hold_ms",
    name = "lease.watch"
)]
async fn watch(run_id: String, hold_ms: u64) -> Result<bool, Infallible> {
    effect(&run_id);
    let call = idem::current().expect("a keyed call");
    let lost = tokio::select! {
        () = Delay::new(Duration::from_millis(hold_ms)) => false,
        () = call.lease_lost() => true,
    };
    assert_eq!(lost, call.is_lease_lost());
    Ok(lost)
}

/// What one run of [`ten_leases_under_retries`] saw.
#[derive(Debug)]
struct Run {
    body_runs: usize,
    owner: Result<Outcome<u64>, Error<Infallible>>,
    retries_that_ran: usize,
    replayed_retries: usize,
    in_flight_answers: usize,
}

/// The owner's call runs ten leases; [`RETRIES`] retries of the same call start spread over
/// that time, each calling again every quarter lease while it is told `InFlight`.
async fn ten_leases_under_retries(idem: Idem) -> Run {
    let scope = idem.scope(unique("tenant-lease"));
    let run_id = unique("deploy");
    let hold = (LEASE * 10).as_millis() as u64;
    let owner = tokio::spawn(scope.run(deploy(run_id.clone(), hold)));
    let mut retries = Vec::new();
    for i in 0..RETRIES {
        let (scope, run_id) = (scope.clone(), run_id.clone());
        retries.push(tokio::spawn(async move {
            Delay::new(LEASE / 2 + LEASE * 10 * i / RETRIES).await;
            let mut in_flight = 0;
            loop {
                match scope.run(deploy(run_id.clone(), hold)).await {
                    Ok(Outcome::InFlight(_)) => {
                        in_flight += 1;
                        Delay::new(LEASE / 4).await;
                    }
                    Ok(Outcome::Replayed(_)) => return (in_flight, false),
                    // The body ran here (without renewal, its completion may be fenced out by
                    // a later takeover).
                    Ok(Outcome::Fresh(_)) | Err(Error::LeaseLost { .. }) => {
                        return (in_flight, true);
                    }
                    other => panic!("a retry got {other:?}"),
                }
            }
        }));
    }
    let owner = owner.await.unwrap();
    let (mut retries_that_ran, mut replayed_retries, mut in_flight_answers) = (0, 0, 0);
    for retry in retries {
        let (in_flight, fresh) = retry.await.unwrap();
        in_flight_answers += in_flight;
        if fresh {
            retries_that_ran += 1;
        } else {
            replayed_retries += 1;
        }
    }
    Run {
        body_runs: effects(&run_id),
        owner,
        retries_that_ran,
        replayed_retries,
        in_flight_answers,
    }
}

fn assert_ran_once(run: Run) {
    assert_eq!(run.body_runs, 1, "the body ran once: {run:?}");
    assert!(matches!(run.owner, Ok(Outcome::Fresh(_))), "{run:?}");
    assert_eq!(run.retries_that_ran, 0, "{run:?}");
    assert_eq!(run.replayed_retries, RETRIES as usize, "{run:?}");
    // Retries start half a lease in and poll every quarter lease for ten leases: most answers
    // are `InFlight`, long after the first lease would have lapsed without renewal.
    assert!(run.in_flight_answers >= 20, "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_ten_times_its_lease_runs_once_under_retries_on_memory() {
    assert_ran_once(ten_leases_under_retries(Idem::open("memory://").await.unwrap()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_ten_times_its_lease_runs_once_under_retries_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    assert_ran_once(ten_leases_under_retries(Idem::open(&url).await.unwrap()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_ten_times_its_lease_runs_once_under_retries_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    assert_ran_once(ten_leases_under_retries(Idem::open(&url).await.unwrap()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_ten_times_its_lease_runs_once_under_retries_on_redis() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    assert_ran_once(ten_leases_under_retries(Idem::open(&url).await.unwrap()).await);
}

/// The control: the same calls without renewal are taken over once the first lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_renewal_the_same_retries_run_the_body_again() {
    let idem = Idem::builder()
        .renew_leases(false)
        .open("memory://")
        .await
        .unwrap();
    let run = ten_leases_under_retries(idem).await;
    assert!(run.body_runs >= 2, "{run:?}");
    assert!(run.retries_that_ran >= 1, "{run:?}");
    assert!(
        matches!(run.owner, Err(Error::LeaseLost { .. })),
        "the owner's completion is fenced out: {run:?}"
    );
}

/// A runtime built without tokio's time driver (and without its I/O driver): renewals wait on
/// their own timer, so the body still runs once, on the default SQLite store.
#[test]
fn a_runtime_without_the_time_driver_renews_too() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    runtime.block_on(async {
        let idem = Idem::open(&url).await.unwrap();
        assert_ran_once(ten_leases_under_retries(idem).await);
    });
}

/// Another worker whose clock runs an hour ahead takes the key over (it sees the lease
/// lapsed): the owner's next renewal is refused, its body learns it, and its completion is
/// refused. A store unreachable past the lease makes the body learn it too; with nobody else
/// claiming meanwhile, its completion still applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_learns_that_its_lease_was_lost_and_its_completion_is_refused() {
    let store = Arc::new(CountingStore::default());
    let idem = Idem::builder().build(store.clone());
    let tenant = unique("tenant-lost");
    let run_id = unique("watch");
    let owner = tokio::spawn(
        idem.scope(tenant.as_str())
            .run(watch(run_id.clone(), 60_000)),
    );
    Delay::new(LEASE * 2).await;
    assert!(
        !owner.is_finished(),
        "renewals hold the lease past the first one"
    );

    let ahead = ManualClock::new(SystemClock.now() + 3_600_000);
    let skewed = Idem::builder().clock(ahead).build(store.clone());
    let taken = skewed
        .scope(tenant.as_str())
        .run(watch(run_id.clone(), 0))
        .await;
    assert!(matches!(taken, Ok(Outcome::Fresh(false))), "{taken:?}");

    let owner = tokio::time::timeout(LEASE * 5, owner)
        .await
        .expect("the owner hears of the takeover at its next renewal")
        .unwrap();
    assert!(
        matches!(owner, Err(Error::LeaseLost { .. })),
        "the owner's body saw the loss and its completion is refused: {owner:?}"
    );
    assert_eq!(effects(&run_id), 2, "the owner and the skewed worker");

    let run_id = unique("watch");
    store.fail_renewals.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let unreachable = idem.scope(tenant.as_str()).run(watch(run_id, 60_000)).await;
    assert!(
        matches!(unreachable, Ok(Outcome::Fresh(true))),
        "lost once the lease lapsed unconfirmed; nobody took over, so it completes: {unreachable:?}"
    );
    assert!(started.elapsed() >= LEASE, "not before the lease lapsed");
}

/// The owner of [`kill_9_of_a_renewing_owner`]: claims, starts its body, and runs until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by kill_9_of_a_renewing_owner as a child process"]
async fn renewing_owner() {
    let url = std::env::var("IDEM_LEASE_URL").expect("set by the parent");
    let tenant = std::env::var("IDEM_LEASE_TENANT").expect("set by the parent");
    let run_id = std::env::var("IDEM_LEASE_RUN").expect("set by the parent");
    let idem = Idem::open(&url).await.unwrap();
    let answer = idem.scope(tenant).run(deploy(run_id, 3_600_000)).await;
    panic!("the owner was to be killed, and answered {answer:?}");
}

/// Starts an owner process, sees its renewals hold the key for three leases, kills it with
/// SIGKILL, and retries until it takes over: one lease later, give or take a renewal period.
fn kill_9_of_a_renewing_owner(url: &str) {
    let tenant = unique("tenant-kill");
    let run_id = unique("deploy");
    let mut owner = Command::new(std::env::current_exe().unwrap())
        .args(["renewing_owner", "--exact", "--ignored", "--nocapture"])
        .env("IDEM_LEASE_OWNER", "1")
        .env("IDEM_LEASE_URL", url)
        .env("IDEM_LEASE_TENANT", &tenant)
        .env("IDEM_LEASE_RUN", &run_id)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let started = BufReader::new(owner.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|line| line == "IDEM-BODY-STARTED");
    assert!(started, "the owner process started its body");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let scope = Idem::open(url).await.unwrap().scope(tenant);
        let held = Instant::now();
        while held.elapsed() < LEASE * 3 {
            let answer = scope.run(deploy(run_id.clone(), 0)).await;
            assert!(
                matches!(answer, Ok(Outcome::InFlight(_))),
                "the owner's renewals hold the key across processes: {answer:?}"
            );
            Delay::new(LEASE / 4).await;
        }
        owner.kill().unwrap();
        owner.wait().unwrap();
        let killed = Instant::now();
        let took = loop {
            match scope.run(deploy(run_id.clone(), 0)).await {
                Ok(Outcome::InFlight(_)) => Delay::new(Duration::from_millis(20)).await,
                Ok(Outcome::Fresh(_)) => break killed.elapsed(),
                other => panic!("a retry after the kill got {other:?}"),
            }
            assert!(
                killed.elapsed() < LEASE * 3,
                "the dead owner's lease lapses within one lease"
            );
        };
        // The last renewal came at most a third of a lease before the kill.
        assert!(
            took >= LEASE / 2,
            "taken over after {took:?}, before the lease lapsed"
        );
        eprintln!("taken over {took:?} after the kill (lease {LEASE:?})");
        assert_eq!(effects(&run_id), 1, "the retry ran the body here, once");
    });
}

#[test]
fn kill_9_of_a_renewing_owner_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    kill_9_of_a_renewing_owner(&format!(
        "sqlite://{}",
        dir.path().join("idem.db").display()
    ));
}

#[test]
fn kill_9_of_a_renewing_owner_on_postgres() {
    if let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") {
        kill_9_of_a_renewing_owner(&url);
    }
}

#[test]
fn kill_9_of_a_renewing_owner_on_redis() {
    if let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") {
        kill_9_of_a_renewing_owner(&url);
    }
}
