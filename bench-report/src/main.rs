//! Collects idem's criterion results into `guide/src/benchmarks/results.md` (tables: each path next to its
//! raw-store baseline from the same run, concurrency 1/8/64, the HTTP layer) and
//! `guide/src/benchmarks/chart.svg` (calls/s against concurrent callers, per backend).
//!
//! ```text
//! cargo run -p bench-report -- --run     # runs `cargo bench` for sqlite, shared, http, wait, batch, stream, large, then writes
//! cargo run -p bench-report              # writes from the results of an earlier `cargo bench`
//! ```
//!
//! The Postgres and Redis rows need `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_REDIS_URL` when the
//! benches run; a backend with no results is left out and says so.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use plotters::prelude::*;

const CALLERS: [u64; 3] = [1, 8, 64];

/// The criterion results of one run.
struct Results {
    dir: PathBuf,
}

impl Results {
    /// Median nanoseconds per call of `group/bench`.
    fn median(&self, group: &str, bench: &str) -> Option<f64> {
        let path = self.dir.join(group).join(bench).join("new/estimates.json");
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        json["median"]["point_estimate"].as_f64()
    }

    fn per_second(&self, group: &str, bench: &str) -> Option<f64> {
        self.median(group, bench).map(|ns| 1e9 / ns)
    }

    /// The figures of the `batch` bench (`batch.json`), one object per store.
    fn batches(&self) -> Option<Vec<serde_json::Value>> {
        serde_json::from_slice(&std::fs::read(self.dir.join("batch.json")).ok()?).ok()
    }

    /// The figures of the `stream` bench (`stream.json`), one object per store.
    fn streams(&self) -> Option<Vec<serde_json::Value>> {
        serde_json::from_slice(&std::fs::read(self.dir.join("stream.json")).ok()?).ok()
    }

    /// The figures of the `large` bench (`large.json`), one object per store.
    fn large(&self) -> Option<Vec<serde_json::Value>> {
        serde_json::from_slice(&std::fs::read(self.dir.join("large.json")).ok()?).ok()
    }

    /// The figures of the `wait` bench (`wait.json`), one object per store.
    fn waits(&self) -> Option<Vec<serde_json::Value>> {
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.dir.join("wait.json")).ok()?).ok()?;
        json.as_array().cloned()
    }

    /// The ratios the bench `bench` timed in alternation (`alternating-{bench}.json`), in its
    /// order.
    fn alternated(&self, bench: &str) -> Option<Vec<(String, Spread)>> {
        let text = std::fs::read(self.dir.join(format!("alternating-{bench}.json"))).ok()?;
        let json: serde_json::Value = serde_json::from_slice(&text).ok()?;
        let spread = |v: &serde_json::Value| {
            Some(Spread {
                rounds: v["rounds"].as_u64()?,
                block: v["block"].as_u64()?,
                median: v["median"].as_f64()?,
                low_quartile: v["low_quartile"].as_f64()?,
                high_quartile: v["high_quartile"].as_f64()?,
            })
        };
        json.as_array()?
            .iter()
            .map(|v| Some((v["name"].as_str()?.to_owned(), spread(v)?)))
            .collect()
    }
}

/// One ratio timed in alternation: `rounds` rounds of `block` calls a side, the median ratio
/// over the rounds, and the quartiles.
struct Spread {
    rounds: u64,
    block: u64,
    median: f64,
    low_quartile: f64,
    high_quartile: f64,
}

/// A backend's groups and benches in the criterion output.
struct Backend {
    name: &'static str,
    replay: &'static str,
    fresh: &'static str,
    concurrent: &'static str,
    raw_replay: &'static str,
    raw_fresh: &'static str,
    raw_replay_label: &'static str,
    raw_fresh_label: &'static str,
}

const BACKENDS: [Backend; 4] = [
    Backend {
        name: "SQLite",
        replay: "replay",
        fresh: "fresh",
        concurrent: "fresh_concurrent",
        raw_replay: "raw_select",
        raw_fresh: "raw_insert_update",
        raw_replay_label: "SELECT + fingerprint check + deserialize",
        raw_fresh_label: "INSERT + UPDATE, same durability",
    },
    Backend {
        name: "Postgres",
        replay: "postgres_replay",
        fresh: "postgres_fresh",
        concurrent: "postgres_fresh_concurrent",
        raw_replay: "raw_lookup",
        raw_fresh: "raw_two_writes",
        raw_replay_label: "SELECT + fingerprint check + deserialize",
        raw_fresh_label: "INSERT … ON CONFLICT, then UPDATE",
    },
    Backend {
        name: "Redis",
        replay: "redis_replay",
        fresh: "redis_fresh",
        concurrent: "redis_fresh_concurrent",
        raw_replay: "raw_lookup",
        raw_fresh: "raw_two_writes",
        raw_replay_label: "GET + fingerprint check + deserialize",
        raw_fresh_label: "SET NX PX, then SET",
    },
    Backend {
        name: "Valkey",
        replay: "valkey_replay",
        fresh: "valkey_fresh",
        concurrent: "valkey_fresh_concurrent",
        raw_replay: "raw_lookup",
        raw_fresh: "raw_two_writes",
        raw_replay_label: "GET + fingerprint check + deserialize",
        raw_fresh_label: "SET NX PX, then SET",
    },
];

fn rate(x: Option<f64>) -> String {
    x.map_or("—".into(), |v| format!("{v:.0}"))
}

fn ratio(ours: Option<f64>, base: Option<f64>) -> String {
    match (ours, base) {
        (Some(o), Some(b)) => format!("{:.2}×", o / b),
        _ => "—".into(),
    }
}

/// Today's date (UTC), from the system clock.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Howard Hinnant's civil-from-days.
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// What this machine is, as far as the report needs.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or("unknown memory".into(), |kb| {
            format!("{} GiB", kb / (1024 * 1024))
        });
    format!(
        "{cpu}, {cores} vCPU, {memory}, {} {}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

fn markdown(results: &Results) -> String {
    let mut out = String::from("# Benchmarks\n\n");
    out.push_str(&format!(
        "Measured on {} ({}), with criterion; each figure is a median, and every ratio compares two \
         figures of the same run on the same server. Generated by `cargo run -p bench-report -- --run`.\n\n",
        today(),
        machine()
    ));
    out.push_str("## Each call next to a raw store doing the same writes\n\n");
    out.push_str("| backend | path | idem calls/s | raw baseline | baseline calls/s | ratio |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    let mut missing = Vec::new();
    for b in &BACKENDS {
        if results.median(b.fresh, "idem").is_none() {
            missing.push(b.name);
            continue;
        }
        let rows = [
            (
                "replay",
                results.per_second(b.replay, "idem"),
                b.raw_replay_label,
                results.per_second(b.replay, b.raw_replay),
            ),
            (
                "replay, cache off",
                results.per_second(b.replay, "idem_no_cache"),
                b.raw_replay_label,
                results.per_second(b.replay, b.raw_replay),
            ),
            (
                "fresh",
                results.per_second(b.fresh, "idem"),
                b.raw_fresh_label,
                results.per_second(b.fresh, b.raw_fresh),
            ),
        ];
        for (path, ours, label, base) in rows {
            out.push_str(&format!(
                "| {} | {path} | {} | {label} | {} | {} |\n",
                b.name,
                rate(ours),
                rate(base),
                ratio(ours, base)
            ));
        }
    }
    if results
        .median("replay_working_set", "raw_select/1000")
        .is_some()
    {
        out.push_str("\n## Replays over a working set larger than the replay cache\n\n");
        out.push_str(
            "SQLite, replays cycling over the intents just completed (an agent fleet retrying its \
             recent steps), with a 100 KiB replay cache (about 360 of these records) and with \
             none, next to the raw SELECT + fingerprint check + deserialize over the same cycle.\n\n",
        );
        out.push_str(
            "| intents | idem, cache on | idem, cache off | raw SELECT | on vs raw | off vs raw | on vs off |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for size in [1000, 4000] {
            let at =
                |bench: &str| results.per_second("replay_working_set", &format!("{bench}/{size}"));
            let (on, off, raw) = (at("idem"), at("idem_no_cache"), at("raw_select"));
            out.push_str(&format!(
                "| {size} | {} | {} | {} | {} | {} | {} |\n",
                rate(on),
                rate(off),
                rate(raw),
                ratio(on, raw),
                ratio(off, raw),
                ratio(on, off),
            ));
        }
    }
    let sqlite = results.alternated("sqlite").unwrap_or_default();
    let shared = results.alternated("shared").unwrap_or_default();
    if !sqlite.is_empty() || !shared.is_empty() {
        out.push_str("\n## Ratios timed in alternation\n\n");
        out.push_str(
            "The ratios above again, measured so that the machine's drift stays out of them: \
             rounds of a block of calls of idem and the same of its baseline one after the other \
             (which side goes first alternates), each round giving one ratio of the two rates; \
             the median over the rounds and its quartiles. Two criterion benches run seconds \
             apart, and this machine's speed varies by a quarter from one minute to the next; \
             the two halves of a round run milliseconds apart. The scaling rows time four blocks \
             a round (idem with 1 caller and with 8, the raw writes with 1 and with 8) and give \
             idem's speed-up over the raw writes' own.\n\n",
        );
        out.push_str(
            "| comparison | median ratio | quartiles | rounds × calls |\n\
             |---|---|---|---|\n",
        );
        let sqlite = sqlite
            .into_iter()
            .map(|(name, s)| (format!("SQLite: {name}"), s));
        for (name, spread) in sqlite.chain(shared) {
            out.push_str(&format!(
                "| {name} | {:.2}× | {:.2}–{:.2}× | {} × {} |\n",
                spread.median,
                spread.low_quartile,
                spread.high_quartile,
                spread.rounds,
                spread.block
            ));
        }
    }
    out.push_str("\n## Fresh calls with concurrent callers\n\n");
    out.push_str(
        "Calls/s with 1, 8 and 64 callers making new intents at once; 8 callers against the \
         sequential *fresh* rate above and against 1 caller of this harness; and, on the shared \
         stores, the raw two writes with 8 callers against 1 (each caller its own connection): how \
         far the server itself scales on this machine; and idem's 8 vs 1 over the raw writes' \
         own, from these seconds-long measurements (the alternated rounds above time blocks of \
         milliseconds).\n\n",
    );
    out.push_str(
        "| backend | 1 caller | 8 callers | 64 callers | 8 vs sequential | 8 vs 1 | 64 vs 1 | raw writes, 8 vs 1 | 8 vs 1 over the raw writes' |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for b in &BACKENDS {
        let at = |n: u64| results.per_second(b.concurrent, &format!("idem/{n}"));
        let raw = |n: u64| results.per_second(b.concurrent, &format!("raw_two_writes/{n}"));
        if at(1).is_none() {
            continue;
        }
        let speedup = |eight: Option<f64>, one: Option<f64>| Some(eight? / one?);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            b.name,
            rate(at(1)),
            rate(at(8)),
            rate(at(64)),
            ratio(at(8), results.per_second(b.fresh, "idem")),
            ratio(at(8), at(1)),
            ratio(at(64), at(1)),
            ratio(raw(8), raw(1)),
            ratio(speedup(at(8), at(1)), speedup(raw(8), raw(1))),
        ));
    }
    out.push_str("\n![calls/s against concurrent callers](chart.svg)\n");
    let plain = results.median("http", "plain");
    if plain.is_some() {
        out.push_str("\n## The HTTP layer\n\n");
        out.push_str(
            "The same axum handler in process with and without `IdempotencyLayer`, on the memory \
             store, sent the same request (its `Idempotency-Key` header too, which the handler \
             alone ignores).\n\n",
        );
        out.push_str("| path | with the layer | without | time ratio |\n|---|---|---|---|\n");
        for path in ["fresh", "replay"] {
            let ours = results.median("http", path);
            let us = |x: Option<f64>| x.map_or("—".into(), |v| format!("{:.1} µs", v / 1e3));
            out.push_str(&format!(
                "| {path} | {} | {} | {} |\n",
                us(ours),
                us(plain),
                ratio(ours, plain)
            ));
        }
        if let Some(alternated) = results.alternated("http") {
            for (name, spread) in alternated {
                out.push_str(&format!(
                    "\nTimed in alternation with the bare handler (as the ratios \
                     above): {name}, {:.2}× (median of {} rounds of {} requests a side; \
                     quartiles {:.2}–{:.2}×).\n",
                    spread.median,
                    spread.rounds,
                    spread.block,
                    spread.low_quartile,
                    spread.high_quartile
                ));
            }
        }
    }
    if results
        .median("postgres_transactional", "idem_transactional")
        .is_some()
    {
        out.push_str("\n## Transactional tools\n\n");
        out.push_str(
            "Postgres, fresh calls of a tool that inserts an order row: declared `transactional` \
             (the claim, the INSERT and the record in one transaction, one commit), and the same \
             tool written as an ordinary keyed tool (the claim, the INSERT on a connection of its \
             own, the completion: three commits), paired in one run.\n\n",
        );
        out.push_str("| tool | calls/s | time per call | ratio (calls/s) |\n|---|---|---|---|\n");
        let tx = results.median("postgres_transactional", "idem_transactional");
        let three = results.median("postgres_transactional", "idem_three_commits");
        let us = |x: Option<f64>| x.map_or("—".into(), |v| format!("{:.0} µs", v / 1e3));
        let per_second = |x: Option<f64>| x.map(|ns| 1e9 / ns);
        out.push_str(&format!(
            "| transactional | {} | {} | {} |\n| claim + INSERT + completion | {} | {} | 1.00× |\n",
            rate(per_second(tx)),
            us(tx),
            ratio(per_second(tx), per_second(three)),
            rate(per_second(three)),
            us(three),
        ));
    }
    if results.median("renewal", "sqlite_on").is_some() {
        out.push_str("\n## Lease renewal\n\n");
        out.push_str(
            "Calls whose body waits once (so the renewal's timer is armed) and ends long before its \
             lease, with renewal on and off (`IdemBuilder::renew_leases`): fresh calls on SQLite, \
             and calls whose error releases the key on the memory store (the cost alone).\n\n",
        );
        out.push_str("| store | renewal on | renewal off | difference | time ratio |\n|---|---|---|---|---|\n");
        for store in ["sqlite", "memory"] {
            let on = results.median("renewal", &format!("{store}_on"));
            let off = results.median("renewal", &format!("{store}_off"));
            let us = |x: Option<f64>| x.map_or("—".into(), |v| format!("{:.2} µs", v / 1e3));
            let difference = on
                .zip(off)
                .map_or("—".into(), |(on, off)| format!("{:+.0} ns", on - off));
            out.push_str(&format!(
                "| {store} | {} | {} | {difference} | {} |\n",
                us(on),
                us(off),
                ratio(on, off)
            ));
        }
    }
    if let Some(waits) = results.waits() {
        out.push_str("\n## Duplicates that wait\n\n");
        out.push_str(
            "A holder process claims a key and a waiter in this process waits for it \
             (`claim_waiting`); the wake-up is the time from the holder's completion returning \
             to the waiter's claim returning its result, over the rounds (after 10 of warm-up). \
             Then callers wait on one key that the holder holds: the claims each sends in that \
             time, with `wait` and retrying every 10 ms without it (`benches/wait.rs`).\n\n",
        );
        out.push_str(
            "| store | wake-up p50 | p99 | largest | rounds | claims per caller, waiting | retrying every 10 ms |\n|---|---|---|---|---|---|---|\n",
        );
        for w in waits {
            let ms = |key: &str| w[key].as_f64().map_or("—".into(), |v| format!("{v:.2} ms"));
            let n = |key: &str| w[key].as_f64().map_or("—".into(), |v| format!("{v:.1}"));
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} ({} callers, {} s) | {} |\n",
                w["store"].as_str().unwrap_or("?"),
                ms("p50_ms"),
                ms("p99_ms"),
                ms("max_ms"),
                w["rounds"],
                n("waiting_claims_per_caller"),
                w["waiters"],
                w["hold_s"],
                n("polling_claims_per_caller"),
            ));
        }
    }
    if let Some(batches) = results.batches() {
        out.push_str("\n## Batches\n\n");
        out.push_str(
            "One call of a batch tool over 100 items against the same 100 items as single calls \
             of a tool with the same body, new keys each round (median over the rounds, the modes \
             alternating round by round); then both again over the same items, every item \
             replayed. Store round trips are counted as the calls the runtime makes to the store \
             (`benches/batch.rs`).\n\n",
        );
        out.push_str(
            "| store | batch of 100 | round trips | 100 singles in turn | round trips | batch ÷ singles | 100 singles at once | batch ÷ at once | batch replayed | 100 singles replayed |\n|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for b in batches {
            let mode = |name: &str, key: &str| b["modes"][name][key].as_f64();
            let rate = |name: &str| {
                mode(name, "items_per_s").map_or("—".into(), |v| format!("{v:.0} items/s"))
            };
            let trips =
                |name: &str| mode(name, "round_trips").map_or("—".into(), |v| format!("{v:.0}"));
            let times = |a: &str, c: &str| match (mode(a, "items_per_s"), mode(c, "items_per_s")) {
                (Some(a), Some(c)) => format!("{:.1}×", a / c),
                _ => "—".into(),
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                b["store"].as_str().unwrap_or("?"),
                rate("batch"),
                trips("batch"),
                rate("singles in turn"),
                trips("singles in turn"),
                times("batch", "singles in turn"),
                rate("singles at once"),
                times("batch", "singles at once"),
                rate("batch replayed"),
                rate("singles replayed"),
            ));
        }
    }
    if let Some(streams) = results.streams() {
        out.push_str("\n## Streams\n\n");
        out.push_str(
            "A streaming tool's fresh call of 1,000 chunks of 1 KiB, read whole, against the same \
             body sending the same chunks through a bare channel (an unrecorded stream), new keys \
             each round, the modes alternating round by round: as fast as the body can, then \
             paced at one chunk a millisecond (a model streaming tokens); the ratio is the \
             median of the rounds' ratios of chunks per second. Then the recorded stream replayed, \
             and the peak resident set while replaying a stream of 100 MiB (1,600 chunks of \
             64 KiB) after the peak was reset (`benches/stream.rs`).\n\n",
        );
        out.push_str(
            "| store | recorded | unrecorded | ratio | round trips | paced: ratio | replayed | replaying 100 MiB: peak RSS |\n|---|---|---|---|---|---|---|---|\n",
        );
        for st in streams {
            let mode = |name: &str, key: &str| st["modes"][name][key].as_f64();
            let rate = |name: &str| {
                mode(name, "chunks_per_s").map_or("—".into(), |v| format!("{v:.0} chunks/s"))
            };
            let ratio = |key: &str| st[key].as_f64().map_or("—".into(), |v| format!("{v:.3}×"));
            let peak = st["replay_100mib"]["peak_rss_kib"]
                .as_f64()
                .map_or("—".into(), |kib| format!("{:.0} MiB", kib / 1024.0));
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                st["store"].as_str().unwrap_or("?"),
                rate("recorded"),
                rate("unrecorded"),
                ratio("ratio"),
                mode("recorded", "round_trips").map_or("—".into(), |v| format!("{v:.0}")),
                ratio("ratio_paced"),
                rate("replayed"),
                peak,
            ));
        }
    }
    if let Some(large) = results.large() {
        out.push_str("\n## Large results\n\n");
        out.push_str(
            "A fresh call returning 1 KiB (kept in its record) against one returning 1 MiB of new \
             bytes (a new blob: SHA-256, written with the completion) and one returning the same \
             1 MiB as every call before it (the record names the blob), then both replayed; 10 \
             calls of new keys a mode a round, the modes alternating round by round; the time a \
             call is the median over the rounds, the ratio the median of the rounds' ratios \
             (`benches/large.rs`).\n\n",
        );
        out.push_str(
            "| store | fresh, 1 KiB | fresh, 1 MiB new | ratio | fresh, 1 MiB stored before | ratio | replay, 1 KiB | replay, 1 MiB | ratio |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        for l in large {
            let ms = |name: &str| {
                l["modes"][name]["ms"]
                    .as_f64()
                    .map_or("—".into(), |v| format!("{v:.2} ms"))
            };
            let ratio = |key: &str| l[key].as_f64().map_or("—".into(), |v| format!("{v:.1}×"));
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                l["store"].as_str().unwrap_or("?"),
                ms("fresh, 1 KiB"),
                ms("fresh, 1 MiB new"),
                ratio("ratio_new"),
                ms("fresh, 1 MiB stored before"),
                ratio("ratio_stored"),
                ms("replay, 1 KiB"),
                ms("replay, 1 MiB"),
                ratio("ratio_replay"),
            ));
        }
    }
    if !missing.is_empty() {
        out.push_str(&format!(
            "\nNo results for {} in this run (set `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_REDIS_URL`).\n",
            missing.join(", ")
        ));
    }
    out
}

fn chart(results: &Results, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let series: Vec<(&str, Vec<(f64, f64)>)> = BACKENDS
        .iter()
        .map(|b| {
            let points = CALLERS
                .iter()
                .enumerate()
                .filter_map(|(i, n)| {
                    results
                        .per_second(b.concurrent, &format!("idem/{n}"))
                        .map(|r| (i as f64, r))
                })
                .collect();
            (b.name, points)
        })
        .filter(|(_, p): &(&str, Vec<(f64, f64)>)| !p.is_empty())
        .collect();
    let top = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, r)| *r))
        .fold(1.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "idem: fresh calls/s against concurrent callers",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.2f64..2.2f64, 0f64..top)?;
    chart
        .configure_mesh()
        .x_labels(3)
        .x_label_formatter(&|x| {
            CALLERS
                .get(x.round() as usize)
                .map_or(String::new(), |n| format!("{n} caller(s)"))
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .y_desc("calls/s")
        .draw()?;
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for ((name, points), color) in series.iter().zip(colors) {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let run = std::env::args().any(|a| a == "--run");
    if run {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&root)
            .args([
                "bench",
                "-p",
                "idem-integration",
                "--bench",
                "sqlite",
                "--bench",
                "shared",
                "--bench",
                "http",
                "--bench",
                "wait",
                "--bench",
                "batch",
                "--bench",
                "stream",
                "--bench",
                "large",
            ])
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("bench-report: `cargo bench` failed");
            return ExitCode::from(1);
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let results = Results {
        dir: target.join("tmp/criterion"),
    };
    if results.median("fresh", "idem").is_none() && results.median("http", "plain").is_none() {
        eprintln!(
            "bench-report: no criterion results under {}; run with --run (or `cargo bench` first)",
            results.dir.display()
        );
        return ExitCode::from(1);
    }
    let docs = root.join("guide").join("src").join("benchmarks");
    if let Err(e) = std::fs::create_dir_all(&docs)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            std::fs::write(docs.join("results.md"), markdown(&results)).map_err(|e| e.to_string())
        })
        .and_then(|()| chart(&results, &docs.join("chart.svg")).map_err(|e| e.to_string()))
    {
        eprintln!("bench-report: {e}");
        return ExitCode::from(1);
    }
    println!("wrote guide/src/benchmarks/results.md and chart.svg");
    ExitCode::SUCCESS
}
