//! Several OS processes racing on the same intents, with an effect ledger to count what ran.
//!
//! A test binary that includes this module (`#[path = "common/race.rs"] mod race;`) declares the
//! ignored `worker` test calling [`worker_main`], and calls [`race`] from its real tests: `race`
//! starts copies of the test binary running only `worker`, each with 16 tasks calling the same
//! 200 intents, and reads every worker's counts and the ledger afterwards. Each tool body appends
//! one line (`O_APPEND`) to the ledger, so the ledger holds exactly the effects that happened.

#![allow(dead_code)] // each test binary uses a part of it

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem::{Error, Idem, Outcome, idempotent};

pub const PROCESSES: usize = 4;
pub const TASKS: usize = 16;
pub const INTENTS: u32 = 200;

fn ledger_path() -> PathBuf {
    PathBuf::from(std::env::var("IDEM_RACE_LEDGER").expect("set by the parent"))
}

/// Appends one effect to the ledger shared by all processes.
fn record_effect(ledger: &Path, intent: u32) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger)
        .expect("ledger");
    file.write_all(format!("{intent}\n").as_bytes())
        .expect("append");
}

#[idempotent(key = "intent", mutating, name = "race.charge")]
pub async fn charge(intent: u32, amount_cents: u64) -> Result<u64, std::convert::Infallible> {
    record_effect(&ledger_path(), intent);
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(amount_cents)
}

/// What the calls of one run returned.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub fresh: usize,
    pub replayed: usize,
    pub in_flight: usize,
    /// Calls that failed closed: a store error, the body did not run.
    pub store_errors: usize,
    /// Calls whose body ran but whose result could not be recorded (the store went down).
    pub unrecorded: usize,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.fresh += other.fresh;
        self.replayed += other.replayed;
        self.in_flight += other.in_flight;
        self.store_errors += other.store_errors;
        self.unrecorded += other.unrecorded;
    }

    pub fn calls(&self) -> usize {
        self.fresh + self.replayed + self.in_flight + self.store_errors + self.unrecorded
    }

    /// Counts one call's answer; anything but the documented outcomes fails the test.
    pub fn count(&mut self, answer: Result<Outcome<u64>, Error<std::convert::Infallible>>) {
        match answer {
            Ok(Outcome::Fresh(_)) => self.fresh += 1,
            Ok(Outcome::Replayed(_)) => self.replayed += 1,
            Ok(Outcome::InFlight(_)) => self.in_flight += 1,
            Err(e) if e.is_store() => self.store_errors += 1,
            Err(e @ (Error::CompletionFailed { .. } | Error::LeaseLost { .. })) => {
                assert!(e.body_ran());
                self.unrecorded += 1
            }
            other => panic!("unexpected answer: {other:?}"),
        }
    }

    fn line(&self) -> String {
        format!(
            "COUNTS {} {} {} {} {}",
            self.fresh, self.replayed, self.in_flight, self.store_errors, self.unrecorded
        )
    }

    fn parse(stdout: &str) -> Counts {
        let at = stdout.find("COUNTS ").expect("a COUNTS line");
        let n: Vec<usize> = stdout[at..]
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .map(|n| n.parse().expect("a number"))
            .collect();
        Counts {
            fresh: n[0],
            replayed: n[1],
            in_flight: n[2],
            store_errors: n[3],
            unrecorded: n[4],
        }
    }
}

/// The body of the `worker` test: 16 tasks calling every intent, each in its own order, once.
///
/// With `IDEM_RACE_SECONDS` the tasks go on until that many seconds have passed, pausing
/// `IDEM_RACE_PACE_MS` between calls, and follow a timeline: every `IDEM_RACE_STEP_MS` the tasks
/// move on to the next intent (wrapping around), so that new intents are claimed all along the
/// run and each is visited again later. Store errors are counted, not fatal: the parent decides.
pub fn worker_main() {
    let url = std::env::var("IDEM_RACE_URL").expect("set by the parent");
    let tenant = std::env::var("IDEM_RACE_TENANT").expect("set by the parent");
    let seconds: Option<u64> = std::env::var("IDEM_RACE_SECONDS")
        .ok()
        .map(|s| s.parse().unwrap());
    let step: Option<u128> = std::env::var("IDEM_RACE_STEP_MS")
        .ok()
        .map(|s| s.parse().unwrap());
    let intents: u32 = std::env::var("IDEM_RACE_INTENTS")
        .ok()
        .map_or(INTENTS, |s| s.parse().unwrap());
    // Odd tasks walk the timeline this many steps behind the even ones: they come back to
    // intents the others claimed a while ago.
    let revisit: u32 = std::env::var("IDEM_RACE_REVISIT_STEPS")
        .ok()
        .map_or(0, |s| s.parse().unwrap());
    let pace = Duration::from_millis(
        std::env::var("IDEM_RACE_PACE_MS")
            .ok()
            .map_or(0, |s| s.parse().unwrap()),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let counts = runtime.block_on(async {
        let idem = Idem::open(&url).await.expect("open");
        let tenant = idem.scope(tenant);
        let start = Instant::now();
        let deadline = seconds.map(|s| start + Duration::from_secs(s));
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..TASKS {
            let tenant = tenant.clone();
            tasks.spawn(async move {
                let mut counts = Counts::default();
                let mut i = 0u32;
                loop {
                    let done = match deadline {
                        Some(deadline) => Instant::now() >= deadline,
                        None => i == intents,
                    };
                    if done {
                        break;
                    }
                    let intent = match step {
                        Some(step) => {
                            let mut now = (start.elapsed().as_millis() / step) as u32;
                            if task % 2 == 1 {
                                now = now.saturating_sub(revisit);
                            }
                            (now + task as u32 % 3) % intents
                        }
                        None => (i + task as u32 * 37) % intents,
                    };
                    counts.count(tenant.run(charge(intent, 100)).await);
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                    i += 1;
                }
                counts
            });
        }
        let mut total = Counts::default();
        while let Some(done) = tasks.join_next().await {
            total.add(done.unwrap());
        }
        total
    });
    println!("{}", counts.line());
}

/// A run: the store URL, the tenant (unique per run, so runs sharing a server do not meet) and
/// the directory for the ledger.
pub struct Race {
    pub url: String,
    pub tenant: String,
    pub ledger: PathBuf,
    /// `Some(seconds)`: the workers call over and over until then.
    pub seconds: Option<u64>,
    pub pace_ms: u64,
    /// `Some(ms)`: the timeline of intents (see [`worker_main`]).
    pub step_ms: Option<u64>,
    /// How many intents the timeline walks ([`INTENTS`] unless set).
    pub intents: Option<u32>,
    /// How far behind (in steps) the odd tasks walk the timeline.
    pub revisit_steps: Option<u32>,
}

impl Race {
    pub fn new(url: String, dir: &Path) -> Self {
        Race {
            url,
            tenant: format!("race-{}", uuid::Uuid::new_v4().simple()),
            ledger: dir.join("effects.log"),
            seconds: None,
            pace_ms: 0,
            step_ms: None,
            intents: None,
            revisit_steps: None,
        }
    }

    /// Starts the worker processes.
    pub fn start(&self) -> Vec<Child> {
        (0..PROCESSES)
            .map(|_| {
                let mut cmd = Command::new(std::env::current_exe().unwrap());
                cmd.args([
                    "worker",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("IDEM_RACE_URL", &self.url)
                .env("IDEM_RACE_TENANT", &self.tenant)
                .env("IDEM_RACE_LEDGER", &self.ledger)
                .env("IDEM_RACE_PACE_MS", self.pace_ms.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
                if let Some(s) = self.seconds {
                    cmd.env("IDEM_RACE_SECONDS", s.to_string());
                }
                if let Some(ms) = self.step_ms {
                    cmd.env("IDEM_RACE_STEP_MS", ms.to_string());
                }
                if let Some(n) = self.intents {
                    cmd.env("IDEM_RACE_INTENTS", n.to_string());
                }
                if let Some(n) = self.revisit_steps {
                    cmd.env("IDEM_RACE_REVISIT_STEPS", n.to_string());
                }
                cmd.spawn().expect("spawn worker")
            })
            .collect()
    }

    /// Waits for the workers and adds up their counts.
    pub fn finish(&self, children: Vec<Child>) -> Counts {
        let mut total = Counts::default();
        for child in children {
            let output = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "worker failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            total.add(Counts::parse(&stdout));
        }
        total
    }

    /// How many times each intent's effect happened.
    pub fn effects(&self) -> HashMap<u32, usize> {
        let mut effects: HashMap<u32, usize> = HashMap::new();
        let text = std::fs::read_to_string(&self.ledger).unwrap_or_default();
        for line in text.lines() {
            *effects.entry(line.parse().unwrap()).or_default() += 1;
        }
        effects
    }

    /// Every intent's effect happened exactly once.
    pub fn assert_each_effect_once(&self) -> HashMap<u32, usize> {
        let effects = self.effects();
        let twice: Vec<_> = effects.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "intents whose effect happened more than once: {twice:?}"
        );
        assert_eq!(effects.len(), INTENTS as usize, "every intent ran");
        effects
    }
}

/// The plain race: every intent once, one `Fresh` per intent, every other call `Replayed` or
/// `InFlight`, no errors.
pub fn race_once(url: String) -> Counts {
    let dir = tempfile::tempdir().unwrap();
    let race = Race::new(url, dir.path());
    let totals = race.finish(race.start());
    race.assert_each_effect_once();
    assert_eq!(
        totals.fresh, INTENTS as usize,
        "one Fresh per intent: {totals:?}"
    );
    assert_eq!(
        totals.calls(),
        PROCESSES * TASKS * INTENTS as usize,
        "every call answered: {totals:?}"
    );
    assert_eq!(
        totals.fresh + totals.replayed + totals.in_flight,
        totals.calls(),
        "every other call was Replayed or InFlight: {totals:?}"
    );
    println!(
        "{} calls from {PROCESSES} processes: {} fresh, {} replayed, {} in flight; every one of \
         {INTENTS} effects happened once",
        totals.calls(),
        totals.fresh,
        totals.replayed,
        totals.in_flight
    );
    totals
}
