//! idem's integration tests (`tests/`, mapped in `tests/README.md`), benchmarks (`benches/`) and
//! the examples that need features beyond the default (`examples/`). Nothing here is published;
//! the library is only the README's examples, compiled and run as doctests.

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
