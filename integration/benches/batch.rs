//! Batches, measured: a 100-item batch against the same 100 items as single calls, on SQLite
//! (a file), Postgres (`IDEM_TEST_POSTGRES_URL`) and Redis (`IDEM_TEST_REDIS_URL`).
//!
//! For each store, `IDEM_BENCH_BATCH_ROUNDS` rounds (default 30, after 3 of warm-up), each of
//! new keys: one call of the batch tool over 100 items, then 100 calls of the single tool one
//! after another (an agent loop), then the same 100 singles at once (joined in one task); then
//! the batch again over the same items (every item replayed) and the 100 singles again (each
//! replayed). The modes alternate round by round, so the machine's drift reaches them alike.
//! Both tools have the same body (no effect of their own). Every store call is counted (a
//! round trip each: a claim, a completion, a batch's claim, a batch's settlement).
//!
//! Results go to `batch.json` beside criterion's (read by `bench-report`) and to stdout.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use idem::{Idem, idempotent};
use serde::{Deserialize, Serialize};

#[path = "support/mod.rs"]
mod support;

const ITEMS: u64 = 100;

/// One item: the id is its key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Item {
    id: u64,
    customer: String,
    amount_cents: u64,
}

/// What either tool answers for an item.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Done {
    id: u64,
    amount_cents: u64,
}

#[idempotent(key = "run_id, items[].id", mutating, name = "bench.batch")]
async fn batch(run_id: String, items: Vec<Item>) -> Vec<Result<Done, Infallible>> {
    items
        .into_iter()
        .map(|item| {
            Ok(Done {
                id: item.id,
                amount_cents: item.amount_cents,
            })
        })
        .collect()
}

#[idempotent(key = "run_id, item.id", mutating, name = "bench.single")]
async fn single(run_id: String, item: Item) -> Result<Done, Infallible> {
    Ok(Done {
        id: item.id,
        amount_cents: item.amount_cents,
    })
}

fn items() -> Vec<Item> {
    (0..ITEMS)
        .map(|id| Item {
            id,
            customer: "cus_42".into(),
            amount_cents: 500 + id,
        })
        .collect()
}

/// The modes, in the order each round runs them.
const MODES: [&str; 5] = [
    "batch",
    "singles in turn",
    "singles at once",
    "batch replayed",
    "singles replayed",
];

/// Seconds and store calls of each mode, over the rounds.
struct Figures {
    store: &'static str,
    seconds: [Vec<f64>; 5],
    calls: [Vec<u64>; 5],
}

fn measure(store: &'static str, url: &str, rounds: usize) -> Figures {
    let rt = support::runtime();
    rt.block_on(async {
        let counts = Arc::new(support::Counts::default());
        let idem = Idem::with_store(support::Counted {
            inner: idem::store::admin::open(url).await.expect("open"),
            counts: counts.clone(),
        });
        let tenant = idem.scope(format!("bench-batch-{}", uuid::Uuid::new_v4().simple()));
        let mut figures = Figures {
            store,
            seconds: Default::default(),
            calls: Default::default(),
        };
        for round in 0..rounds + 3 {
            let batch_run = format!("b{round}");
            let single_run = format!("s{round}");
            let joined_run = format!("j{round}");
            for (mode, name) in MODES.iter().enumerate() {
                let before = counts.calls.load(Ordering::Relaxed);
                let started = Instant::now();
                match mode {
                    0 | 3 => {
                        let answers = tenant.run(batch(batch_run.clone(), items())).await.unwrap();
                        let expected = if mode == 0 { ITEMS as usize } else { 0 };
                        assert_eq!(answers.ran(), expected, "{name}");
                    }
                    1 | 4 => {
                        for item in items() {
                            let out = tenant.run(single(single_run.clone(), item)).await.unwrap();
                            assert_eq!(out.is_fresh(), mode == 1, "{name}");
                        }
                    }
                    _ => {
                        let mut calls = tokio::task::JoinSet::new();
                        for item in items() {
                            let tenant = tenant.clone();
                            calls.spawn(tenant.run(single(joined_run.clone(), item)));
                        }
                        while let Some(out) = calls.join_next().await {
                            assert!(out.unwrap().unwrap().is_fresh(), "{name}");
                        }
                    }
                }
                let seconds = started.elapsed().as_secs_f64();
                let calls = counts.calls.load(Ordering::Relaxed) - before;
                if round >= 3 {
                    figures.seconds[mode].push(seconds);
                    figures.calls[mode].push(calls);
                }
            }
        }
        figures
    })
}

fn main() {
    if !support::wanted("batch") {
        return;
    }
    let rounds: usize = std::env::var("IDEM_BENCH_BATCH_ROUNDS").map_or(30, |v| v.parse().unwrap());
    let (_dir, stores) = support::stores("batch", "batch.db");
    let mut json = Vec::new();
    for (name, url) in stores {
        let f = measure(name, &url, rounds);
        let mut modes = serde_json::Map::new();
        for (mode, label) in MODES.iter().enumerate() {
            let seconds = support::median(&f.seconds[mode]);
            let calls = f.calls[mode].iter().max().copied().unwrap_or(0);
            let items_per_s = ITEMS as f64 / seconds;
            println!(
                "batch/{}/{label}: {:.0} items/s ({:.2} ms for {ITEMS} items, median of {}), \
                 {calls} store round trips",
                f.store,
                items_per_s,
                seconds * 1e3,
                f.seconds[mode].len()
            );
            modes.insert(
                (*label).to_owned(),
                serde_json::json!({
                    "items_per_s": items_per_s,
                    "ms_per_call": seconds * 1e3,
                    "round_trips": calls,
                }),
            );
        }
        json.push(serde_json::json!({
            "store": f.store,
            "items": ITEMS,
            "rounds": rounds,
            "modes": modes,
        }));
    }
    support::write_json("batch.json", &serde_json::Value::Array(json));
}
