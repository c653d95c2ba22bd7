//! Diagnostics of `#[idempotent]` in an edition-2021 crate (tests/fail). The edition-2024 cases
//! are in `integration/tests/ui`. Regenerate reviewed `.stderr` files with `TRYBUILD=overwrite`.

#[path = "../../integration/tests/common/diagnostics.rs"]
mod diagnostics;

#[test]
fn diagnostics_in_an_edition_2021_crate() {
    trybuild::TestCases::new().compile_fail("tests/fail/*.rs");
}

/// Each diagnostic is one error, in the user's words: no expected `.stderr` holds two or names
/// idem's private machinery.
#[test]
fn every_case_is_one_error_that_names_no_private_machinery() {
    diagnostics::one_error_each("tests/fail", &[]);
}
