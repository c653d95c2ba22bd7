//! Diagnostics of `#[idempotent]` in an edition-2021 crate (tests/fail). The edition-2024 cases
//! are in `integration/tests/ui`. Regenerate reviewed `.stderr` files with `TRYBUILD=overwrite`.

#[test]
fn diagnostics_in_an_edition_2021_crate() {
    trybuild::TestCases::new().compile_fail("tests/fail/*.rs");
}
