//! idem's integration tests (`tests/`, mapped in `tests/README.md`), benchmarks (`benches/`) and
//! the examples that need features beyond the default (`examples/`). Nothing here is published;
//! the library is only the Rust code blocks of the README and of the guide (`guide/src/`),
//! compiled and run as doctests with every feature of the workspace (`mdbook test` would build
//! them without idem and its features, so the guide's `book.toml` leaves them to these).

/// Includes each Markdown file as the docs of an item, so that its Rust code blocks are
/// doctests; a file without one costs nothing.
macro_rules! doctests {
    ($($name:ident => $path:literal),* $(,)?) => {$(
        #[doc = include_str!($path)]
        #[cfg(doctest)]
        pub struct $name;
    )*};
}

doctests! {
    Readme => "../../README.md",
    GuideIntroduction => "../../guide/src/introduction.md",
    GuideGettingStarted => "../../guide/src/getting-started.md",
    GuideContract => "../../guide/src/contract.md",
    GuideAttribute => "../../guide/src/attribute.md",
    GuideCrashes => "../../guide/src/crashes.md",
    GuideStores => "../../guide/src/stores.md",
    GuideTransactional => "../../guide/src/transactional.md",
    GuideAgents => "../../guide/src/agents.md",
    GuideDurableRuns => "../../guide/src/durable-runs.md",
    GuideWaiting => "../../guide/src/waiting.md",
    GuideBatches => "../../guide/src/batches.md",
    GuideStreams => "../../guide/src/streams.md",
    GuideLargeResults => "../../guide/src/large-results.md",
    GuideHttp => "../../guide/src/http.md",
    GuideOperating => "../../guide/src/operating.md",
    GuideTesting => "../../guide/src/testing.md",
    GuideBenchmarks => "../../guide/src/benchmarks.md",
    GuideLimits => "../../guide/src/limits.md",
    GuideArchitecture => "../../guide/src/architecture.md",
}
