//! The tool report of each example is checked in under `docs/tools/`, produced by running the
//! example with `IDEM_REPORT` set, as any binary can be. This test fails when one is stale;
//! `IDEM_UPDATE_REPORTS=1 cargo test -p idem-integration --test reports` writes them anew. The
//! examples of the default features are the facade's (`examples/`), the others this package's
//! (`integration/examples/`); `cargo test --workspace` builds both.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Each example, and the package folder its source is in, relative to the workspace root.
const EXAMPLES: [(&str, &str); 9] = [
    ("register_payment", "."),
    ("set_status", "."),
    ("assign_shift", "."),
    ("duplicate_waits", "."),
    ("charge_invoices", "."),
    ("stream_report", "."),
    ("large_result", "."),
    ("payments_agent", "integration"),
    // An MCP server over stdio: with no client (stdin closed) it ends after opening its store.
    ("mcp_server", "integration"),
];

/// The workspace root: this package's parent folder.
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// `target/debug/examples/NAME`: `cargo test` builds the examples beside the tests.
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    deps.parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .join("examples")
        .join(name)
}

#[test]
fn the_checked_in_tool_reports_are_current() {
    let update = std::env::var("IDEM_UPDATE_REPORTS").as_deref() == Ok("1");
    let work = tempfile::tempdir().unwrap();
    let mut stale = Vec::new();
    for (name, package) in EXAMPLES {
        let binary = example(name);
        assert!(
            binary.exists(),
            "{} is missing: `cargo test --workspace` builds the examples",
            binary.display()
        );
        let source = workspace()
            .join(package)
            .join(format!("examples/{name}.rs"));
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).unwrap();
        assert!(
            modified(&binary) >= modified(&source),
            "{name} changed since it was built: run `cargo test --workspace`, which builds examples"
        );
        let report = work.path().join(format!("{name}.md"));
        let out = Command::new(&binary)
            .env("IDEM_REPORT", &report)
            .current_dir(work.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fresh = std::fs::read_to_string(&report).expect("the example wrote its report");
        assert!(fresh.contains("# Idempotent tools"), "{fresh}");
        let checked_in = workspace().join("docs/tools").join(format!("{name}.md"));
        if update {
            std::fs::write(&checked_in, &fresh).unwrap();
        } else if std::fs::read_to_string(&checked_in).ok().as_deref() != Some(fresh.as_str()) {
            stale.push(checked_in.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale tool reports: {stale:?}; run `IDEM_UPDATE_REPORTS=1 cargo test -p idem-integration --test reports`"
    );
}
