//! Compile-time diagnostics of `#[idempotent]` (tests/ui/fail) and expansions that must build and
//! run (tests/ui/pass). Regenerate reviewed `.stderr` files with `TRYBUILD=overwrite`.

#[path = "common/diagnostics.rs"]
mod diagnostics;

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}

/// Each diagnostic is one error, in the user's words: no expected `.stderr` holds two (except
/// the case that shows every broken rule reported in one pass) or names idem's private machinery.
#[test]
fn every_case_is_one_error_that_names_no_private_machinery() {
    diagnostics::one_error_each(
        "tests/ui/fail",
        &[
            "every_broken_rule_is_reported_in_one_pass.stderr",
            // The options a transactional tool refuses, all reported in one pass.
            "transactional_options.stderr",
            // The options a batch tool refuses, likewise.
            "batch_options.stderr",
            // The options a streaming tool refuses, likewise.
            "stream_options.stderr",
        ],
    );
}

/// The misuses of `ui/user_build/`, compiled as a user compiles them: `cargo check` with
/// incremental compilation on (trybuild turns it off, and rustc reported some of these three times
/// with it on, naming idem's private items). Each is one error, naming no private machinery.
#[test]
fn a_user_build_reports_each_misuse_once() {
    use std::path::Path;
    use std::process::Command;

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let target = root.join("target").join("idem-user-build");
    let project = target.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let cases: Vec<_> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/user_build"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .collect();
    assert!(cases.len() >= 7, "the cases are there");
    let mut manifest = format!(
        "[package]\nname = \"idem-user-build\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [workspace]\n\n[dependencies]\nidem = {{ package = \"idem-agent\", path = {:?}, features = [\"postgres\"] }}\n\
         serde = {{ version = \"1\", features = [\"derive\"] }}\n",
        root.display().to_string()
    );
    for case in &cases {
        let name = case.file_stem().unwrap().to_string_lossy();
        manifest += &format!(
            "\n[[bin]]\nname = \"{name}\"\npath = {:?}\n",
            case.display().to_string()
        );
    }
    std::fs::write(project.join("Cargo.toml"), manifest).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(&project)
        .args([
            "check",
            "--bins",
            "--keep-going",
            "--message-format=json",
            "--quiet",
        ])
        .env("CARGO_TARGET_DIR", target.join("target"))
        // A user's build, with incremental compilation as cargo's dev profile has it.
        .env_remove("CARGO_INCREMENTAL")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    for case in &cases {
        let path = case.display().to_string();
        let errors: Vec<String> = stdout
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|m| {
                m["reason"] == "compiler-message" && m["target"]["src_path"] == path.as_str()
            })
            .filter(|m| m["message"]["level"] == "error")
            .map(|m| {
                m["message"]["rendered"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "{path}: one misuse, one error:\n{}",
            errors.join("\n")
        );
        for private in ["__private", "KeyPartProbe", "idem_runtime::"] {
            assert!(
                !errors[0].contains(private),
                "{path} names `{private}`:\n{}",
                errors[0]
            );
        }
        // A type that is not a `Result` is told where `ToolResult` is implemented (rustc's help,
        // which shows the impl's source); every other error stays in the user's code.
        if !path.ends_with("not_a_result.rs") {
            assert!(
                !errors[0].contains("idem-runtime/src") && !errors[0].contains("idem-core/src"),
                "{path} shows idem's source:\n{}",
                errors[0]
            );
        }
    }
}
