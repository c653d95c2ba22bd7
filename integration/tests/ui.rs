//! Compile-time diagnostics of `#[idempotent]` (tests/ui/fail) and expansions that must build and
//! run (tests/ui/pass). Regenerate reviewed `.stderr` files with `TRYBUILD=overwrite`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
