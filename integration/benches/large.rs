//! Large results, measured, on SQLite (a file), Postgres (`IDEM_TEST_POSTGRES_URL`) and Redis
//! (`IDEM_TEST_REDIS_URL`): what a call returning 1 MiB costs against one returning 1 KiB.
//!
//! For each store, `IDEM_BENCH_LARGE_ROUNDS` rounds (default 10, after 2 of warm-up), the modes
//! alternating round by round, each a batch of `CALLS` calls of new keys (the replays replay
//! the batch's own keys):
//!
//! - a fresh call returning 1 KiB (kept in its record);
//! - a fresh call returning 1 MiB of new bytes (a new blob);
//! - a fresh call returning the same 1 MiB as every call before it (a blob that exists: the
//!   record names it);
//! - the 1 KiB calls replayed, the new 1 MiB calls replayed.
//!
//! Each mode's time per call is the median over the rounds; the ratios (1 MiB over 1 KiB) are
//! the medians of the rounds' ratios. Every store call is counted. Results go to `large.json`
//! beside criterion's (read by `bench-report`) and to stdout.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use idem::{Idem, idempotent};

#[path = "support/mod.rs"]
mod support;

/// Calls a mode makes each round.
const CALLS: usize = 10;
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// `size` bytes: `seed` first, then the same letter, so that two seeds differ.
fn document(size: usize, seed: &str) -> String {
    let mut out = String::with_capacity(size);
    out.push_str(seed);
    out.extend(std::iter::repeat_n('x', size - seed.len()));
    out
}

#[idempotent(key = "run_id", mutating, name = "bench.large")]
async fn export(run_id: String, size: usize, seed: String) -> Result<String, std::io::Error> {
    Ok(document(size, &seed))
}

const MODES: [&str; 5] = [
    "fresh, 1 KiB",
    "fresh, 1 MiB new",
    "fresh, 1 MiB stored before",
    "replay, 1 KiB",
    "replay, 1 MiB",
];

fn main() {
    if !support::wanted("large") {
        return;
    }
    let rounds: usize = std::env::var("IDEM_BENCH_LARGE_ROUNDS").map_or(10, |v| v.parse().unwrap());
    let (_dir, stores) = support::stores("large", "large.db");
    let rt = support::runtime();
    let mut json = Vec::new();
    for (store, url) in stores {
        let (seconds, calls, ratios) = rt.block_on(async {
            let counts = Arc::new(support::Counts::default());
            let idem = Idem::with_store(support::Counted {
                inner: idem::store::admin::open(&url).await.expect("open"),
                counts: counts.clone(),
            });
            let tenant = idem.scope(format!("bench-large-{}", uuid::Uuid::new_v4().simple()));
            let mut seconds: [Vec<f64>; 5] = Default::default();
            let mut calls: [u64; 5] = [0; 5];
            let mut ratios: [Vec<f64>; 3] = Default::default();
            for round in 0..rounds + 2 {
                let mut took = [0.0; 5];
                for (mode, took) in took.iter_mut().enumerate() {
                    let before = counts.calls.load(Ordering::Relaxed);
                    let started = Instant::now();
                    for n in 0..CALLS {
                        let (run, size, seed, fresh) = match mode {
                            0 => (format!("k{round}-{n}"), KIB, format!("k{round}-{n}"), true),
                            1 => (format!("m{round}-{n}"), MIB, format!("m{round}-{n}"), true),
                            2 => (format!("s{round}-{n}"), MIB, "same".to_owned(), true),
                            3 => (format!("k{round}-{n}"), KIB, format!("k{round}-{n}"), false),
                            _ => (format!("m{round}-{n}"), MIB, format!("m{round}-{n}"), false),
                        };
                        let out = tenant.run(export(run, size, seed)).await.unwrap();
                        assert_eq!(out.is_fresh(), fresh, "{}", MODES[mode]);
                        assert_eq!(out.value().map(String::len), Some(size));
                    }
                    *took = started.elapsed().as_secs_f64() / CALLS as f64;
                    calls[mode] = calls[mode].max(counts.calls.load(Ordering::Relaxed) - before);
                }
                if round >= 2 {
                    for (mode, took) in took.iter().enumerate() {
                        seconds[mode].push(*took);
                    }
                    ratios[0].push(took[1] / took[0]);
                    ratios[1].push(took[2] / took[0]);
                    ratios[2].push(took[4] / took[3]);
                }
            }
            (seconds, calls, ratios)
        });
        let mut modes = serde_json::Map::new();
        for (mode, label) in MODES.iter().enumerate() {
            let s = support::median(&seconds[mode]);
            println!(
                "large/{store}/{label}: {:.3} ms a call (median of {}), {} store round trips \
                 for {CALLS} calls",
                s * 1e3,
                seconds[mode].len(),
                calls[mode]
            );
            modes.insert(
                (*label).to_owned(),
                serde_json::json!({"ms": s * 1e3, "round_trips": calls[mode]}),
            );
        }
        let [new, stored, replay] = ratios.map(|r| support::median(&r));
        println!(
            "large/{store}: 1 MiB over 1 KiB, time a call: {new:.1}x fresh (new bytes), \
             {stored:.1}x fresh (bytes stored before), {replay:.1}x replayed (medians of the \
             rounds' ratios)"
        );
        json.push(serde_json::json!({
            "store": store,
            "calls": CALLS,
            "rounds": rounds,
            "modes": modes,
            "ratio_new": new,
            "ratio_stored": stored,
            "ratio_replay": replay,
        }));
    }
    support::write_json("large.json", &serde_json::Value::Array(json));
}
