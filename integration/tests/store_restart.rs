//! The shared store goes down in the middle of a multi-process race, and comes back.
//!
//! Each test starts a private server on a free loopback port (a Postgres cluster made with
//! `initdb` in a temporary directory; a `redis-server` with `appendonly yes` and
//! `appendfsync always`), runs 4 worker processes × 16 tasks calling 200 intents over and over
//! for a few seconds, and in the middle kills the server without warning (`pg_ctl -m immediate`,
//! `SIGKILL`) and starts it again. Then it checks from the effect ledger:
//!
//! - no intent's effect happened twice, and every intent ran;
//! - calls during the outage failed closed: every effect in the ledger is accounted for by a
//!   `Fresh` answer or by an error that says the body ran (`CompletionFailed`), so no call that
//!   answered a plain store error ran the body;
//! - the outage was seen (some calls did fail), and the workers recovered: calls after the restart
//!   were answered again;
//! - no call escalated (answered that its body ran and its result was not recorded): the outage
//!   is shorter than the lease, and a completion that met it was tried again until it landed.
//!
//! These tests need the server binaries (`pg_ctl`, `initdb`, `redis-server`); they run when
//! `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_REDIS_URL` say the backend is installed here.

#[path = "common/race.rs"]
mod race;
#[path = "common/servers.rs"]
mod servers;

use std::time::Duration;

use idem::store::conformance::test_server_url;
use servers::{PrivatePostgres, PrivateRedis};

#[test]
#[ignore = "run by the tests below as a child process"]
fn worker() {
    race::worker_main();
}

/// One restart test at a time: two at once would share two cores among 8 workers and 2 servers.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Races the workers for 10 seconds over a timeline of 200 intents that wraps every 3 s (so each
/// intent is visited twice after the restart); kills the server at 1.5 s and restarts it 1 s
/// later. The replay cache is off, so that every call meets the store.
fn race_through_a_restart(url: String, kill: &mut dyn FnMut(), start: &mut dyn FnMut()) {
    let dir = tempfile::tempdir().unwrap();
    let mut run = race::Race::new(format!("{url}?replay_cache=0"), dir.path());
    run.seconds = Some(10);
    run.pace_ms = 5;
    run.step_ms = Some(15);
    let children = run.start();
    std::thread::sleep(Duration::from_millis(1500));
    kill();
    std::thread::sleep(Duration::from_secs(1));
    start();
    let totals = run.finish(children);

    let effects = run.effects();
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "effects that happened twice: {twice:?}");
    let unran = never_ran_and_held(&run, &effects);
    let ran: usize = effects.values().sum();
    assert_eq!(
        ran,
        totals.fresh + totals.unrecorded,
        "every effect is a Fresh answer or an error saying the body ran; no call that failed \
         closed ran the body: {totals:?}"
    );
    assert!(
        totals.store_errors > 0,
        "the outage was seen by the callers: {totals:?}"
    );
    // The outage (about a second) is shorter than the lease (30 s): a completion that met it
    // was tried again until the server was back, so no call escalated.
    assert_eq!(
        totals.unrecorded, 0,
        "no call answered that its body ran unrecorded: {totals:?}"
    );
    assert!(
        totals.replayed > 0,
        "the callers recovered after the restart: {totals:?}"
    );
    println!(
        "{} calls through a restart: {} fresh, {} replayed, {} in flight, {} failed closed, \
         {} ran but could not record; every one of {} effects happened once",
        totals.calls(),
        totals.fresh,
        totals.replayed,
        totals.in_flight,
        totals.store_errors,
        totals.unrecorded,
        effects.len()
    );
    if unran > 0 {
        println!(
            "{unran} intents never ran: their claims are held in flight until the lease lapses"
        );
    }
}

/// Intents that never ran are allowed only when their key is held in flight: a claim committed
/// just as the server died, whose answer never reached its caller, keeps the key until its
/// lease lapses. Anything else means a caller gave up on an intent it could have run.
fn never_ran_and_held(run: &race::Race, effects: &std::collections::HashMap<u32, usize>) -> usize {
    let missing: Vec<u32> = (0..race::INTENTS)
        .filter(|i| !effects.contains_key(i))
        .collect();
    if missing.is_empty() {
        return 0;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let idem = idem::Idem::open(&run.url).await.expect("open");
        for intent in &missing {
            let key = idem::derive_key(
                &run.tenant,
                "race.charge",
                &[idem::key::KeyPart::new(intent).unwrap()],
            );
            let record = idem.store().lookup(&run.tenant, key).await.expect("lookup");
            assert!(
                record
                    .as_ref()
                    .is_some_and(|r| r.status == idem::store::RecordStatus::InFlight),
                "intent {intent} never ran and its key is not held in flight: {record:?}"
            );
        }
    });
    missing.len()
}

#[test]
fn a_postgres_restart_mid_race_runs_nothing_twice() {
    if test_server_url("IDEM_TEST_POSTGRES_URL").is_none() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pg = PrivatePostgres::create();
    race_through_a_restart(pg.url(), &mut || pg.kill(), &mut || pg.start());
}

#[test]
fn a_redis_restart_mid_race_runs_nothing_twice() {
    if test_server_url("IDEM_TEST_REDIS_URL").is_none() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let redis = std::cell::RefCell::new(PrivateRedis::create());
    let url = redis.borrow().url();
    race_through_a_restart(url, &mut || redis.borrow_mut().kill(), &mut || {
        redis.borrow_mut().start()
    });
}
