//! What the benchmarks share: where criterion writes, and the summary of ratios it prints.

#![allow(dead_code)] // each bench uses a part of it

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::idempotent;
use serde::{Deserialize, Serialize};

pub mod raw_sqlite;

/// What the benchmarked tool returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payment {
    pub payment_id: String,
    pub customer: String,
    pub amount_cents: u64,
}

/// The benchmarked tool: the seeds' `register_payment`, with no effect of its own.
#[idempotent(key = "run_id, step_id", mutating, name = "bench.register_payment")]
pub async fn register_payment(
    run_id: String,
    step_id: u64,
    customer: String,
    amount_cents: u64,
) -> Result<Payment, Infallible> {
    Ok(Payment {
        payment_id: format!("pay_{run_id}_{step_id}"),
        customer,
        amount_cents,
    })
}

/// A key as a hand-written store would make it: hashed, so rows land at random B-tree positions.
pub fn raw_key(tenant: &str, n: u64) -> [u8; 32] {
    *idem::derive_key(tenant, "raw", &[idem::key::KeyPart::new(&n).expect("part")]).as_bytes()
}

/// The arguments of one `register_payment` call, as a hand-written store receives them.
#[derive(Serialize)]
pub struct RawArgs<'a> {
    pub run_id: &'a str,
    pub step_id: u64,
    pub customer: &'a str,
    pub amount_cents: u64,
}

impl<'a> RawArgs<'a> {
    /// The benchmarks' call of step `n` in run `run_id`.
    pub fn payment(run_id: &'a str, step_id: u64) -> Self {
        RawArgs {
            run_id,
            step_id,
            customer: "cus_42",
            amount_cents: 500,
        }
    }

    /// The fingerprint a hand-written store keeps beside a result and checks at a retry, so
    /// that a retry with other arguments is refused, as idem refuses it: SHA-256 of their JSON.
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::Digest as _;
        sha2::Sha256::digest(serde_json::to_vec(self).expect("json")).into()
    }

    /// The check of a retry against the stored fingerprint, then the stored result decoded: what
    /// a hand-written store does with the row it read.
    pub fn replay(&self, stored_fingerprint: &[u8], result: &[u8]) -> Payment {
        assert!(
            stored_fingerprint == self.fingerprint(),
            "the raw baseline's retry carries other arguments"
        );
        serde_json::from_slice(result).expect("decode")
    }
}

/// The JSON a raw baseline stores for step `n`, the same value idem stores.
pub fn payment_json(n: u64) -> Vec<u8> {
    serde_json::to_vec(&Payment {
        payment_id: format!("pay_run-1_{n}"),
        customer: "cus_42".into(),
        amount_cents: 500,
    })
    .expect("json")
}

/// Criterion's output, under the target directory.
pub fn criterion_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("criterion")
}

/// A multi-threaded runtime with two workers, as on a small agent host.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Median time per iteration (ns) that criterion estimated for `group/bench`. The median, not
/// the mean: on a shared machine a few slow `fsync`s skew a mean.
pub fn median_ns(group: &str, bench: &str) -> Option<f64> {
    let path = criterion_dir()
        .join(group)
        .join(bench)
        .join("new/estimates.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

/// Prints one line: our rate, the baseline's, their ratio and whether it meets `target`.
pub fn ratio_row(label: &str, ours: Option<f64>, base: Option<f64>, target: f64) {
    row(label, ours, base, |ratio| {
        let verdict = if ratio >= target { "meets" } else { "MISSES" };
        format!("{verdict} target {target}")
    });
}

/// Prints one line like [`ratio_row`], for a ratio that only gives context (no target).
pub fn context_row(label: &str, ours: Option<f64>, base: Option<f64>, note: &str) {
    row(label, ours, base, |_| note.to_owned());
}

/// One line of the summary: two rates (from median ns per call), their ratio, and what `say`
/// makes of the ratio. Nothing when either median is missing.
fn row(label: &str, ours: Option<f64>, base: Option<f64>, say: impl Fn(f64) -> String) {
    let per_s = |ns: f64| 1e9 / ns;
    if let (Some(o), Some(b)) = (ours, base) {
        let ratio = per_s(o) / per_s(b);
        println!(
            "  {label:<48} {:>10.0} /s vs {:>10.0} /s  ratio {ratio:.2} ({})",
            per_s(o),
            per_s(b),
            say(ratio)
        );
    }
}

/// Benchmarks `call(n)` (with `n` never passed before) made by each number of concurrent
/// `callers`, as `group/name/{callers}`, measuring each for `measurement`; `iters` calls are split
/// among the callers.
#[allow(clippy::too_many_arguments)]
pub fn concurrent_callers<F, Fut>(
    c: &mut criterion::Criterion,
    group: &str,
    name: &str,
    callers: &[u64],
    measurement: std::time::Duration,
    rt: &tokio::runtime::Runtime,
    call: F,
) where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let mut group = c.benchmark_group(group);
    group.throughput(criterion::Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(measurement);
    let next = Arc::new(AtomicU64::new(0));
    for &callers in callers {
        group.bench_with_input(
            criterion::BenchmarkId::new(name, callers),
            &callers,
            |b, &callers| {
                b.to_async(rt).iter_custom(|iters| {
                    let (call, next) = (call.clone(), next.clone());
                    async move { among_callers(&call, callers, iters, &next).await }
                })
            },
        );
    }
    group.finish();
}

/// Makes `calls` calls of `call`, shared among `callers` concurrent tasks on the runtime (the
/// first `calls % callers` make one more), each call with the next number of `next`; how long
/// they took, all of them.
pub async fn among_callers<F, Fut>(
    call: &F,
    callers: u64,
    calls: u64,
    next: &Arc<AtomicU64>,
) -> Duration
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let calls = calls / callers + u64::from(caller < calls % callers);
        let (call, next) = (call.clone(), next.clone());
        tasks.spawn(async move {
            for _ in 0..calls {
                call(next.fetch_add(1, Ordering::Relaxed)).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task");
    }
    start.elapsed()
}

/// Rounds of an [`alternating`] measurement, and calls per side in each round.
pub const ROUNDS: usize = 201;
pub const BLOCK: usize = 400;

/// The median of the ratios of an [`alternating`] measurement, and its quartiles.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    /// Rounds measured, each giving one ratio.
    pub rounds: usize,
    /// Calls of each side in a round.
    pub block: usize,
    pub median: f64,
    pub low_quartile: f64,
    pub high_quartile: f64,
}

/// `ours`'s rate over `theirs`'s, measured in alternation: [`ROUNDS`] rounds, each timing
/// [`BLOCK`] calls of one side and then [`BLOCK`] of the other (which side goes first
/// alternates), each round giving one ratio. Both halves of a round run within a few
/// milliseconds of each other, so the machine's drift over a run (a quarter from one minute to
/// the next on a shared VM) stays out of the ratio; between two criterion benches measured
/// seconds apart, it does not.
pub fn alternating<A, AF, B, BF>(rt: &tokio::runtime::Runtime, ours: A, theirs: B) -> Spread
where
    A: FnMut() -> AF,
    AF: Future,
    B: FnMut() -> BF,
    BF: Future,
{
    alternating_in(rt, ROUNDS, BLOCK, ours, theirs)
}

/// [`alternating`], in `rounds` rounds of `block` calls a side: for calls too slow for the
/// defaults (a store round trip, a commit).
pub fn alternating_in<A, AF, B, BF>(
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    block: usize,
    mut ours: A,
    mut theirs: B,
) -> Spread
where
    A: FnMut() -> AF,
    AF: Future,
    B: FnMut() -> BF,
    BF: Future,
{
    async fn timed<F: FnMut() -> Fut, Fut: Future>(call: &mut F, block: usize) -> Duration {
        let start = Instant::now();
        for _ in 0..block {
            std::hint::black_box(call().await);
        }
        start.elapsed()
    }
    let ratios = rt.block_on(async {
        // One round unmeasured, to warm both sides.
        timed(&mut ours, block).await;
        timed(&mut theirs, block).await;
        let mut ratios = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let (ours_took, theirs_took) = if round % 2 == 0 {
                let o = timed(&mut ours, block).await;
                (o, timed(&mut theirs, block).await)
            } else {
                let t = timed(&mut theirs, block).await;
                (timed(&mut ours, block).await, t)
            };
            ratios.push(theirs_took.as_secs_f64() / ours_took.as_secs_f64());
        }
        ratios
    });
    spread(ratios, block)
}

/// `ours`'s rate over `theirs`'s in alternation, as [`alternating_in`], where each side times
/// its own block: `ours(block)` makes `block` calls however it makes them (among concurrent
/// callers, in a batch of one transaction) and answers how long they took.
pub fn alternating_blocks<A, AF, B, BF>(
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    block: usize,
    mut ours: A,
    mut theirs: B,
) -> Spread
where
    A: FnMut(u64) -> AF,
    AF: Future<Output = Duration>,
    B: FnMut(u64) -> BF,
    BF: Future<Output = Duration>,
{
    let calls = block as u64;
    let ratios = rt.block_on(async {
        ours(calls).await;
        theirs(calls).await;
        let mut ratios = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let (o, t) = if round % 2 == 0 {
                let o = ours(calls).await;
                (o, theirs(calls).await)
            } else {
                let t = theirs(calls).await;
                (ours(calls).await, t)
            };
            ratios.push(t.as_secs_f64() / o.as_secs_f64());
        }
        ratios
    });
    spread(ratios, block)
}

/// How idem's calls scale from 1 caller to `callers` concurrent callers, over how the
/// baseline's scale on the same server, timed in alternation: each of `rounds` rounds times
/// `block` calls of idem with 1 caller and with `callers` callers (tasks on the runtime), then the
/// same of the baseline (which side goes first alternates), and gives one ratio of the two
/// speed-ups. `call(n)` gets a number never passed before.
pub fn scaling<A, AF, B, BF>(
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    block: usize,
    callers: usize,
    ours: A,
    theirs: B,
) -> Spread
where
    A: Fn(u64) -> AF + Clone + Send + Sync + 'static,
    AF: Future<Output = ()> + Send,
    B: Fn(u64) -> BF + Clone + Send + Sync + 'static,
    BF: Future<Output = ()> + Send,
{
    /// The speed-up from 1 caller to `callers`: the ratio of the two blocks' times.
    async fn speedup<F, Fut>(call: &F, callers: usize, block: usize, next: &Arc<AtomicU64>) -> f64
    where
        F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let alone = among_callers(call, 1, block as u64, next).await;
        alone.as_secs_f64()
            / among_callers(call, callers as u64, block as u64, next)
                .await
                .as_secs_f64()
    }
    let next = Arc::new(AtomicU64::new(1 << 41));
    let ratios = rt.block_on(async {
        speedup(&ours, callers, block, &next).await;
        speedup(&theirs, callers, block, &next).await;
        let mut ratios = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let (o, t) = if round % 2 == 0 {
                let o = speedup(&ours, callers, block, &next).await;
                (o, speedup(&theirs, callers, block, &next).await)
            } else {
                let t = speedup(&theirs, callers, block, &next).await;
                (speedup(&ours, callers, block, &next).await, t)
            };
            ratios.push(o / t);
        }
        ratios
    });
    spread(ratios, block)
}

/// The median and quartiles of `ratios`, one for each round of `block` calls.
fn spread(mut ratios: Vec<f64>, block: usize) -> Spread {
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    Spread {
        rounds: n,
        block,
        median: ratios[n / 2],
        low_quartile: ratios[n / 4],
        high_quartile: ratios[n * 3 / 4],
    }
}

/// Prints the ratios `bench` timed in alternation under `title`, and writes them to
/// `alternating-{bench}.json` beside criterion's output, for bench-report. Nothing when none ran.
pub fn alternated_summary<N: AsRef<str>>(bench: &str, title: &str, alternated: &[(N, Spread)]) {
    if alternated.is_empty() {
        return;
    }
    println!("\n{title}, timed in alternation: median, quartiles (rounds × calls a side)");
    for (name, s) in alternated {
        println!(
            "  {:<56} {:.2} ({:.2}–{:.2}) ({} × {})",
            name.as_ref(),
            s.median,
            s.low_quartile,
            s.high_quartile,
            s.rounds,
            s.block
        );
    }
    let json: Vec<serde_json::Value> = alternated
        .iter()
        .map(|(name, s)| {
            serde_json::json!({
                "name": name.as_ref(),
                "rounds": s.rounds,
                "block": s.block,
                "median": s.median,
                "low_quartile": s.low_quartile,
                "high_quartile": s.high_quartile,
            })
        })
        .collect();
    write_json(
        &format!("alternating-{bench}.json"),
        &serde_json::Value::Array(json),
    );
}

/// Whether the command line's filter (criterion's: a substring of the bench's name) lets the
/// group `name` run; no filter lets every group run.
pub fn wanted(name: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

/// The median of `values` (the upper one of an even count), for the benches that time rounds
/// themselves.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The stores a bench runs against, by name and URL: a SQLite file `file` in a new temporary
/// folder (kept while the returned guard lives), then Postgres and Redis when
/// `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_REDIS_URL` name them (said on stdout when they do not).
pub fn stores(bench: &str, file: &str) -> (tempfile::TempDir, Vec<(&'static str, String)>) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mut stores = vec![(
        "SQLite",
        format!("sqlite://{}", dir.path().join(file).display()),
    )];
    for (name, var) in [
        ("Postgres", "IDEM_TEST_POSTGRES_URL"),
        ("Redis", "IDEM_TEST_REDIS_URL"),
    ] {
        match std::env::var(var) {
            Ok(url) => stores.push((name, url)),
            Err(_) => println!("{bench}: {name} skipped ({var} is unset)"),
        }
    }
    (dir, stores)
}

/// Writes `json` as `name` beside criterion's results, where `bench-report` reads it.
pub fn write_json(name: &str, json: &serde_json::Value) {
    let out = criterion_dir();
    std::fs::create_dir_all(&out).expect("the results folder");
    std::fs::write(
        out.join(name),
        serde_json::to_vec_pretty(json).expect("json"),
    )
    .expect("write the results");
}

/// What a [`Counted`] store was asked: every call (each a round trip), and the claims alone.
#[derive(Debug, Default)]
pub struct Counts {
    pub calls: AtomicU64,
    pub claims: AtomicU64,
}

/// A store that counts what is sent through it into its [`Counts`], and forwards everything.
pub struct Counted {
    pub inner: Arc<dyn idem::store::Store>,
    pub counts: Arc<Counts>,
}

impl Counted {
    fn call(&self) {
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
    }
}

mod counted {
    use std::sync::atomic::Ordering;

    use idem::IdempotencyKey;
    use idem::store::{
        BatchClaim, BatchRenewal, BatchSettlement, ChunkAppend, ChunkRead, Claim, ClaimRequest,
        Completion, Fenced, FencingToken, Record, Renewal, Store, StoreFuture, StoreHealth,
        StreamPage, UnixMillis, Watch,
    };

    use super::Counted;

    impl Store for Counted {
        fn backend(&self) -> &'static str {
            self.inner.backend()
        }
        fn result_limit(&self) -> usize {
            self.inner.result_limit()
        }
        fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
            self.call();
            self.counts.claims.fetch_add(1, Ordering::Relaxed);
            self.inner.claim(req)
        }
        fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
            self.call();
            self.inner.complete(c)
        }
        fn claim_batch<'a>(&'a self, b: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
            self.call();
            self.inner.claim_batch(b)
        }
        fn settle_batch<'a>(&'a self, b: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
            self.call();
            self.inner.settle_batch(b)
        }
        fn renew_batch<'a>(&'a self, b: BatchRenewal<'a>) -> StoreFuture<'a, Vec<Fenced>> {
            self.call();
            self.inner.renew_batch(b)
        }
        fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
            self.call();
            self.inner.renew(r)
        }
        fn append_chunks<'a>(&'a self, a: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
            self.call();
            self.inner.append_chunks(a)
        }
        fn read_chunks<'a>(&'a self, r: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
            self.call();
            self.inner.read_chunks(r)
        }
        fn release<'a>(
            &'a self,
            tenant: &'a str,
            key: IdempotencyKey,
            token: FencingToken,
        ) -> StoreFuture<'a, Fenced> {
            self.call();
            self.inner.release(tenant, key, token)
        }
        fn lookup<'a>(
            &'a self,
            tenant: &'a str,
            key: IdempotencyKey,
        ) -> StoreFuture<'a, Option<Record>> {
            self.call();
            self.inner.lookup(tenant, key)
        }
        fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
            self.inner.purge_expired(now, limit)
        }
        fn health(&self) -> StoreFuture<'_, StoreHealth> {
            self.inner.health()
        }
        fn watch<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
            self.inner.watch(tenant, key)
        }
    }
}
