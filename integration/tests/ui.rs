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
        ],
    );
}
