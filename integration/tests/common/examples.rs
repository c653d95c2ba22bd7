//! The examples' binaries, for tests that run them as processes, and the kills they gave
//! themselves (`examples/common/kills.rs`). Include it with
//! `#[path = "common/examples.rs"] mod examples;`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `target/debug/examples/NAME`, which `cargo test -p idem-integration` builds beside the tests
/// (`cargo test --test X` does not): refused when missing or older than its source, so that a
/// test never runs a stale example.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .join("examples")
        .join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.rs"));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    assert!(
        modified(&binary).is_some() && modified(&binary) >= modified(&source),
        "{} is missing or older than its source: `cargo test -p idem-integration` builds the \
         examples (or `cargo build -p idem-integration --example {name}`)",
        binary.display()
    );
    binary
}

/// How many kills each point caused, from the marker files (`ID.POINT`) the examples' self-kill
/// leaves in `dir`, counting only the ids that start with `prefix`.
pub fn kills_by_point(dir: &Path, prefix: &str) -> BTreeMap<String, usize> {
    let mut kills = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix(prefix)
            && let Some((_, point)) = rest.rsplit_once('.')
        {
            *kills.entry(point.to_owned()).or_default() += 1;
        }
    }
    kills
}
