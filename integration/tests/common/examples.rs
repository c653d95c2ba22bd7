//! The examples' binaries, for tests that run them as processes. Include it with
//! `#[path = "common/examples.rs"] mod examples;`.

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
