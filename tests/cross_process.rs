//! Several OS processes share one SQLite file: every intent's effect happens exactly once.
//!
//! The test starts 4 copies of this test binary as workers (the ignored `worker` test), each with
//! 16 concurrent tasks racing over the same 200 intents. Each tool body appends the intent to an
//! effect ledger (one `O_APPEND` line per effect); the parent reads it afterwards.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use idem::{Idem, Outcome, idempotent};

const PROCESSES: usize = 4;
const TASKS: usize = 16;
const INTENTS: u32 = 200;

fn ledger_path() -> PathBuf {
    PathBuf::from(std::env::var("IDEM_CROSS_LEDGER").expect("set by the parent"))
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

#[idempotent(key = "intent", mutating, name = "cross.charge")]
async fn charge(intent: u32, amount_cents: u64) -> Result<u64, std::convert::Infallible> {
    record_effect(&ledger_path(), intent);
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    Ok(amount_cents)
}

/// One worker process: 16 tasks, each calling every intent once, in its own order.
#[test]
#[ignore = "run by `several_processes_share_one_sqlite_file` as a child process"]
fn worker() {
    let db = std::env::var("IDEM_CROSS_DB").expect("set by the parent");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let counts = runtime.block_on(async {
        let idem = Idem::open(&format!("sqlite://{db}")).await.expect("open");
        let tenant = idem.scope("tenant-x");
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..TASKS {
            let tenant = tenant.clone();
            tasks.spawn(async move {
                let mut counts = [0usize; 3];
                for i in 0..INTENTS {
                    let intent = (i + task as u32 * 37) % INTENTS;
                    match tenant.run(charge(intent, 100)).await.expect("call") {
                        Outcome::Fresh(_) => counts[0] += 1,
                        Outcome::Replayed(_) => counts[1] += 1,
                        Outcome::InFlight(_) => counts[2] += 1,
                        other => panic!("unexpected outcome: {other:?}"),
                    }
                }
                counts
            });
        }
        let mut total = [0usize; 3];
        while let Some(done) = tasks.join_next().await {
            for (t, c) in total.iter_mut().zip(done.unwrap()) {
                *t += c;
            }
        }
        total
    });
    println!("COUNTS {} {} {}", counts[0], counts[1], counts[2]);
}

#[test]
fn several_processes_share_one_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let ledger = dir.path().join("effects.log");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "worker",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("IDEM_CROSS_DB", &db)
                .env("IDEM_CROSS_LEDGER", &ledger)
                .output_async()
        })
        .collect();
    let mut totals = [0usize; 3];
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "worker failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let at = stdout.find("COUNTS ").expect("a COUNTS line");
        let line = stdout[at..].lines().next().unwrap_or_default();
        for (t, n) in totals.iter_mut().zip(line.split_whitespace().skip(1)) {
            *t += n.parse::<usize>().unwrap();
        }
    }

    let mut effects: HashMap<u32, usize> = HashMap::new();
    for line in std::fs::read_to_string(&ledger).unwrap().lines() {
        *effects.entry(line.parse().unwrap()).or_default() += 1;
    }
    assert_eq!(effects.len(), INTENTS as usize, "every intent ran");
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "intents whose effect did not happen exactly once: {twice:?}"
    );
    let calls = PROCESSES * TASKS * INTENTS as usize;
    assert_eq!(
        totals[0], INTENTS as usize,
        "one Fresh per intent across all processes"
    );
    assert_eq!(
        totals.iter().sum::<usize>(),
        calls,
        "every other call was Replayed or InFlight"
    );
    println!(
        "{calls} calls from {PROCESSES} processes: {} fresh, {} replayed, {} in flight; \
         every one of {INTENTS} effects happened once",
        totals[0], totals[1], totals[2]
    );
}

/// `Command::spawn` with piped output, so the children run side by side.
trait SpawnPiped {
    fn output_async(&mut self) -> std::process::Child;
}

impl SpawnPiped for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn worker")
    }
}
