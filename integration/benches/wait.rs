//! Waiting for the holder, measured: how soon a waiter in another process learns that the key it
//! waits for settled, and how many claims waiting costs the server.
//!
//! For SQLite (a file), Postgres (`IDEM_TEST_POSTGRES_URL`) and Redis (`IDEM_TEST_REDIS_URL`):
//!
//! - `wake-up`: a holder process claims a key; a waiter (this process) calls `claim_waiting` on it
//!   and waits; the holder completes. The wake-up latency is from the moment the holder's
//!   completion returned (committed) to the moment the waiter's claim returned the result, on
//!   the machine's one clock; p50, p99 and the largest over `IDEM_BENCH_WAIT_ROUNDS` rounds
//!   (default 200), after 10 rounds of warm-up.
//! - `load`: 64 waiters (this process) on one key that the holder holds for 3 s: the claims they
//!   send in that time, against 64 callers retrying every 10 ms without `wait` (a retry loop
//!   an agent framework would run) over the same 3 s.
//!
//! Results go to `wait.json` beside criterion's (read by `bench-report`) and to stdout.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::Idem;
use idem::protocol::{Claiming, Intent, claim, claim_waiting};
use idem::store::{Fenced, Orphans, RecordStatus};

#[path = "support/mod.rs"]
mod support;

/// The waiters of the load measurement.
const WAITERS: usize = 64;

/// How long the holder holds the key in the load measurement.
const HOLD: Duration = Duration::from_secs(3);

/// The retry interval of the callers without `wait` in the load measurement.
const RETRY_EVERY: Duration = Duration::from_millis(10);

fn epoch_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn intent(tenant: &str, n: u64, wait: Duration) -> Intent {
    Intent {
        tenant: tenant.into(),
        key: idem::key::derive_key(
            tenant,
            "bench.wait",
            &[idem::key::KeyPart::new(&n).unwrap()],
        ),
        tool: "bench.wait",
        fingerprint: idem::fingerprint::Fingerprint::from_bytes([7; 32]),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3_600),
        orphans: Orphans::TakeOver,
        wait,
    }
}

/// The holder process: `hold N` claims key N, `complete N` completes it (announced, as a tool
/// with `wait` does) and answers when the completion returned.
fn holder(url: &str, tenant: &str) {
    let rt = support::runtime();
    rt.block_on(async {
        let idem = Idem::open(url).await.expect("open");
        let mut held = std::collections::HashMap::new();
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let line = line.unwrap();
            let (verb, n) = line.split_once(' ').unwrap();
            let n: u64 = n.parse().unwrap();
            match verb {
                "hold" => {
                    let Ok(Claiming::Acquired(claimed)) =
                        claim(&idem, &intent(tenant, n, Duration::from_secs(10))).await
                    else {
                        panic!("the holder claims a new key");
                    };
                    held.insert(n, claimed);
                    println!("held {n}");
                }
                "complete" => {
                    let claimed = held.remove(&n).unwrap();
                    let fenced = claimed
                        .complete(RecordStatus::Completed, b"{\"ok\":true}")
                        .await
                        .unwrap();
                    assert_eq!(fenced, Fenced::Applied);
                    println!("done {n} {}", epoch_ns());
                }
                _ => panic!("unknown command {line}"),
            }
            std::io::stdout().flush().unwrap();
        }
    });
}

/// The holder process, driven by lines.
struct Holder {
    stdin: ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    child: std::process::Child,
}

impl Holder {
    fn start(url: &str, tenant: &str) -> Holder {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("IDEM_BENCH_WAIT_HOLDER", url)
            .env("IDEM_BENCH_WAIT_TENANT", tenant)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the holder");
        Holder {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// Sends `line` and returns the answer.
    fn ask(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        answer.trim().to_owned()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The figures of one store.
struct Figures {
    store: &'static str,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    rounds: usize,
    /// Claims per waiter over the hold, with `wait`.
    waiting_claims: f64,
    /// Claims per caller over the hold, retrying every 10 ms without `wait`.
    polling_claims: f64,
}

async fn open_counted(url: &str) -> (Idem, Arc<support::Counts>) {
    let counts = Arc::new(support::Counts::default());
    let idem = Idem::with_store(support::Counted {
        inner: idem::store::admin::open(url).await.expect("open"),
        counts: counts.clone(),
    });
    (idem, counts)
}

fn measure(store: &'static str, url: &str, rounds: usize) -> Figures {
    let tenant = format!("bench-wait-{}", uuid::Uuid::new_v4().simple());
    let mut holder = Holder::start(url, &tenant);
    let rt = support::runtime();
    let (idem, counts) = rt.block_on(open_counted(url));
    let mut latencies = Vec::with_capacity(rounds);
    for n in 0..(rounds + 10) as u64 {
        assert_eq!(holder.ask(&format!("hold {n}")), format!("held {n}"));
        let waiter = rt.spawn({
            let (idem, intent) = (idem.clone(), intent(&tenant, n, Duration::from_secs(10)));
            async move {
                let answer = claim_waiting(&idem, &intent).await.expect("claim");
                let woke = epoch_ns();
                assert!(matches!(answer, Claiming::Completed(_)), "{answer:?}");
                woke
            }
        });
        // The waiter is watching by then.
        std::thread::sleep(Duration::from_millis(30));
        let done = holder.ask(&format!("complete {n}"));
        let completed: u128 = done.rsplit(' ').next().unwrap().parse().unwrap();
        let woke = rt.block_on(waiter).unwrap();
        if n >= 10 {
            latencies.push(woke.saturating_sub(completed) as f64 / 1e6);
        }
    }
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];

    // The load: 64 waiters with `wait`, then 64 callers retrying without it, on a held key.
    let mut load = |n: u64, wait: bool| {
        assert_eq!(holder.ask(&format!("hold {n}")), format!("held {n}"));
        counts.claims.store(0, Ordering::Relaxed);
        let callers: Vec<_> = (0..WAITERS)
            .map(|_| {
                let (idem, tenant) = (idem.clone(), tenant.clone());
                rt.spawn(async move {
                    if wait {
                        let answer = claim_waiting(&idem, &intent(&tenant, n, HOLD * 3)).await;
                        assert!(matches!(answer, Ok(Claiming::Completed(_))), "{answer:?}");
                    } else {
                        loop {
                            let answer = claim(&idem, &intent(&tenant, n, Duration::ZERO)).await;
                            match answer {
                                Ok(Claiming::InFlight(_)) => tokio::time::sleep(RETRY_EVERY).await,
                                Ok(Claiming::Completed(_)) => break,
                                other => panic!("{other:?}"),
                            }
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(HOLD);
        holder.ask(&format!("complete {n}"));
        for caller in callers {
            rt.block_on(caller).unwrap();
        }
        counts.claims.load(Ordering::Relaxed) as f64 / WAITERS as f64
    };
    let base = (rounds + 10) as u64;
    let waiting_claims = load(base, true);
    let polling_claims = load(base + 1, false);
    Figures {
        store,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: at(1.0),
        rounds,
        waiting_claims,
        polling_claims,
    }
}

fn main() {
    if let Ok(url) = std::env::var("IDEM_BENCH_WAIT_HOLDER") {
        let tenant = std::env::var("IDEM_BENCH_WAIT_TENANT").unwrap();
        return holder(&url, &tenant);
    }
    if !support::wanted("wait") {
        return;
    }
    let rounds: usize = std::env::var("IDEM_BENCH_WAIT_ROUNDS").map_or(200, |v| v.parse().unwrap());
    let (_dir, stores) = support::stores("wait", "wait.db");
    let mut json = Vec::new();
    for (name, url) in stores {
        let f = measure(name, &url, rounds);
        println!(
            "wait/{}: wake-up p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} rounds); claims per \
             caller over a {} s hold: {:.1} waiting, {:.1} retrying every 10 ms",
            f.store,
            f.p50_ms,
            f.p99_ms,
            f.max_ms,
            f.rounds,
            HOLD.as_secs(),
            f.waiting_claims,
            f.polling_claims
        );
        json.push(serde_json::json!({
            "store": f.store,
            "p50_ms": f.p50_ms,
            "p99_ms": f.p99_ms,
            "max_ms": f.max_ms,
            "rounds": f.rounds,
            "waiters": WAITERS,
            "hold_s": HOLD.as_secs(),
            "waiting_claims_per_caller": f.waiting_claims,
            "polling_claims_per_caller": f.polling_claims,
        }));
    }
    support::write_json("wait.json", &serde_json::Value::Array(json));
}
