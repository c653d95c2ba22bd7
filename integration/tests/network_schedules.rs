//! The network-fault property: 16 callers run a keyed tool through a fault proxy
//! (`common/proxy.rs`) in front of the real Postgres and Redis while a seeded random schedule of
//! faults plays (resets, black holes, swallowed and cut replies, latency, refused connections).
//! After each schedule, with the network healed:
//!
//! - every effect happened at most once;
//! - every effect is accounted for by a `Fresh` answer or by an error that says the body ran;
//! - no body ran without a durable claim (the body reads the store directly, not through the
//!   proxy, and finds its key `in_flight`);
//! - every key ends replayable or free within one lease;
//! - no call took longer than the bound its store's settings give;
//! - no call escalated (answered that the body ran and its result was not recorded) in a
//!   schedule whose longest outage is shorter than the lease (2 s): the completion is tried
//!   again for one lease after its first failure. The escalations of each schedule are counted
//!   by its longest outage and printed.
//!
//! `IDEM_FAULT_COMPLETION_RETRY_MS=0` is the control: completions get one attempt, and the
//! escalations are counted rather than refused.
//!
//! `IDEM_FAULT_SCHEDULES` (default 150; the figures in the guide come from 1,000) sets how many schedules each store plays, from seed
//! `IDEM_FAULT_SEED` (default 1) on; a failure prints its seed, and `IDEM_FAULT_SCHEDULES=1
//! IDEM_FAULT_SEED=<seed>` plays it again.

mod common;
#[path = "common/proxy.rs"]
mod proxy;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{effect, effects};
use idem::key::{KeyPart, derive_key};
use idem::store::RecordStatus;
use idem::store::conformance::test_server_url;
use idem::{Error, Idem, Outcome, idempotent};
use proxy::{Fault, FaultProxy, Schedule, SplitMix64};

const CALLERS: u64 = 16;
const KEYS: u64 = 6;
const TOOL: &str = "faults.schedule_charge";
const TENANT: &str = "tenant-schedules";
const LEASE: Duration = Duration::from_millis(2000);

/// The runs whose body found no claim of theirs in the store.
static UNCLAIMED_RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The un-proxied runtime of each backend, for the body's look at the store.
static DIRECT: Mutex<Option<HashMap<String, Idem>>> = Mutex::new(None);

async fn already_charged(run_id: &str, _backend: &str) -> Result<Option<u32>, Infallible> {
    Ok((effects(run_id) > 0).then_some(7))
}

#[idempotent(key = "run_id", mutating, lease = "2s", check = already_charged, name = "faults.schedule_charge")]
async fn charge(run_id: String, backend: String) -> Result<u32, Infallible> {
    let direct = DIRECT
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(&backend).cloned())
        .expect("the direct runtime");
    let key = derive_key(TENANT, TOOL, &[KeyPart::new(&run_id).unwrap()]);
    let record = direct.store().lookup(TENANT, key).await;
    if !matches!(&record, Ok(Some(r)) if r.status == RecordStatus::InFlight) {
        UNCLAIMED_RUNS.lock().unwrap().push(run_id.clone());
    }
    effect(&run_id);
    Ok(7)
}

/// What a call answered, as the property counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Fresh,
    Replayed,
    InFlight,
    StoreError,
    BodyRanError,
}

fn answer(result: &Result<Outcome<u32>, Error<Infallible>>) -> Answer {
    match result {
        Ok(Outcome::Fresh(7)) => Answer::Fresh,
        Ok(Outcome::Replayed(7)) => Answer::Replayed,
        Ok(Outcome::InFlight(_)) => Answer::InFlight,
        Err(e) if e.body_ran() => Answer::BodyRanError,
        Err(Error::Store(_)) => Answer::StoreError,
        other => panic!("an answer the property does not allow: {other:?}"),
    }
}

/// A store behind a proxy, and the longest a call may take there.
struct Backend {
    name: &'static str,
    var: &'static str,
    options: &'static str,
    /// How long the store waits for a reply (a latency whose round trip may exceed it is an
    /// outage).
    response_timeout: Duration,
    call_bound: Duration,
}

/// Postgres: every store operation is at most two tries (one more on a broken connection),
/// each waiting at most the pool's wait, create and recycle timeouts (400 ms each) and one
/// response timeout (400 ms): 3.2 s; a call makes two (claim, completion) besides the body,
/// and tries the completion again for at most one lease after its first failure.
const POSTGRES: Backend = Backend {
    name: "postgres",
    var: "IDEM_TEST_POSTGRES_URL",
    options: "sslmode=disable&response_timeout_ms=400&pool_timeout_ms=400&connect_timeout=1",
    response_timeout: Duration::from_millis(400),
    // 500 ms more for the body (it reads the store) and the scheduler of a busy machine.
    call_bound: Duration::from_millis(2 * 2 * (3 * 400 + 400) + 2000 + 500),
};

/// Redis: every store operation is at most two sends (the second on a new connection when the
/// first broke or timed out), each waiting at most one connection timeout (`timeout_ms`, 250 ms)
/// and one response timeout: 1 s; a call makes two (claim, completion) besides the body, and
/// tries the completion again for at most one lease after its first failure.
const REDIS: Backend = Backend {
    name: "redis",
    var: "IDEM_TEST_REDIS_URL",
    options: "timeout_ms=250",
    response_timeout: Duration::from_millis(250),
    // 500 ms more for the body (it reads the store) and the scheduler of a busy machine.
    call_bound: Duration::from_millis(2 * 2 * (250 + 250) + 2000 + 500),
};

/// Valkey 9 (`IDEM_TEST_VALKEY_URL`): Redis's bounds; its completions, renewals and releases
/// are the server's own compare-and-set (`SET … IFEQ`, `DELIFEQ`), each a second delivery of
/// which the scripts must tell from a lost token.
const VALKEY: Backend = Backend {
    name: "valkey",
    var: "IDEM_TEST_VALKEY_URL",
    ..REDIS
};

/// Valkey with its scripts (`fencing=script`), as on Redis 7.
const VALKEY_SCRIPTS: Backend = Backend {
    name: "valkey-scripts",
    options: "timeout_ms=250&fencing=script",
    ..VALKEY
};

/// The longest stretch of `schedule` during which the store cannot be reached in time:
/// consecutive faults other than none and a latency whose round trip stays within the
/// store's response timeout.
fn longest_outage(schedule: &Schedule, backend: &Backend) -> Duration {
    let (mut longest, mut current) = (Duration::ZERO, Duration::ZERO);
    for (fault, length) in &schedule.steps {
        let out = match fault {
            Fault::None => false,
            // Each chunk is delayed by `ms` and up to half as much again, both ways.
            Fault::Latency { ms } => Duration::from_millis(3 * ms) >= backend.response_timeout,
            _ => true,
        };
        current = if out {
            current + *length
        } else {
            Duration::ZERO
        };
        longest = longest.max(current);
    }
    longest
}

/// The escalations (calls whose body ran and whose result was not recorded) of a run, by the
/// longest outage of their schedule: (schedules, escalations).
#[derive(Default, Debug)]
struct Escalations {
    /// Schedules whose longest outage was shorter than the lease: none may escalate.
    shorter_than_the_lease: (u64, usize),
    /// Schedules whose longest outage was one lease or longer.
    longer: (u64, usize),
}

impl Escalations {
    fn count(&mut self, outage: Duration, escalations: usize) {
        let bucket = if outage < LEASE {
            &mut self.shorter_than_the_lease
        } else {
            &mut self.longer
        };
        bucket.0 += 1;
        bucket.1 += escalations;
    }
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number")))
        .unwrap_or(default)
}

/// What one schedule's calls answered, by run id.
#[derive(Default)]
struct Tally {
    answers: HashMap<String, Vec<Answer>>,
    /// What the calls that escalated answered (the error and its source; never a raw key).
    escalations: Vec<String>,
    longest_call: Duration,
    longest_store_error: Duration,
    calls: usize,
}

impl Tally {
    fn count(&mut self, run_id: &str, answer: Answer, took: Duration) {
        self.answers
            .entry(run_id.to_owned())
            .or_default()
            .push(answer);
        self.longest_call = self.longest_call.max(took);
        if answer == Answer::StoreError {
            self.longest_store_error = self.longest_store_error.max(took);
        }
        self.calls += 1;
    }
}

/// The totals of a store's run, printed at the end.
#[derive(Default, Debug)]
struct Totals {
    schedules: u64,
    calls: usize,
    effects: usize,
    store_errors: usize,
    body_ran_errors: usize,
    longest_call: Duration,
    longest_store_error: Duration,
    longest_settle: Duration,
    escalations: Escalations,
}

async fn play_schedules(backend: Backend, seeds: impl IntoIterator<Item = u64>) {
    let Some(direct_url) = test_server_url(backend.var) else {
        return;
    };
    let (proxy, url) = FaultProxy::in_front_of(backend.var, backend.options)
        .await
        .unwrap();
    let direct = Idem::open(&direct_url).await.unwrap();
    DIRECT
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(backend.name.to_owned(), direct);
    // The control: `IDEM_FAULT_COMPLETION_RETRY_MS=0` gives every completion one attempt, as
    // before completions were tried again; the escalations are then counted, not refused.
    let control = std::env::var("IDEM_FAULT_COMPLETION_RETRY_MS")
        .ok()
        .map(|ms| Duration::from_millis(ms.parse().expect("IDEM_FAULT_COMPLETION_RETRY_MS: ms")));
    let mut builder = Idem::builder();
    if let Some(window) = control {
        builder = builder.completion_retry(window);
    }
    let scope = builder.open(&url).await.unwrap().scope(TENANT);
    let mut totals = Totals::default();
    for seed in seeds {
        let schedule = Schedule::from_seed(seed);
        let failed = |what: String| -> String {
            format!(
                "{}: seed {seed} failed ({:?}): {what}",
                backend.name, schedule.steps
            )
        };
        let run_ids: Arc<Vec<String>> = Arc::new(
            (0..KEYS)
                .map(|k| format!("s{seed}-k{k}-{}", uuid::Uuid::new_v4().simple()))
                .collect(),
        );
        let tally = Arc::new(Mutex::new(Tally::default()));
        let playing = Instant::now();
        let length = schedule.length();
        let callers: Vec<_> = (0..CALLERS)
            .map(|caller| {
                let (scope, run_ids, tally) = (scope.clone(), run_ids.clone(), tally.clone());
                let backend = backend.name.to_owned();
                let mut rng = SplitMix64(seed.wrapping_mul(1_000_003) ^ caller);
                tokio::spawn(async move {
                    while playing.elapsed() < length {
                        let run_id = &run_ids[rng.between(0, KEYS - 1) as usize];
                        let started = Instant::now();
                        let result = scope.run(charge(run_id.clone(), backend.clone())).await;
                        {
                            let mut tally = tally.lock().unwrap();
                            tally.count(run_id, answer(&result), started.elapsed());
                            if let Err(e) = &result
                                && e.body_ran()
                            {
                                let source = std::error::Error::source(e).map(ToString::to_string);
                                tally.escalations.push(format!("{e} ({source:?})"));
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(rng.between(0, 20))).await;
                    }
                })
            })
            .collect();
        proxy.play(&schedule).await;
        for caller in callers {
            caller
                .await
                .unwrap_or_else(|e| panic!("{}", failed(e.to_string())));
        }
        // Healed: every key settles, replayable or free, within one lease (and the bound of
        // the call that finds it so).
        let healed = Instant::now();
        for run_id in run_ids.iter() {
            loop {
                let started = Instant::now();
                let result = scope
                    .run(charge(run_id.clone(), backend.name.to_owned()))
                    .await;
                let settled = answer(&result);
                tally
                    .lock()
                    .unwrap()
                    .count(run_id, settled, started.elapsed());
                if matches!(settled, Answer::Fresh | Answer::Replayed) {
                    break;
                }
                assert!(
                    healed.elapsed() < LEASE + backend.call_bound,
                    "{}",
                    failed(format!(
                        "{run_id} still answers {settled:?} after one lease"
                    ))
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        totals.longest_settle = totals.longest_settle.max(healed.elapsed());
        let tally = std::mem::take(&mut *tally.lock().unwrap());
        assert!(
            tally.longest_call <= backend.call_bound,
            "{}",
            failed(format!(
                "a call took {:?}, beyond the bound {:?}",
                tally.longest_call, backend.call_bound
            ))
        );
        let unclaimed = std::mem::take(&mut *UNCLAIMED_RUNS.lock().unwrap());
        let unclaimed: Vec<_> = unclaimed
            .into_iter()
            .filter(|id| run_ids.contains(id))
            .collect();
        assert!(
            unclaimed.is_empty(),
            "{}",
            failed(format!(
                "bodies ran without a claim in the store: {unclaimed:?}"
            ))
        );
        for (run_id, answers) in &tally.answers {
            let ran = effects(run_id);
            let said = answers
                .iter()
                .filter(|a| matches!(a, Answer::Fresh | Answer::BodyRanError))
                .count();
            assert!(
                ran <= 1,
                "{}",
                failed(format!("{run_id}: {ran} effects; answers {answers:?}"))
            );
            assert_eq!(
                ran,
                said,
                "{}",
                failed(format!(
                    "{run_id}: {ran} effects, {said} answers that say the body ran: {answers:?}"
                ))
            );
            totals.effects += ran;
            totals.store_errors += answers.iter().filter(|a| **a == Answer::StoreError).count();
            totals.body_ran_errors += answers
                .iter()
                .filter(|a| **a == Answer::BodyRanError)
                .count();
        }
        let escalations: usize = tally
            .answers
            .values()
            .map(|answers| {
                answers
                    .iter()
                    .filter(|a| **a == Answer::BodyRanError)
                    .count()
            })
            .sum();
        let outage = longest_outage(&schedule, &backend);
        totals.escalations.count(outage, escalations);
        // A completion is tried again for one lease after its first failure: an outage
        // shorter than that is ridden out, and the call answers `Fresh`.
        assert!(
            control.is_some() || outage >= LEASE || escalations == 0,
            "{}",
            failed(format!(
                "{escalations} calls said the body ran and its result was not recorded, after \
                 an outage of {outage:?}, shorter than the lease: {:?}",
                tally.escalations
            ))
        );
        totals.schedules += 1;
        totals.calls += tally.calls;
        totals.longest_call = totals.longest_call.max(tally.longest_call);
        totals.longest_store_error = totals.longest_store_error.max(tally.longest_store_error);
    }
    println!(
        "{}: {totals:?} (duplicates 0, stuck keys 0, unclaimed runs 0; bound {:?})",
        backend.name, backend.call_bound
    );
}

/// The seeds of the run: `IDEM_FAULT_SCHEDULES` of them from `IDEM_FAULT_SEED`.
fn seeds() -> std::ops::Range<u64> {
    let first = setting("IDEM_FAULT_SEED", 1);
    first..first + setting("IDEM_FAULT_SCHEDULES", 150)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_effect_happens_at_most_once_and_is_accounted_for_on_postgres() {
    play_schedules(POSTGRES, seeds()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_effect_happens_at_most_once_and_is_accounted_for_on_redis() {
    play_schedules(REDIS, seeds()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_effect_happens_at_most_once_and_is_accounted_for_on_valkey() {
    play_schedules(VALKEY, seeds()).await;
}

/// One seed per fault kind whose whole schedule is that fault (found by searching the seeds;
/// checked below, so a change to the schedules cannot silently rename them).
const NAMED_SEEDS: [(&str, u64); 6] = [
    ("reset", 102),
    ("black hole", 271),
    ("swallowed replies", 712),
    ("cut replies", 845),
    ("latency", 54),
    ("refused connections", 207),
];

fn kind(fault: Fault) -> &'static str {
    match fault {
        Fault::None => "none",
        Fault::Reset => "reset",
        Fault::BlackHole => "black hole",
        Fault::SwallowReplies => "swallowed replies",
        Fault::CutReplies { .. } => "cut replies",
        Fault::Latency { .. } => "latency",
        Fault::Refuse => "refused connections",
        Fault::ResetOpen { .. } => "reset of the open connections",
    }
}

#[test]
fn each_named_seed_plays_its_fault_alone() {
    for (name, seed) in NAMED_SEEDS {
        let schedule = Schedule::from_seed(seed);
        assert!(
            schedule.steps.iter().all(|(f, _)| kind(*f) == name),
            "{name}: {schedule:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_fault_kind_alone_keeps_the_property_on_postgres() {
    play_schedules(POSTGRES, NAMED_SEEDS.map(|(_, seed)| seed)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_fault_kind_alone_keeps_the_property_on_redis() {
    play_schedules(REDIS, NAMED_SEEDS.map(|(_, seed)| seed)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_fault_kind_alone_keeps_the_property_on_valkey_by_native_and_script_fencing() {
    play_schedules(VALKEY, NAMED_SEEDS.map(|(_, seed)| seed)).await;
    play_schedules(VALKEY_SCRIPTS, NAMED_SEEDS.map(|(_, seed)| seed)).await;
}
