//! idem beside its peers: the same tool call made through idem and through
//! [agent-effects](https://github.com/akosidencio/agent-effects) (a Rust library for agents'
//! side effects, the nearest peer), each on a SQLite file of its own on the same disk, both
//! `synchronous=FULL` in WAL mode, in one process, timed in alternation.
//!
//! | row | a side's block |
//! |---|---|
//! | fresh call, one caller | calls under new keys, one after another |
//! | replay, one caller | calls under a key that already completed (idem's replay cache on, then off) |
//! | fresh calls, 64 callers | calls under new keys, among 64 concurrent tasks |
//!
//! Each row is the median of the rounds' ratios (the peer's time for a block over idem's: above
//! 1, idem makes more calls a second) with its quartiles, as the workspace's benchmarks report
//! theirs. Every body counts its runs, and the run ends with a check that each fresh call ran
//! its body once and no replay ran it.
//!
//! `cargo run --release --manifest-path peers/Cargo.toml [-- [--smoke] DIR]`: files under `DIR`
//! (default: a new directory under the system's temporary one); prints the table and writes it
//! as JSON to `DIR/peers.json`. `--smoke` makes a few rounds of a few calls (CI: the checks, not
//! the figures). Apart from the workspace (its own lock file), so that the peer's dependencies
//! never enter idem's.

use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_effects::{EffectFailure, EffectKind, EffectOutcome, Runtime};
use agent_effects_sqlite::SqliteStore as EffectsStore;
use idem::{Idem, Scope, idempotent};
use serde::{Deserialize, Serialize};

/// What the benchmarked tool returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Payment {
    payment_id: String,
    customer: String,
    amount_cents: u64,
}

/// Bodies run, by either side's tool.
static RAN: AtomicU64 = AtomicU64::new(0);

fn payment(run_id: &str, step_id: u64, customer: String, amount_cents: u64) -> Payment {
    RAN.fetch_add(1, Ordering::Relaxed);
    Payment {
        payment_id: format!("pay_{run_id}_{step_id}"),
        customer,
        amount_cents,
    }
}

/// The seeds' `register_payment` through idem, with no effect of its own.
#[idempotent(key = "run_id, step_id", mutating, name = "peers.register_payment")]
async fn register_payment(
    run_id: String,
    step_id: u64,
    customer: String,
    amount_cents: u64,
) -> Result<Payment, Infallible> {
    Ok(payment(&run_id, step_id, customer, amount_cents))
}

/// The same call's arguments, as agent-effects records them (its input and fingerprint).
#[derive(Serialize)]
struct Args<'a> {
    run_id: &'a str,
    step_id: u64,
    customer: &'a str,
    amount_cents: u64,
}

/// The same call through agent-effects: one effect per (run, step), an irreversible write.
async fn effect_call(runtime: &Runtime<EffectsStore>, run_id: &'static str, step_id: u64) {
    let args = Args {
        run_id,
        step_id,
        customer: "cus_42",
        amount_cents: 500,
    };
    let key = format!("{run_id}:{step_id}");
    let outcome = runtime
        .effect("peers.register_payment", key)
        .kind(EffectKind::IrreversibleWrite)
        .input(&args)
        .run(move |_| async move {
            Ok::<_, EffectFailure>(payment(run_id, step_id, "cus_42".into(), 500))
        })
        .await
        .expect("agent-effects call");
    assert!(
        matches!(outcome, EffectOutcome::Committed(_)),
        "agent-effects answered {outcome:?}"
    );
}

async fn idem_call(scope: &Scope, run_id: &'static str, step_id: u64, fresh: bool) {
    let call = register_payment(run_id.into(), step_id, "cus_42".into(), 500);
    let outcome = scope.run(call).await.expect("idem call");
    assert_eq!(outcome.is_fresh(), fresh, "idem answered {outcome:?}");
}

/// The median of a row's ratios and its quartiles.
#[derive(Debug, Clone, Copy, Serialize)]
struct Spread {
    rounds: usize,
    block: u64,
    median: f64,
    low_quartile: f64,
    high_quartile: f64,
    /// idem's and the peer's calls a second, medians of their blocks.
    idem_calls_per_s: f64,
    peer_calls_per_s: f64,
}

/// Times `rounds` blocks of `block` calls a side, in turn (the side that goes first alternates),
/// after one round unmeasured. Each side's `block(first_step, calls)` makes the calls and answers
/// how long they took.
async fn alternating<A, AF, B, BF>(rounds: usize, block: u64, mut idem: A, mut peer: B) -> Spread
where
    A: FnMut(u64, u64) -> AF,
    AF: Future<Output = Duration>,
    B: FnMut(u64, u64) -> BF,
    BF: Future<Output = Duration>,
{
    let mut next = 0;
    let mut steps = || {
        next += block;
        next - block
    };
    idem(steps(), block).await;
    peer(steps(), block).await;
    let (mut ratios, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (o, t) = if round % 2 == 0 {
            let o = idem(steps(), block).await;
            (o, peer(steps(), block).await)
        } else {
            let t = peer(steps(), block).await;
            (idem(steps(), block).await, t)
        };
        ratios.push(t.as_secs_f64() / o.as_secs_f64());
        ours.push(block as f64 / o.as_secs_f64());
        theirs.push(block as f64 / t.as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let idem_calls_per_s = median(&mut ours);
    let peer_calls_per_s = median(&mut theirs);
    let median_ratio = median(&mut ratios);
    Spread {
        rounds,
        block,
        median: median_ratio,
        low_quartile: ratios[rounds / 4],
        high_quartile: ratios[rounds * 3 / 4],
        idem_calls_per_s,
        peer_calls_per_s,
    }
}

/// Makes `calls` calls from `first` among `callers` concurrent tasks: how long they took.
async fn among<F, Fut>(callers: u64, first: u64, calls: u64, call: F) -> Duration
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let call = call.clone();
        tasks.spawn(async move {
            let mut step = first + caller;
            while step < first + calls {
                call(step).await;
                step += callers;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a caller");
    }
    start.elapsed()
}

/// Makes the calls of `steps` one after another: how long they took.
async fn one_by_one<F: FnMut(u64) -> Fut, Fut: Future<Output = ()>>(
    steps: std::ops::Range<u64>,
    mut call: F,
) -> Duration {
    let start = Instant::now();
    for step in steps {
        call(step).await;
    }
    start.elapsed()
}

/// The command line: whether to make a smoke run, and the directory of the files.
fn arguments() -> (bool, PathBuf) {
    let mut smoke = false;
    let mut dir = None;
    for arg in std::env::args_os().skip(1) {
        match arg.to_str() {
            Some("--smoke") => smoke = true,
            Some(flag) if flag.starts_with("--") => {
                panic!("unknown option {flag}: the options are --smoke and a directory")
            }
            _ => dir = Some(PathBuf::from(arg)),
        }
    }
    let dir = dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("idem-peers-{}", std::process::id())));
    (smoke, dir)
}

async fn open(dir: &Path, name: &str, query: &str) -> (Scope, Runtime<EffectsStore>) {
    let idem = Idem::open(&format!(
        "sqlite://{}{query}",
        dir.join(format!("{name}-idem.db")).display()
    ))
    .await
    .expect("idem's store");
    let effects = EffectsStore::open(dir.join(format!("{name}-effects.db")))
        .await
        .expect("agent-effects' store");
    (idem.scope("tenant-a"), Runtime::new(effects))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (smoke, dir) = arguments();
    std::fs::create_dir_all(&dir).expect("the benchmark's directory");
    // Rounds, and calls a side in a round: one caller's fresh calls, its replays, 64 callers'.
    let (rounds, fresh, replays, among_64) = if smoke {
        (3, 5, 20, 64)
    } else {
        (21, 50, 400, 640)
    };
    let mut rows: Vec<(&str, Spread)> = Vec::new();
    let mut fresh_calls = 0;

    let (idem, effects) = open(&dir, "fresh", "").await;
    let spread = alternating(
        rounds,
        fresh,
        |first, n| {
            one_by_one(first..first + n, |step| {
                idem_call(&idem, "fresh", step, true)
            })
        },
        |first, n| {
            one_by_one(first..first + n, |step| {
                effect_call(&effects, "fresh", step)
            })
        },
    )
    .await;
    fresh_calls += (spread.rounds as u64 + 1) * spread.block * 2;
    rows.push(("fresh call, one caller", spread));

    for (query, name) in [
        ("", "replay, one caller (idem's replay cache on)"),
        (
            "?replay_cache=0",
            "replay, one caller (idem's replay cache off)",
        ),
    ] {
        let (idem, effects) = open(&dir, &format!("replay{}", query.len()), query).await;
        idem_call(&idem, "replay", 0, true).await;
        effect_call(&effects, "replay", 0).await;
        fresh_calls += 2;
        let spread = alternating(
            rounds,
            replays,
            |_, n| one_by_one(0..n, |_| idem_call(&idem, "replay", 0, false)),
            |_, n| one_by_one(0..n, |_| effect_call(&effects, "replay", 0)),
        )
        .await;
        rows.push((name, spread));
    }

    let (idem, effects) = open(&dir, "callers", "").await;
    let effects = Arc::new(effects);
    let spread = alternating(
        rounds / 2 + 1,
        among_64,
        |first, n| {
            let idem = idem.clone();
            among(64, first, n, move |step| {
                let idem = idem.clone();
                async move { idem_call(&idem, "callers", step, true).await }
            })
        },
        |first, n| {
            let effects = effects.clone();
            among(64, first, n, move |step| {
                let effects = effects.clone();
                async move { effect_call(&effects, "callers", step).await }
            })
        },
    )
    .await;
    fresh_calls += (spread.rounds as u64 + 1) * spread.block * 2;
    rows.push(("fresh calls, 64 callers", spread));

    let ran = RAN.load(Ordering::Relaxed);
    assert_eq!(
        ran, fresh_calls,
        "every fresh call ran its body once, and no replay ran it"
    );

    println!("idem over agent-effects, SQLite, timed in alternation: median, quartiles, calls/s");
    for (name, s) in &rows {
        println!(
            "  {name:<46} {:.2} ({:.2}–{:.2}) ({} × {}); idem {:.0}/s, agent-effects {:.0}/s",
            s.median,
            s.low_quartile,
            s.high_quartile,
            s.rounds,
            s.block,
            s.idem_calls_per_s,
            s.peer_calls_per_s
        );
    }
    println!("  bodies run: {ran}, one per fresh call");
    let json: Vec<_> = rows
        .iter()
        .map(|(name, spread)| serde_json::json!({ "name": name, "spread": spread }))
        .collect();
    let out = dir.join("peers.json");
    std::fs::write(&out, serde_json::to_string_pretty(&json).expect("json")).expect("peers.json");
    println!("  written to {}", out.display());
}
