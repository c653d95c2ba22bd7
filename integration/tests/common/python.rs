//! Python packages the interoperability tests drive idem with (Stripe's SDK, the MCP SDK).

/// Whether `python3` can import `module`, with `pythonpath` as its `PYTHONPATH` when given.
/// Without it the test is skipped, with `install` printed (with `IDEM_REQUIRE_BACKENDS=1`, as
/// in CI, a missing package is a failure).
pub fn can_import(module: &str, pythonpath: Option<&str>, install: &str) -> bool {
    let mut python = std::process::Command::new("python3");
    python.args(["-c", &format!("import {module}")]);
    if let Some(path) = pythonpath {
        python.env("PYTHONPATH", path);
    }
    let found = python.status().is_ok_and(|s| s.success());
    if !found {
        assert_ne!(
            std::env::var("IDEM_REQUIRE_BACKENDS").as_deref(),
            Ok("1"),
            "the Python package `{module}` is required: {install}"
        );
        eprintln!("skipped: the Python package `{module}` is missing: {install}");
    }
    found
}
