//! Diagnostics of `#[idempotent]` in an edition-2021 crate (tests/fail). The edition-2024 cases
//! are in `integration/tests/ui`. Regenerate reviewed `.stderr` files with `TRYBUILD=overwrite`.

#[test]
fn diagnostics_in_an_edition_2021_crate() {
    trybuild::TestCases::new().compile_fail("tests/fail/*.rs");
}

/// Each diagnostic is one error, in the user's words: no expected `.stderr` holds two or names
/// idem's private machinery.
#[test]
fn every_case_is_one_error_that_names_no_private_machinery() {
    for entry in std::fs::read_dir("tests/fail").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "stderr") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let errors = text.lines().filter(|l| l.starts_with("error")).count();
        assert_eq!(errors, 1, "{}: one misuse, one error", path.display());
        for private in ["__private", "KeyPartProbe"] {
            assert!(
                !text.contains(private),
                "{} names `{private}`",
                path.display()
            );
        }
    }
}
