//! idem on the shared stores, next to hand-written baselines on the same server in the same run.
//!
//! For each of Postgres (`IDEM_TEST_POSTGRES_URL`), Redis (`IDEM_TEST_REDIS_URL`) and Valkey
//! (`IDEM_TEST_VALKEY_URL`, where idem fences by the server's own compare-and-set):
//!
//! - `replay`: a retried call, with and without the in-process replay cache, vs one raw lookup
//!   (Postgres: a prepared point SELECT; Redis: GET), the check of the arguments' fingerprint it
//!   returns, deserialize;
//! - `fresh`: a new intent (claim, body, completion), vs the raw two writes a hand-written
//!   idempotency store needs (Postgres: INSERT … ON CONFLICT DO NOTHING, then UPDATE; Redis:
//!   SET NX PX, then SET PX);
//! - `fresh_concurrent`: fresh calls/s with 1, 8 and 64 callers, and the raw two writes with 1
//!   and 8 (how far the server itself scales on this machine);
//! - `transactional` (Postgres): a transactional tool inserting an order row (claim, INSERT and
//!   record in one commit) vs the same tool written non-transactionally (the claim, the same
//!   INSERT on a connection of its own, the completion: three commits);
//! - the replay with the cache off, the fresh call, and the speed-up from 1 to 8 callers over
//!   the raw writes' own again, timed in alternation with the baseline
//!   ([`support::alternating_in`], [`support::scaling`]), written to `alternating-shared.json`;
//!   on Redis and Valkey the speed-up over that of raw writes that fence their completion by a
//!   Lua compare-and-set, and on Valkey idem's 8 callers by the server's compare-and-set over
//!   the same by scripts (`fencing=script`).
//!
//! `cargo bench --bench shared` prints the ratios at the end; a backend whose variable is unset
//! is skipped with a note.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use idem::store::postgres::tokio_postgres::Transaction;
use idem::{Idem, idempotent};

mod raw;
#[path = "../support/mod.rs"]
mod support;

use raw::{Raw, RawPostgres, RawRedis};
use support::{
    Spread, alternated_summary, alternating_in, criterion_dir, median_ns, ratio_row,
    register_payment, runtime, scaling, wanted,
};

/// The ratios timed in alternation, by name (`alternating-shared.json`).
type Alternated = Vec<(String, Spread)>;

/// A tenant of this run only, so reruns against the same server never meet old records.
fn run_tenant() -> String {
    format!("bench-{}", uuid::Uuid::new_v4().simple())
}

/// Times `iters` calls of `call(n)`, one after the other, in a task of the runtime: where an
/// agent's tool calls run, and the same harness for idem and its baselines. `call` gets a number
/// never passed before in this process (for new keys).
fn sequential<F, Fut>(b: &mut criterion::Bencher<'_>, rt: &tokio::runtime::Runtime, call: F)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future + Send,
{
    static NEXT: AtomicU64 = AtomicU64::new(0);
    b.iter_custom(|iters| {
        let call = call.clone();
        rt.block_on(async move {
            tokio::spawn(async move {
                let start = Instant::now();
                for _ in 0..iters {
                    std::hint::black_box(call(NEXT.fetch_add(1, Ordering::Relaxed)).await);
                }
                start.elapsed()
            })
            .await
            .expect("task")
        })
    });
}

/// Like [`sequential`], but each timed call of `timed` follows an untimed call of `other`.
fn paired<T, TF, O, OF>(
    b: &mut criterion::Bencher<'_>,
    rt: &tokio::runtime::Runtime,
    timed: T,
    other: O,
) where
    T: Fn(u64) -> TF + Clone + Send + 'static,
    TF: Future<Output = ()> + Send,
    O: Fn(u64) -> OF + Clone + Send + 'static,
    OF: Future<Output = ()> + Send,
{
    static NEXT: AtomicU64 = AtomicU64::new(0);
    b.iter_custom(|iters| {
        let (timed, other) = (timed.clone(), other.clone());
        rt.block_on(async move {
            tokio::spawn(async move {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    other(NEXT.fetch_add(1, Ordering::Relaxed)).await;
                    let start = Instant::now();
                    timed(NEXT.fetch_add(1, Ordering::Relaxed)).await;
                    spent += start.elapsed();
                }
                spent
            })
            .await
            .expect("task")
        })
    });
}

fn replay<R: Raw>(
    c: &mut Criterion,
    backend: &str,
    url: &str,
    raw: &Arc<R>,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Alternated,
) {
    let mut group = c.benchmark_group(format!("{backend}_replay"));
    group.throughput(Throughput::Elements(1));
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    let call = || register_payment("run-1".into(), 7, "cus_42".into(), 500);
    let mut uncached = None;
    for (name, query) in [("idem", ""), ("idem_no_cache", "replay_cache=0")] {
        let url = with_option(url, query);
        let idem = rt.block_on(Idem::open(&url)).expect("open");
        let tenant = idem.scope(run_tenant());
        assert!(rt.block_on(tenant.run(call())).expect("call").is_fresh());
        if name == "idem_no_cache" {
            uncached = Some(tenant.clone());
        }
        group.bench_function(name, |b| {
            let tenant = tenant.clone();
            sequential(b, rt, move |_| {
                let tenant = tenant.clone();
                async move {
                    let out = tenant.run(call()).await.expect("call");
                    assert!(out.is_replayed());
                    out
                }
            })
        });
    }
    let raw = raw.clone();
    group.bench_function("raw_lookup", |b| {
        let raw = raw.clone();
        sequential(b, rt, move |_| {
            let raw = raw.clone();
            async move { raw.lookup().await }
        })
    });
    group.finish();
    if wanted(&format!("{backend}_replay")) {
        // A replay from another process (no cache) against the raw lookup, a round trip each.
        let uncached = uncached.expect("measured above");
        let ours = || async {
            let out = uncached.run(call()).await.expect("call");
            assert!(out.is_replayed());
        };
        let spread = alternating_in(rt, 101, 100, ours, || raw.lookup());
        alternated.push((format!("{backend}: replay, cache off"), spread));
    }
}

fn fresh<R: Raw>(
    c: &mut Criterion,
    backend: &str,
    url: &str,
    raw: &Arc<R>,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Alternated,
) {
    let mut group = c.benchmark_group(format!("{backend}_fresh"));
    group.throughput(Throughput::Elements(1));
    group.sample_size(30);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(6));
    let idem = rt.block_on(Idem::open(url)).expect("open");
    let tenant = idem.scope(run_tenant());
    let ours = move |step: u64| {
        let tenant = tenant.clone();
        async move {
            let out = tenant
                .run(register_payment("run-1".into(), step, "cus_42".into(), 500))
                .await
                .expect("call");
            assert!(out.is_fresh());
        }
    };
    let theirs = {
        let raw = raw.clone();
        move |n: u64| {
            let raw = raw.clone();
            async move { raw.two_writes(n).await }
        }
    };
    // Paired: each timed call follows one untimed call of the other side, so both sides are
    // measured under the same write load, table sizes and checkpoints (a server whose disk
    // latency drifts over a run would otherwise favour whichever side ran first).
    group.bench_function("idem", |b| paired(b, rt, ours.clone(), theirs.clone()));
    group.bench_function("raw_two_writes", |b| {
        paired(b, rt, theirs.clone(), ours.clone())
    });
    group.finish();
    if wanted(&format!("{backend}_fresh")) {
        // New numbers for both sides, far above the criterion benches' own.
        let next = AtomicU64::new(1 << 42);
        let step = || next.fetch_add(1, Ordering::Relaxed);
        let spread = alternating_in(rt, 51, 40, || ours(step()), || theirs(step()));
        alternated.push((format!("{backend}: fresh"), spread));
    }
}

/// On a Redis-compatible server: idem's speed-up from 1 to 8 callers over that of raw writes
/// that fence their completion as a server without `SET … IFEQ` must (a Lua compare-and-set).
fn fenced_scaling(
    backend: &str,
    url: &str,
    raw: &Arc<RawRedis>,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Alternated,
) {
    if !wanted(&format!("{backend}_fresh_concurrent")) {
        return;
    }
    let idem = rt.block_on(Idem::open(url)).expect("open");
    let tenant = idem.scope(run_tenant());
    let ours = move |step| {
        let tenant = tenant.clone();
        async move {
            let call = register_payment("run-3".into(), step, "cus_42".into(), 500);
            assert!(tenant.run(call).await.expect("call").is_fresh());
        }
    };
    let raw = raw.clone();
    let fenced = move |n: u64| {
        let raw = raw.clone();
        async move { raw.fenced_writes(n + (1 << 39)).await }
    };
    let spread = scaling(rt, 41, 320, 8, ours, fenced);
    alternated.push((
        format!("{backend}: 8 callers vs 1, over the raw fenced writes' own"),
        spread,
    ));
}

/// On a server with a native compare-and-set: idem's calls/s with 8 callers by it, over the
/// same by Lua scripts (`fencing=script`), on the same server, in alternation.
fn native_over_scripts(
    backend: &str,
    url: &str,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Alternated,
) {
    if !wanted(&format!("{backend}_fresh_concurrent")) {
        return;
    }
    let caller = |url: String| {
        let idem = rt.block_on(Idem::open(&url)).expect("open");
        let tenant = idem.scope(run_tenant());
        move |step| {
            let tenant = tenant.clone();
            async move {
                let call = register_payment("run-4".into(), step, "cus_42".into(), 500);
                assert!(tenant.run(call).await.expect("call").is_fresh());
            }
        }
    };
    let (native, scripts) = (
        caller(url.to_owned()),
        caller(with_option(url, "fencing=script")),
    );
    let next = Arc::new(AtomicU64::new(1 << 38));
    let spread = support::alternating_blocks(
        rt,
        31,
        400,
        |calls| support::among_callers(&native, 8, calls, &next),
        |calls| support::among_callers(&scripts, 8, calls, &next),
    );
    alternated.push((
        format!("{backend}: 8 callers, native compare-and-set over Lua scripts"),
        spread,
    ));
}

fn fresh_concurrent<R: Raw>(
    c: &mut Criterion,
    backend: &str,
    url: &str,
    raw: &Arc<R>,
    rt: &tokio::runtime::Runtime,
    alternated: &mut Alternated,
) {
    let idem = rt.block_on(Idem::open(url)).expect("open");
    let tenant = idem.scope(run_tenant());
    let group = format!("{backend}_fresh_concurrent");
    let measurement = Duration::from_secs(4);
    let ours = move |step| {
        let tenant = tenant.clone();
        async move {
            let call = register_payment("run-2".into(), step, "cus_42".into(), 500);
            assert!(tenant.run(call).await.expect("call").is_fresh());
        }
    };
    support::concurrent_callers(
        c,
        &group,
        "idem",
        &[1, 8, 64],
        measurement,
        rt,
        ours.clone(),
    );
    // Postgres spreads the raw callers over its connections (one each); Redis shares one
    // multiplexed connection, as idem does. Keys far above the other groups' numbers.
    let raw = raw.clone();
    let theirs = move |n: u64| {
        let raw = raw.clone();
        async move { raw.two_writes(n + (1 << 40)).await }
    };
    support::concurrent_callers(
        c,
        &group,
        "raw_two_writes",
        &[1, 8],
        measurement,
        rt,
        theirs.clone(),
    );
    if wanted(&group) {
        // idem's speed-up from 1 to 8 callers over the raw writes' own, each round's four
        // blocks milliseconds apart.
        let spread = scaling(rt, 41, 320, 8, ours, theirs);
        alternated.push((
            format!("{backend}: 8 callers vs 1, over the raw writes' own"),
            spread,
        ));
    }
}

/// The order table's own connection, for the tool written without a transaction: what its body
/// would hold (a pool of the application's, here one connection).
static ORDERS: std::sync::OnceLock<tokio_postgres::Client> = std::sync::OnceLock::new();

/// An order row in the transaction that also claims the key and records the result.
#[idempotent(key = "run_id, step", mutating, transactional, name = "bench.order_tx")]
async fn create_order_tx(
    tx: &mut Transaction<'_>,
    run_id: String,
    step: u64,
    item: String,
) -> Result<i64, tokio_postgres::Error> {
    let row = tx
        .query_one(
            "INSERT INTO bench_orders (item, step) VALUES ($1, $2) RETURNING id",
            &[&item, &(step as i64)],
        )
        .await?;
    Ok(row.get(0))
}

/// The same INSERT, written as an ordinary keyed tool: claim, the insert on the application's
/// own connection, completion.
#[idempotent(key = "run_id, step", mutating, name = "bench.order")]
async fn create_order(
    run_id: String,
    step: u64,
    item: String,
) -> Result<i64, tokio_postgres::Error> {
    let orders = ORDERS.get().expect("connected in main");
    let row = orders
        .query_one(
            "INSERT INTO bench_orders (item, step) VALUES ($1, $2) RETURNING id",
            &[&item, &(step as i64)],
        )
        .await?;
    Ok(row.get(0))
}

/// Transactional fresh calls vs the same tool without a transaction, paired as in [`fresh`].
fn transactional(c: &mut Criterion, url: &str, rt: &tokio::runtime::Runtime) {
    let mut group = c.benchmark_group("postgres_transactional");
    group.throughput(Throughput::Elements(1));
    group.sample_size(30);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(6));
    let idem = rt.block_on(Idem::open(url)).expect("open");
    let tenant = idem.scope(run_tenant());
    let atomic = {
        let tenant = tenant.clone();
        move |step: u64| {
            let tenant = tenant.clone();
            async move {
                let call = create_order_tx("run-1".into(), step, "tent".into());
                assert!(tenant.run(call).await.expect("call").is_fresh());
            }
        }
    };
    let three_commits = move |step: u64| {
        let tenant = tenant.clone();
        async move {
            let call = create_order("run-1".into(), step, "tent".into());
            assert!(tenant.run(call).await.expect("call").is_fresh());
        }
    };
    group.bench_function("idem_transactional", |b| {
        paired(b, rt, atomic.clone(), three_commits.clone())
    });
    group.bench_function("idem_three_commits", |b| {
        paired(b, rt, three_commits.clone(), atomic.clone())
    });
    group.finish();
}

fn with_option(url: &str, option: &str) -> String {
    match (option.is_empty(), url.contains('?')) {
        (true, _) => url.to_owned(),
        (false, true) => format!("{url}&{option}"),
        (false, false) => format!("{url}?{option}"),
    }
}

fn summary(backend: &str, label: &str) {
    let m = |group: &str, bench: &str| median_ns(&format!("{backend}_{group}"), bench);
    if m("fresh", "idem").is_none() {
        return;
    }
    println!("\nidem on {label}: calls/s (median), and the ratio to the baseline in this run");
    ratio_row(
        "replay: idem vs raw lookup + check + deserialize",
        m("replay", "idem"),
        m("replay", "raw_lookup"),
        0.8,
    );
    ratio_row(
        "replay, cache off: idem vs raw lookup",
        m("replay", "idem_no_cache"),
        m("replay", "raw_lookup"),
        0.8,
    );
    ratio_row(
        "fresh: idem vs raw two writes",
        m("fresh", "idem"),
        m("fresh", "raw_two_writes"),
        0.8,
    );
    if m("transactional", "idem_transactional").is_some() {
        ratio_row(
            "fresh order: transactional (one commit) vs claim + INSERT + completion",
            m("transactional", "idem_transactional"),
            m("transactional", "idem_three_commits"),
            1.0,
        );
    }
    // Against the paired sequential figure above, and against 1 caller of the same harness
    // (tasks on the runtime, nothing between calls): the second compares like with like. The
    // raw two writes in the same harness say how far the server itself scales here.
    let raw = |callers: u64| m("fresh_concurrent", &format!("raw_two_writes/{callers}"));
    support::context_row(
        "raw two writes, 8 callers vs 1 caller",
        raw(8),
        raw(1),
        "the server's own scaling",
    );
    for callers in [8, 64] {
        let many = m("fresh_concurrent", &format!("idem/{callers}"));
        ratio_row(
            &format!("fresh, {callers} callers vs sequential fresh"),
            many,
            m("fresh", "idem"),
            3.0,
        );
        ratio_row(
            &format!("fresh, {callers} callers vs 1 caller"),
            many,
            m("fresh_concurrent", "idem/1"),
            3.0,
        );
    }
}

fn main() {
    let rt = runtime();
    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .configure_from_args();
    let mut alternated = Alternated::new();
    let postgres = std::env::var("IDEM_TEST_POSTGRES_URL").ok();
    let redis = std::env::var("IDEM_TEST_REDIS_URL").ok();
    match &postgres {
        Some(url) => {
            // Both sides start from empty tables in schemas of this run, dropped at the end.
            let run = uuid::Uuid::new_v4().simple().to_string();
            let (ours, theirs) = (format!("idem_bench_{run}"), format!("idem_bench_raw_{run}"));
            let server = url.split('?').next().unwrap().to_owned();
            // Plain text on both sides: the raw baseline connects without TLS.
            let url = with_option(
                &with_option(url, "sslmode=disable"),
                &format!("schema={ours}"),
            );
            let raw = Arc::new(rt.block_on(RawPostgres::connect(&server, &theirs, 8)));
            replay(&mut c, "postgres", &url, &raw, &rt, &mut alternated);
            fresh(&mut c, "postgres", &url, &raw, &rt, &mut alternated);
            fresh_concurrent(&mut c, "postgres", &url, &raw, &rt, &mut alternated);
            // The order table beside idem's records; `search_path` lets the tools say
            // `bench_orders` on both connections.
            let path = format!("options=-csearch_path%3D{ours}");
            let (orders, connection) = rt
                .block_on(tokio_postgres::connect(
                    &with_option(&with_option(&server, "sslmode=disable"), &path),
                    tokio_postgres::NoTls,
                ))
                .expect("connect");
            rt.spawn(connection);
            rt.block_on(orders.batch_execute(
                "CREATE TABLE bench_orders (id bigserial PRIMARY KEY, item text NOT NULL, \
                 step bigint NOT NULL)",
            ))
            .expect("the orders table");
            assert!(ORDERS.set(orders).is_ok(), "connected once");
            transactional(&mut c, &with_option(&url, &path), &rt);
            rt.block_on(raw.connections[0].client.batch_execute(&format!(
                "DROP SCHEMA {ours} CASCADE; DROP SCHEMA {theirs} CASCADE"
            )))
            .expect("drop the run's schemas");
        }
        None => println!("skipped Postgres: set IDEM_TEST_POSTGRES_URL"),
    }
    // Redis 7 fences by Lua scripts; Valkey 9 by its own compare-and-set (`SET … IFEQ`).
    let valkey = std::env::var("IDEM_TEST_VALKEY_URL").ok();
    for (backend, label, url) in [("redis", "Redis", &redis), ("valkey", "Valkey", &valkey)] {
        let Some(url) = url else {
            println!(
                "skipped {label}: set IDEM_TEST_{}_URL",
                backend.to_uppercase()
            );
            continue;
        };
        // idem's records under a prefix of this run, deleted at the end with the raw keys.
        let prefix = format!("idem-bench-{}", uuid::Uuid::new_v4().simple());
        let raw = Arc::new(rt.block_on(RawRedis::connect(url)));
        let url = &with_option(url, &format!("prefix={prefix}"));
        replay(&mut c, backend, url, &raw, &rt, &mut alternated);
        fresh(&mut c, backend, url, &raw, &rt, &mut alternated);
        fresh_concurrent(&mut c, backend, url, &raw, &rt, &mut alternated);
        fenced_scaling(backend, url, &raw, &rt, &mut alternated);
        if backend == "valkey" {
            native_over_scripts(backend, url, &rt, &mut alternated);
        }
        let deleted = rt.block_on(async {
            raw.purge(&format!("{prefix}:*")).await
                + raw.purge(&format!("idem-bench-raw:{}:*", raw.tenant)).await
        });
        println!("deleted the run's {deleted} {label} keys");
    }
    c.final_summary();
    if postgres.is_some() {
        summary("postgres", "Postgres");
    }
    if redis.is_some() {
        summary("redis", "Redis");
    }
    if valkey.is_some() {
        summary("valkey", "Valkey");
    }
    alternated_summary("shared", "Postgres and Redis", &alternated);
}
