//! Compile-time diagnostics of `#[idempotent]` (tests/ui/fail) and expansions that must build and
//! run (tests/ui/pass). Regenerate reviewed `.stderr` files with `TRYBUILD=overwrite`.

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
    one_error_each(
        "tests/ui/fail",
        &["every_broken_rule_is_reported_in_one_pass.stderr"],
    );
}

fn one_error_each(dir: &str, several: &[&str]) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "stderr") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let errors = text.lines().filter(|l| l.starts_with("error")).count();
        let name = path.file_name().unwrap().to_string_lossy();
        if !several.contains(&name.as_ref()) {
            assert_eq!(errors, 1, "{}: one misuse, one error", path.display());
        }
        for private in ["__private", "KeyPartProbe"] {
            assert!(
                !text.contains(private),
                "{} names `{private}`",
                path.display()
            );
        }
    }
}
