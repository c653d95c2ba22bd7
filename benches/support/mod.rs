//! What the benchmarks share: where criterion writes, and the summary of ratios it prints.

#![allow(dead_code)] // each bench uses a part of it

use std::path::{Path, PathBuf};

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
    let per_s = |ns: f64| 1e9 / ns;
    if let (Some(o), Some(b)) = (ours, base) {
        let ratio = per_s(o) / per_s(b);
        let verdict = if ratio >= target { "meets" } else { "MISSES" };
        println!(
            "  {label:<48} {:>10.0} /s vs {:>10.0} /s  ratio {ratio:.2} ({verdict} target {target})",
            per_s(o),
            per_s(b)
        );
    }
}
