//! The soak: a long run of mixed calls against one store with short TTLs and a background purge,
//! to show that throughput holds and memory and disk stay flat once the TTL window is reached.
//!
//! ```text
//! cargo run --release -p idem-integration --example soak   # 1,000,000 calls on a SQLite file
//! cargo run --release -p idem-integration --example soak -- --calls 200000 --ttl-secs 2 --workers 64 --every-secs 1
//! cargo run --release -p idem-integration --example soak -- --store postgres://postgres@127.0.0.1/test
//! ```
//!
//! Workers call one keyed tool, `soak.charge`, in this mix: 45% new intents, 40% retries of a
//! recent intent (replays, or in flight), 8% a recent intent with another amount (mismatches),
//! 7% a new intent called by 4 tasks at once. Every `--every-secs` it prints calls/s over the
//! last interval, the process's resident memory and the store's size on disk (the SQLite file
//! with its WAL). At the end it checks what must hold whatever the timing: no intent's effect
//! ran twice, every effect is one `Fresh` answer, no call failed; and it compares memory and
//! disk after the warm-up (three TTLs) with their maximum afterwards. It exits non-zero when a
//! check fails. Not part of CI's default run (CI runs a short one for the checks only).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::{Idem, Outcome, idempotent};
use serde::{Deserialize, Serialize};

/// What the simulated provider answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    intent: u64,
    amount_cents: u64,
    note: String,
}

/// How many times each intent's effect ran, by intent number (bytes, so a million intents
/// take a megabyte allocated once: the soak's own memory stays flat too).
static EFFECTS: std::sync::OnceLock<Vec<AtomicU8>> = std::sync::OnceLock::new();

#[idempotent(key = "intent", mutating, name = "soak.charge")]
async fn charge(intent: u64, amount_cents: u64) -> Result<Receipt, std::convert::Infallible> {
    let effects = EFFECTS.get().expect("effects are allocated first");
    effects[intent as usize].fetch_add(1, Ordering::SeqCst);
    // Long enough for concurrent callers to meet the record in flight.
    tokio::task::yield_now().await;
    Ok(Receipt {
        intent,
        amount_cents,
        note: "charged by the soak".into(),
    })
}

struct Settings {
    calls: u64,
    ttl: Duration,
    workers: u64,
    every: Duration,
    store: Option<String>,
}

fn settings() -> Result<Settings, String> {
    let mut s = Settings {
        calls: 1_000_000,
        ttl: Duration::from_secs(5),
        workers: 32,
        every: Duration::from_secs(2),
        store: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("`{flag}` takes a value"));
        let number = |v: String| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(format!("`{flag}` takes a positive whole number, not `{v}`"))
        };
        match flag.as_str() {
            "--calls" => s.calls = number(value()?)?,
            "--ttl-secs" => s.ttl = Duration::from_secs(number(value()?)?),
            "--workers" => s.workers = number(value()?)?,
            "--every-secs" => s.every = Duration::from_secs(number(value()?)?),
            "--store" => s.store = Some(value()?),
            other => {
                return Err(format!(
                    "unknown flag `{other}`; flags: --calls N, --ttl-secs N, --workers N, \
                     --every-secs N, --store URL"
                ));
            }
        }
    }
    Ok(s)
}

/// What the calls answered, counted by kind.
#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    fresh: AtomicU64,
    replayed: AtomicU64,
    in_flight: AtomicU64,
    mismatch: AtomicU64,
    failed: AtomicU64,
}

impl Tally {
    fn count(&self, answer: &Result<Outcome<Receipt>, idem::Error<std::convert::Infallible>>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let slot = match answer {
            Ok(Outcome::Fresh(_)) => &self.fresh,
            Ok(Outcome::Replayed(_)) => &self.replayed,
            Ok(Outcome::InFlight(_)) => &self.in_flight,
            Ok(Outcome::Mismatch(_)) => &self.mismatch,
            Ok(_) | Err(_) => &self.failed,
        };
        slot.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = answer {
            // The first few failures are shown; the count is checked at the end.
            if self.failed.load(Ordering::Relaxed) <= 3 {
                eprintln!("soak: a call failed: {e}");
            }
        }
    }
}

/// A small deterministic generator per worker (splitmix64): the mix, not cryptography.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// One worker: calls until the run has made `calls` calls.
async fn worker(
    seed: u64,
    calls: u64,
    scope: idem::Scope,
    next_intent: Arc<AtomicU64>,
    tally: Arc<Tally>,
) {
    let mut mix = Mix(seed);
    let intents = EFFECTS.get().expect("effects").len() as u64;
    while tally.calls.load(Ordering::Relaxed) < calls {
        let roll = mix.next() % 100;
        let latest = next_intent.load(Ordering::Relaxed);
        // A recent intent: well inside the TTL, so a retry of it must never run the effect.
        let recent = (latest > 0).then(|| latest - 1 - mix.next() % latest.min(256));
        match (roll, recent) {
            (45..85, Some(intent)) => tally.count(&scope.run(charge(intent, 500)).await),
            (85..93, Some(intent)) => tally.count(&scope.run(charge(intent, 999)).await),
            (93.., _) => {
                let intent = next_intent.fetch_add(1, Ordering::Relaxed);
                if intent >= intents {
                    return;
                }
                let call = || scope.run(charge(intent, 500));
                let (a, b, c, d) = tokio::join!(call(), call(), call(), call());
                for answer in [a, b, c, d] {
                    tally.count(&answer);
                }
            }
            _ => {
                let intent = next_intent.fetch_add(1, Ordering::Relaxed);
                if intent >= intents {
                    return;
                }
                tally.count(&scope.run(charge(intent, 500)).await);
            }
        }
    }
}

/// The process's resident memory in bytes (Linux `/proc/self/statm`), if known.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The SQLite file and its WAL and shared-memory files, in bytes.
fn disk_bytes(db: &Option<PathBuf>) -> Option<u64> {
    let db = db.as_ref()?;
    let size = |suffix: &str| {
        let mut path = db.clone().into_os_string();
        path.push(suffix);
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    };
    Some(size("") + size("-wal") + size("-shm"))
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("n/a".into(), |b| {
        format!("{:.1} MiB", b as f64 / 1_048_576.0)
    })
}

struct Sample {
    at: Duration,
    calls: u64,
    rss: Option<u64>,
    disk: Option<u64>,
}

#[tokio::main]
async fn main() {
    if let Err(message) = run().await {
        eprintln!("soak: {message}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let s = settings()?;
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
    let (url, db) = match &s.store {
        Some(url) => (url.clone(), None),
        None => {
            let db = dir.path().join("soak.db");
            (format!("sqlite://{}", db.display()), Some(db))
        }
    };
    // At most one new intent per call: the effect counters cover every intent the run can make.
    EFFECTS
        .set((0..s.calls).map(|_| AtomicU8::new(0)).collect())
        .map_err(|_| "the soak runs once per process".to_owned())?;
    let idem = Idem::builder()
        .ttl(s.ttl)
        .open(&url)
        .await
        .map_err(|e| format!("opening {url}: {e}"))?;
    let purger = idem.spawn_purger(Duration::from_millis(500), 10_000);
    let scope = idem.scope(format!("soak-{}", uuid::Uuid::new_v4().simple()));
    println!(
        "soak: {} calls, {} workers, ttl {:?}, purge every 500 ms, store {}",
        s.calls,
        s.workers,
        s.ttl,
        if db.is_some() {
            "SQLite (temporary file)"
        } else {
            url.as_str()
        }
    );
    println!(
        "{:>8} {:>10} {:>9} {:>11} {:>11}",
        "time", "calls", "calls/s", "rss", "disk"
    );

    let tally = Arc::new(Tally::default());
    let next_intent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for seed in 0..s.workers {
        workers.spawn(worker(
            seed + 1,
            s.calls,
            scope.clone(),
            next_intent.clone(),
            tally.clone(),
        ));
    }
    let mut samples = vec![Sample {
        at: Duration::ZERO,
        calls: 0,
        rss: rss_bytes(),
        disk: disk_bytes(&db),
    }];
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + s.every, s.every);
    loop {
        tokio::select! {
            done = workers.join_next() => match done {
                Some(Ok(())) => continue,
                Some(Err(e)) => return Err(format!("a worker panicked: {e}")),
                None => break,
            },
            _ = tick.tick() => {}
        }
        let sample = Sample {
            at: started.elapsed(),
            calls: tally.calls.load(Ordering::Relaxed),
            rss: rss_bytes(),
            disk: disk_bytes(&db),
        };
        let last = samples.last().expect("a first sample");
        let rate = (sample.calls - last.calls) as f64 / (sample.at - last.at).as_secs_f64();
        println!(
            "{:>7.0}s {:>10} {:>9.0} {:>11} {:>11}",
            sample.at.as_secs_f64(),
            sample.calls,
            rate,
            mib(sample.rss),
            mib(sample.disk)
        );
        samples.push(sample);
    }
    let elapsed = started.elapsed();
    purger.abort();

    let effects = EFFECTS.get().expect("effects");
    let ran: u64 = effects
        .iter()
        .map(|e| u64::from(e.load(Ordering::SeqCst)))
        .sum();
    let twice = effects
        .iter()
        .filter(|e| e.load(Ordering::SeqCst) > 1)
        .count();
    let t = &*tally;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "\n{} calls in {:.1} s: {:.0} calls/s; fresh {}, replayed {}, in flight {}, mismatch {}, \
         failed {}",
        get(&t.calls),
        elapsed.as_secs_f64(),
        get(&t.calls) as f64 / elapsed.as_secs_f64(),
        get(&t.fresh),
        get(&t.replayed),
        get(&t.in_flight),
        get(&t.mismatch),
        get(&t.failed)
    );
    let mut failures = Vec::new();
    if twice > 0 {
        failures.push(format!("{twice} intents ran their effect more than once"));
    }
    if ran != get(&t.fresh) {
        failures.push(format!(
            "{ran} effects ran but {} calls answered Fresh",
            get(&t.fresh)
        ));
    }
    if get(&t.failed) > 0 {
        failures.push(format!("{} calls failed", get(&t.failed)));
    }
    println!("effects: {ran} ran, each once: {}", twice == 0);

    // Flat once the TTL window is reached: after three TTLs (records made in the first TTL are
    // gone and purged), nothing may keep growing.
    let warm = 3 * s.ttl;
    match samples.iter().position(|x| x.at >= warm) {
        Some(first) if first + 1 < samples.len() => {
            let after = &samples[first..];
            for (what, pick) in [
                ("rss", (|x: &Sample| x.rss) as fn(&Sample) -> Option<u64>),
                ("disk", |x: &Sample| x.disk),
            ] {
                let (Some(start), Some(max)) =
                    (pick(&after[0]), after.iter().filter_map(pick).max())
                else {
                    println!("{what}: not measured here");
                    continue;
                };
                let growth = max as f64 / start as f64 - 1.0;
                println!(
                    "{what}: {} at {:.0} s (after the warm-up), at most {} afterwards ({:+.1}%)",
                    mib(Some(start)),
                    after[0].at.as_secs_f64(),
                    mib(Some(max)),
                    growth * 100.0
                );
                // Allocators and SQLite's page reuse wobble; a leak grows with every window.
                if growth > 0.25 {
                    failures.push(format!(
                        "{what} grew {:.0}% after the warm-up",
                        growth * 100.0
                    ));
                }
            }
        }
        _ => println!(
            "memory and disk: the run was shorter than the warm-up ({:.0} s) plus one sample; \
             not judged",
            warm.as_secs_f64()
        ),
    }
    if failures.is_empty() {
        println!("soak: ok");
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}
