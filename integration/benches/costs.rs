//! Where a fresh call's or a replay's time goes when callers saturate the machine: for each
//! variant, the calls/s, and the CPU a call costs this process (`/proc/self/stat`) and, on a
//! Redis-compatible server, the server (`INFO cpu`). Three rounds of each variant, in turn.
//!
//! - `COSTS_URL=redis://…` (Redis or Valkey): 8 callers (`COSTS_CALLERS`) making
//!   `COSTS_CALLS` (default 40,000) calls each round with `raw` (`SET NX PX`, then `SET PX`),
//!   `fenced` (the same, the completion a Lua compare-and-set), `idem` (the store's default
//!   fencing: the server's compare-and-set where it has one) and `idem-scripts`
//!   (`fencing=script`), and replays: `lookup` (the raw `GET`, the check of the fingerprint it
//!   returns, deserialize), `lookup-tagged` (the same `GET` in a pipeline with an `ECHO` tag, as
//!   idem sends each request) and `replay` (idem's replay of one call with the replay cache off);
//!   `COSTS_VARIANTS=raw,idem` picks some.
//! - `COSTS_SQLITE=PATH`: 64 callers of idem on a SQLite file, against the raw group-commit
//!   ceiling on `PATH.raw` (64 calls' claims in one transaction, their completions in another);
//!   `COSTS_SIDE=idem` or `raw` runs one side alone.
//!
//! Not run by bench-report: `cargo bench -p idem-integration --bench costs --features
//! postgres,redis` with one of the variables set. `perf record` and `strace -c -f` on its
//! binary tell the rest.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use idem::Idem;

#[path = "shared/raw.rs"]
#[allow(dead_code)] // the Postgres baseline is not used here
mod raw;
#[path = "support/mod.rs"]
mod support;

use raw::{Raw, RawRedis};
use support::raw_sqlite::{self, GROUP};
use support::{among_callers, register_payment, runtime};

/// A tenant of this run only.
fn run_tenant() -> String {
    format!("bench-{}", uuid::Uuid::new_v4().simple())
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map_or(default, |v| v.parse().expect("a number"))
}

/// The CPU time this process used so far, in seconds (utime + stime of `/proc/self/stat`).
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("a stat line")
        .1
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields[i].parse::<f64>().expect("ticks");
    (ticks(11) + ticks(12)) / 100.0
}

/// The CPU time the server used so far, in seconds (`used_cpu_sys` + `used_cpu_user`).
async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            matches!(name, "used_cpu_sys" | "used_cpu_user").then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn main() {
    if let Ok(path) = std::env::var("COSTS_SQLITE") {
        return sqlite(&path);
    }
    let Ok(url) = std::env::var("COSTS_URL") else {
        println!("set COSTS_URL (a Redis or Valkey server) or COSTS_SQLITE (a file)");
        return;
    };
    let calls = setting("COSTS_CALLS", 40_000);
    let callers = setting("COSTS_CALLERS", 8);
    let rt = runtime();
    let raw = Arc::new(rt.block_on(RawRedis::connect(&url)));
    let mut info = rt.block_on(async {
        redis::Client::open(url.as_str())
            .expect("a URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    });
    // idem's records under a prefix of this run, deleted at the end with the raw keys.
    let prefix = format!("costs-{}", uuid::Uuid::new_v4().simple());
    let scope_with = |options: &str| {
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!(
            "{url}{sep}prefix={prefix}-{}&{options}",
            options.replace(['=', '&'], "-")
        );
        rt.block_on(Idem::open(&url))
            .expect("open")
            .scope(run_tenant())
    };
    let (native, scripts) = (scope_with("fencing=auto"), scope_with("fencing=script"));
    // The call the `replay` variant repeats, made once.
    let uncached = scope_with("replay_cache=0");
    let replayed = || register_payment("run".into(), 7, "cus".into(), 500);
    assert!(
        rt.block_on(uncached.run(replayed()))
            .expect("call")
            .is_fresh()
    );
    let variants: Vec<String> = std::env::var("COSTS_VARIANTS")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_else(|_| {
            [
                "raw",
                "fenced",
                "idem",
                "idem-scripts",
                "lookup",
                "lookup-tagged",
                "replay",
            ]
            .map(str::to_owned)
            .to_vec()
        });
    let next = Arc::new(AtomicU64::new(1 << 44));
    for round in 0..3 {
        for variant in &variants {
            let (raw, next) = (raw.clone(), next.clone());
            let scope = match variant.as_str() {
                "idem-scripts" => scripts.clone(),
                "replay" => uncached.clone(),
                _ => native.clone(),
            };
            let (took, client, server) = rt.block_on(async {
                let (server_before, client_before) = (server_cpu(&mut info).await, own_cpu());
                let start = Instant::now();
                match variant.as_str() {
                    "raw" => {
                        let call = move |n| {
                            let raw = raw.clone();
                            async move { raw.two_writes(n).await }
                        };
                        among_callers(&call, callers, calls, &next).await
                    }
                    "fenced" => {
                        let call = move |n| {
                            let raw = raw.clone();
                            async move { raw.fenced_writes(n).await }
                        };
                        among_callers(&call, callers, calls, &next).await
                    }
                    "idem" | "idem-scripts" => {
                        let call = move |n| {
                            let scope = scope.clone();
                            async move {
                                let call = register_payment("run".into(), n, "cus".into(), 500);
                                assert!(scope.run(call).await.expect("call").is_fresh());
                            }
                        };
                        among_callers(&call, callers, calls, &next).await
                    }
                    "lookup" => {
                        let call = move |_| {
                            let raw = raw.clone();
                            async move {
                                std::hint::black_box(raw.lookup().await);
                            }
                        };
                        among_callers(&call, callers, calls, &next).await
                    }
                    "lookup-tagged" => {
                        let call = move |n| {
                            let raw = raw.clone();
                            async move {
                                std::hint::black_box(raw.lookup_tagged(n).await);
                            }
                        };
                        among_callers(&call, callers, calls, &next).await
                    }
                    "replay" => {
                        let call = move |_| {
                            let scope = scope.clone();
                            async move {
                                let out = scope.run(replayed()).await.expect("call");
                                assert!(out.is_replayed());
                            }
                        };
                        among_callers(&call, callers, calls, &next).await
                    }
                    other => panic!("unknown variant `{other}`"),
                };
                let took = start.elapsed().as_secs_f64();
                let client = own_cpu() - client_before;
                (took, client, server_cpu(&mut info).await - server_before)
            });
            let per_call = |seconds: f64| seconds / calls as f64 * 1e6;
            println!(
                "round {round} {variant:>13}: {:>7.0} calls/s, client {:>5.1} µs, server {:>5.1} µs a call",
                calls as f64 / took,
                per_call(client),
                per_call(server)
            );
        }
    }
    // A server left holding hundreds of thousands of records answers every later scan (the
    // tests' `idem list`, blob usage) more slowly.
    let deleted = rt.block_on(async {
        raw.purge(&format!("{prefix}-*")).await
            + raw.purge(&format!("idem-bench-raw:{}:*", raw.tenant)).await
    });
    println!("deleted the run's {deleted} keys");
}

/// 64 callers of idem on SQLite against the raw group-commit ceiling, in turn.
fn sqlite(path: &str) {
    let calls = setting("COSTS_CALLS", 20_000) / GROUP * GROUP;
    let rt = runtime();
    let scope = rt
        .block_on(Idem::open(&format!("sqlite://{path}")))
        .expect("open")
        .scope("tenant-a");
    let raw = raw_sqlite::connection(std::path::Path::new(&format!("{path}.raw")));
    let next = Arc::new(AtomicU64::new(0));
    // `COSTS_SIDE=idem` or `raw`: one side alone (for `strace -c` of its system calls).
    let side = std::env::var("COSTS_SIDE").unwrap_or_default();
    for round in 0..3u64 {
        let scope = scope.clone();
        if side == "raw" {
            for group in 0..calls / GROUP {
                raw_sqlite::group_commit(&raw, (round << 32) + group * GROUP);
            }
            continue;
        }
        let ours = rt.block_on(async {
            let start = Instant::now();
            let call = move |n| {
                let scope = scope.clone();
                async move {
                    let call = register_payment("run".into(), n, "cus".into(), 500);
                    assert!(scope.run(call).await.expect("call").is_fresh());
                }
            };
            among_callers(&call, GROUP, calls, &next).await;
            start.elapsed().as_secs_f64()
        });
        if side == "idem" {
            continue;
        }
        let start = Instant::now();
        for group in 0..calls / GROUP {
            raw_sqlite::group_commit(&raw, (round << 32) + group * GROUP);
        }
        let theirs = start.elapsed().as_secs_f64();
        println!(
            "round {round}: idem, 64 callers {:>7.0} calls/s; raw group commit {:>7.0} calls/s; ratio {:.2}",
            calls as f64 / ours,
            calls as f64 / theirs,
            theirs / ours
        );
    }
}
