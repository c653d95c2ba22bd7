//! idem on the embedded SQLite store, next to hand-written rusqlite baselines in the same run.
//!
//! - `replay`: a retried call answered from the store, vs what a hand-written store does at a
//!   retry: a prepared point SELECT, the check of the arguments' fingerprint, deserialize.
//! - `replay_working_set`: replays cycling over the intents an agent fleet just completed,
//!   more than the replay cache holds (about 3× and 11× a 100 KiB cache), with the cache on and
//!   off, vs the raw SELECT + fingerprint check over the same cycle.
//! - `fresh`: a new intent (claim, body, completion; two durable commits), vs a hand-written
//!   INSERT `in_flight` (with the arguments' fingerprint) + UPDATE `completed` with the same
//!   durability (WAL, synchronous=FULL).
//! - `fresh_concurrent`: fresh calls/s with 1, 8 and 64 callers (group commit at work), and
//!   the ceiling of group commit: a raw rusqlite loop committing 64 calls' claims in one
//!   transaction and their completions in another (`raw_group_commit/64`), also timed in
//!   alternation with idem's 64 callers.
//! - `renewal`: calls whose body waits once (so the lease renewal arms its timer), with renewal
//!   on and off: fresh calls on SQLite, and calls whose error releases the key on the memory
//!   store (nothing else to measure): what renewal costs a call shorter than its lease.
//!
//! - the replay ratios and the fresh call's again, each side timed in alternation with the
//!   other ([`support::alternating`]), written to `alternating-sqlite.json` beside criterion's
//!   output.
//!
//! `cargo bench --bench sqlite` prints the ratios at the end. All files live under the target
//! directory, on the same disk.

use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use idem::Idem;
use rusqlite::{Connection, params};
use support::raw_sqlite::{self, GROUP};
use support::{
    Payment, RawArgs, Spread, alternating, alternating_in, criterion_dir, median_ns, payment_json,
    ratio_row as row, raw_key, register_payment, runtime, wanted,
};

mod support;

fn bench_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("idem-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

fn replay(
    c: &mut Criterion,
    dir: &Path,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Vec<(&'static str, Spread)>,
) {
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(1));

    let idem = rt
        .block_on(Idem::open(&format!(
            "sqlite://{}",
            dir.join("replay.db").display()
        )))
        .expect("open");
    let tenant = idem.scope("tenant-a");
    let call = || register_payment("run-1".into(), 7, "cus_42".into(), 500);
    assert!(rt.block_on(tenant.run(call())).expect("call").is_fresh());
    group.bench_function("idem", |b| {
        b.to_async(rt).iter(|| async {
            let out = tenant.run(call()).await.expect("call");
            assert!(out.is_replayed());
            out
        })
    });

    // The same, with the in-process replay cache off: every replay reads the file.
    let uncached = rt
        .block_on(Idem::open(&format!(
            "sqlite://{}?replay_cache=0",
            dir.join("replay-uncached.db").display()
        )))
        .expect("open");
    let uncached = uncached.scope("tenant-a");
    assert!(rt.block_on(uncached.run(call())).expect("call").is_fresh());
    group.bench_function("idem_no_cache", |b| {
        b.to_async(rt).iter(|| async {
            let out = uncached.run(call()).await.expect("call");
            assert!(out.is_replayed());
            out
        })
    });

    let conn = raw_sqlite::connection(&dir.join("replay-raw.db"));
    let key = raw_key("tenant-a", 7);
    conn.execute(
        "INSERT INTO raw VALUES ('tenant-a', ?1, ?2, 'completed', 1, 0, 0, 0, ?3)",
        params![
            &key[..],
            &RawArgs::payment("run-1", 7).fingerprint()[..],
            payment_json(7)
        ],
    )
    .expect("insert");
    group.bench_function("raw_select", |b| {
        b.iter(|| raw_replay(&conn, &RawArgs::payment("run-1", 7)))
    });
    group.finish();
    if wanted("replay") {
        let raw = || std::future::ready(raw_replay(&conn, &RawArgs::payment("run-1", 7)));
        let cached = || tenant.run(call());
        alternated.push(("replay", alternating(rt, cached, raw)));
        let uncached = || uncached.run(call());
        alternated.push(("replay, cache off", alternating(rt, uncached, raw)));
    }
}

/// A hand-written store's retry: the row of the call's key, its fingerprint checked against the
/// arguments', its result decoded.
fn raw_replay(conn: &Connection, args: &RawArgs<'_>) -> Payment {
    let mut stmt = conn
        .prepare_cached("SELECT fingerprint, result FROM raw WHERE tenant = ?1 AND key = ?2")
        .expect("prepare");
    let key = raw_key("tenant-a", args.step_id);
    let mut rows = stmt.query(params!["tenant-a", &key[..]]).expect("query");
    let row = rows.next().expect("step").expect("a row");
    let (stored, result) = (
        row.get_ref(0).expect("fingerprint"),
        row.get_ref(1).expect("result"),
    );
    args.replay(
        stored.as_blob().expect("blob"),
        result.as_blob().expect("blob"),
    )
}

/// The replay cache the working-set group gives idem: about 360 records of this size.
const WORKING_SET_CACHE_KIB: usize = 100;
/// Working sets about 3× and 11× that cache.
const WORKING_SETS: [u64; 2] = [1_000, 4_000];
/// Calls a side over the rounds that time a working set in alternation, a whole cycle a round.
const WORKING_SET_CALLS: usize = 200_000;

fn replay_working_set(
    c: &mut Criterion,
    dir: &Path,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Vec<(&'static str, Spread)>,
) {
    let mut group = c.benchmark_group("replay_working_set");
    group.throughput(Throughput::Elements(1));
    let file = dir.join("working-set.db");
    let url = |cache: usize| format!("sqlite://{}?replay_cache={cache}", file.display());
    let cached = rt
        .block_on(Idem::open(&url(WORKING_SET_CACHE_KIB)))
        .expect("open");
    let uncached = rt.block_on(Idem::open(&url(0))).expect("open");
    let (cached, uncached) = (cached.scope("tenant-a"), uncached.scope("tenant-a"));
    let call = |n: u64| register_payment("run-ws".into(), n, "cus_42".into(), 500);
    let largest = *WORKING_SETS.iter().max().expect("sizes");
    rt.block_on(async {
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..largest {
            let uncached = uncached.clone();
            calls.spawn(async move { uncached.run(call(n)).await.expect("call") });
            if calls.len() >= 64 {
                calls.join_next().await;
            }
        }
        calls.join_all().await;
    });
    let conn = raw_sqlite::connection(&dir.join("working-set-raw.db"));
    conn.execute_batch("BEGIN").expect("begin");
    for n in 0..largest {
        conn.execute(
            "INSERT INTO raw VALUES ('tenant-a', ?1, ?2, 'completed', 1, 0, 0, 0, ?3)",
            params![
                &raw_key("tenant-a", n)[..],
                &RawArgs::payment("run-ws", n).fingerprint()[..],
                payment_json(n)
            ],
        )
        .expect("insert");
    }
    conn.execute_batch("COMMIT").expect("commit");
    for size in WORKING_SETS {
        for (name, scope) in [("idem", &cached), ("idem_no_cache", &uncached)] {
            let next = AtomicU64::new(0);
            group.bench_function(BenchmarkId::new(name, size), |b| {
                b.to_async(rt).iter(|| async {
                    let n = next.fetch_add(1, Ordering::Relaxed) % size;
                    let out = scope.run(call(n)).await.expect("call");
                    assert!(out.is_replayed());
                    out
                })
            });
        }
        let mut n = 0;
        group.bench_function(BenchmarkId::new("raw_select", size), |b| {
            b.iter(|| {
                n = (n + 1) % size;
                raw_replay(&conn, &RawArgs::payment("run-ws", n))
            })
        });
    }
    group.finish();
    if !wanted("replay_working_set") {
        return;
    }
    // Each side cycles over the working set on its own, as in the benches above, a whole cycle
    // a block: the records a full cache keeps are a part of the cycle, so a block of part of it
    // would time some rounds with them and others without.
    let cycling = |cache_on: bool, size: u64| {
        let next = std::cell::Cell::new(0);
        let scope = if cache_on { &cached } else { &uncached };
        move || {
            next.set((next.get() + 1) % size);
            scope.run(call(next.get()))
        }
    };
    let raw = |size: u64| {
        let mut n = 0;
        let conn = &conn;
        move || {
            n = (n + 1) % size;
            std::future::ready(raw_replay(conn, &RawArgs::payment("run-ws", n)))
        }
    };
    for (size, on, off, on_off) in [
        (
            1_000,
            "1000 intents, cache on",
            "1000 intents, cache off",
            None,
        ),
        (
            4_000,
            "4000 intents, cache on",
            "4000 intents, cache off",
            Some("4000 intents, cache on vs off"),
        ),
    ] {
        let (rounds, block) = (WORKING_SET_CALLS / size as usize, size as usize);
        let spread = alternating_in(rt, rounds, block, cycling(true, size), raw(size));
        alternated.push((on, spread));
        let spread = alternating_in(rt, rounds, block, cycling(false, size), raw(size));
        alternated.push((off, spread));
        if let Some(name) = on_off {
            let (on, off) = (cycling(true, size), cycling(false, size));
            alternated.push((name, alternating_in(rt, rounds, block, on, off)));
        }
    }
}

fn fresh(
    c: &mut Criterion,
    dir: &Path,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Vec<(&'static str, Spread)>,
) {
    let mut group = c.benchmark_group("fresh");
    group.throughput(Throughput::Elements(1));
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(12));

    let idem = rt
        .block_on(Idem::open(&format!(
            "sqlite://{}",
            dir.join("fresh.db").display()
        )))
        .expect("open");
    let tenant = idem.scope("tenant-a");
    let next = AtomicU64::new(0);
    group.bench_function("idem", |b| {
        b.to_async(rt).iter(|| async {
            let step = next.fetch_add(1, Ordering::Relaxed);
            let out = tenant
                .run(register_payment("run-1".into(), step, "cus_42".into(), 500))
                .await
                .expect("call");
            assert!(out.is_fresh());
            out
        })
    });

    let conn = raw_sqlite::connection(&dir.join("fresh-raw.db"));
    let raw_next = AtomicU64::new(0);
    group.bench_function("raw_insert_update", |b| {
        b.iter(|| raw_sqlite::two_writes(&conn, raw_next.fetch_add(1, Ordering::Relaxed)))
    });
    group.finish();
    if wanted("fresh") {
        // New numbers for both sides, far above the criterion benches' own.
        let step = AtomicU64::new(1 << 42);
        let tenant = &tenant;
        let ours = || {
            let n = step.fetch_add(1, Ordering::Relaxed);
            async move {
                let call = register_payment("run-1".into(), n, "cus_42".into(), 500);
                assert!(tenant.run(call).await.expect("call").is_fresh());
            }
        };
        let theirs = || {
            raw_sqlite::two_writes(&conn, step.fetch_add(1, Ordering::Relaxed));
            std::future::ready(())
        };
        alternated.push(("fresh", support::alternating_in(rt, 51, 40, ours, theirs)));
    }
}

/// The benchmarked tool of `renewal`: like `register_payment`, but its body yields once, as any
/// body that awaits I/O does, so the call's renewals start their timer.
#[idem::idempotent(
    key = "run_id, step_id",
    mutating,
    name = "bench.register_payment_awaiting"
)]
async fn register_payment_awaiting(
    run_id: String,
    step_id: u64,
    customer: String,
    amount_cents: u64,
) -> Result<Payment, std::convert::Infallible> {
    tokio::task::yield_now().await;
    Ok(Payment {
        payment_id: format!("pay_{run_id}_{step_id}"),
        customer,
        amount_cents,
    })
}

/// The memory-store twin of `register_payment_awaiting`: its error releases the key, so the
/// store stays empty and each call costs the same however many ran before.
#[idem::idempotent(key = "run_id, step_id", mutating, name = "bench.declined_awaiting")]
async fn declined_awaiting(run_id: String, step_id: u64) -> Result<Payment, String> {
    tokio::task::yield_now().await;
    Err(format!("declined {run_id} {step_id}"))
}

fn renewal(c: &mut Criterion, dir: &Path, rt: &tokio::runtime::Runtime) {
    let mut group = c.benchmark_group("renewal");
    group.throughput(Throughput::Elements(1));
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(8));
    for renew in [true, false] {
        let on = if renew { "on" } else { "off" };
        let url = format!(
            "sqlite://{}",
            dir.join(format!("renewal-{on}.db")).display()
        );
        let sqlite = rt
            .block_on(Idem::builder().renew_leases(renew).open(&url))
            .expect("open")
            .scope(format!("tenant-{on}"));
        let next = AtomicU64::new(0);
        group.bench_function(format!("sqlite_{on}"), |b| {
            b.to_async(rt).iter(|| async {
                let step = next.fetch_add(1, Ordering::Relaxed);
                let call = register_payment_awaiting("run-r".into(), step, "cus_42".into(), 5);
                let out = sqlite.run(call).await.expect("call");
                assert!(out.is_fresh());
                out
            })
        });
        let memory = rt
            .block_on(Idem::builder().renew_leases(renew).open("memory://"))
            .expect("open")
            .scope("tenant-a");
        let next = AtomicU64::new(0);
        group.bench_function(format!("memory_{on}"), |b| {
            b.to_async(rt).iter(|| async {
                let step = next.fetch_add(1, Ordering::Relaxed);
                let answer = memory.run(declined_awaiting("run-r".into(), step)).await;
                assert!(matches!(answer, Err(idem::Error::Tool { .. })));
            })
        });
    }
    group.finish();
}

fn fresh_concurrent(c: &mut Criterion, dir: &Path, rt: &tokio::runtime::Runtime) {
    let idem = rt
        .block_on(Idem::open(&format!(
            "sqlite://{}",
            dir.join("concurrent.db").display()
        )))
        .expect("open");
    let tenant = idem.scope("tenant-a");
    support::concurrent_callers(
        c,
        "fresh_concurrent",
        "idem",
        &[1, 8, 64],
        Duration::from_secs(8),
        rt,
        move |step| {
            let tenant = tenant.clone();
            async move {
                let call = register_payment("run-2".into(), step, "cus_42".into(), 500);
                assert!(tenant.run(call).await.expect("call").is_fresh());
            }
        },
    );
}

/// idem's fresh calls with [`GROUP`](raw_sqlite::GROUP) callers against the group-commit ceiling
/// ([`raw_sqlite::group_commit`]): criterion's rate of the ceiling, and the two timed in alternation,
/// blocks of 640 calls a side, and of 6,400.
fn group_commit(
    c: &mut Criterion,
    dir: &Path,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Vec<(&'static str, Spread)>,
) {
    let conn = raw_sqlite::connection(&dir.join("group-raw.db"));
    let next = std::sync::Arc::new(AtomicU64::new(1 << 40));
    let mut group = c.benchmark_group("fresh_concurrent");
    group.throughput(Throughput::Elements(GROUP));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(8));
    group.bench_function(BenchmarkId::new("raw_group_commit", GROUP), |b| {
        b.iter(|| raw_sqlite::group_commit(&conn, next.fetch_add(GROUP, Ordering::Relaxed)))
    });
    group.finish();
    if !wanted("fresh_concurrent") {
        return;
    }
    // Both sides from empty files of their own, growing by the same calls.
    let conn = raw_sqlite::connection(&dir.join("group-raw-alternated.db"));
    let idem = rt
        .block_on(Idem::open(&format!(
            "sqlite://{}",
            dir.join("group.db").display()
        )))
        .expect("open");
    let tenant = idem.scope("tenant-a");
    let call = move |step| {
        let tenant = tenant.clone();
        async move {
            let call = register_payment("run-3".into(), step, "cus_42".into(), 500);
            assert!(tenant.run(call).await.expect("call").is_fresh());
        }
    };
    let ceiling = |calls: u64| {
        let start = std::time::Instant::now();
        for _ in 0..calls / GROUP {
            raw_sqlite::group_commit(&conn, next.fetch_add(GROUP, Ordering::Relaxed));
        }
        std::future::ready(start.elapsed())
    };
    // Ten calls a caller (blocks of 640) is mostly the callers' start and end (the last
    // commits wait for each other's syncs; the loop has neither): blocks of a hundred calls a
    // caller show the steady state beside it.
    let sizes = [
        (21, 640, "64 callers vs the raw group-commit ceiling"),
        (
            11,
            6_400,
            "64 callers vs the raw group-commit ceiling, blocks of 6,400",
        ),
    ];
    for (rounds, block, name) in sizes {
        let spread = support::alternating_blocks(
            rt,
            rounds,
            block,
            |calls| support::among_callers(&call, GROUP, calls, &next),
            &ceiling,
        );
        alternated.push((name, spread));
    }
}

fn summary() {
    println!("\nidem on SQLite: calls/s (median), and the ratio to the baseline in this run");
    row(
        "replay: idem vs raw SELECT + check + deserialize",
        median_ns("replay", "idem"),
        median_ns("replay", "raw_select"),
        1.5,
    );
    row(
        "replay, cache off: idem vs raw SELECT",
        median_ns("replay", "idem_no_cache"),
        median_ns("replay", "raw_select"),
        0.8,
    );
    for size in WORKING_SETS {
        let m = |bench: &str| median_ns("replay_working_set", &format!("{bench}/{size}"));
        row(
            &format!(
                "replay over {size} intents (cache {WORKING_SET_CACHE_KIB} KiB): idem vs raw SELECT"
            ),
            m("idem"),
            m("raw_select"),
            0.9,
        );
        row(
            &format!("replay over {size} intents, cache off: idem vs raw SELECT"),
            m("idem_no_cache"),
            m("raw_select"),
            0.9,
        );
        row(
            &format!("replay over {size} intents: cache on vs off"),
            m("idem"),
            m("idem_no_cache"),
            1.0,
        );
    }
    row(
        "fresh: idem vs raw INSERT + UPDATE",
        median_ns("fresh", "idem"),
        median_ns("fresh", "raw_insert_update"),
        0.8,
    );
    row(
        "renewal on vs off, sqlite, a body that waits once",
        median_ns("renewal", "sqlite_on"),
        median_ns("renewal", "sqlite_off"),
        0.95,
    );
    support::context_row(
        "renewal on vs off, memory: the cost alone",
        median_ns("renewal", "memory_on"),
        median_ns("renewal", "memory_off"),
        "nanoseconds per call, see the difference of the medians",
    );
    // The target compares 64 callers with the sequential fresh rate (`fresh/idem`); the ratio to
    // one caller in the concurrent harness (which adds a task and a join) is shown too.
    let sequential = median_ns("fresh", "idem");
    let one = median_ns("fresh_concurrent", "idem/1");
    for callers in [8, 64] {
        let target = if callers == 64 { 5.0 } else { 1.0 };
        let many = median_ns("fresh_concurrent", &format!("idem/{callers}"));
        row(
            &format!("fresh, {callers} callers vs sequential fresh"),
            many,
            sequential,
            target,
        );
        row(
            &format!("fresh, {callers} callers vs 1 caller"),
            many,
            one,
            target,
        );
    }
    row(
        "fresh, 64 callers vs the raw group-commit ceiling",
        median_ns("fresh_concurrent", "idem/64"),
        median_ns("fresh_concurrent", "raw_group_commit/64").map(|ns| ns / GROUP as f64),
        0.8,
    );
}

fn main() {
    let dir = bench_dir();
    let rt = runtime();
    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .configure_from_args();
    let mut alternated = Vec::new();
    replay(&mut c, &dir, &rt, &mut alternated);
    replay_working_set(&mut c, &dir, &rt, &mut alternated);
    fresh(&mut c, &dir, &rt, &mut alternated);
    fresh_concurrent(&mut c, &dir, &rt);
    group_commit(&mut c, &dir, &rt, &mut alternated);
    renewal(&mut c, &dir, &rt);
    c.final_summary();
    summary();
    support::alternated_summary("sqlite", "SQLite, ratio of rates", &alternated);
}
