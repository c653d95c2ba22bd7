//! Nothing but a home for `tests/ui.rs`: the diagnostics of `#[idempotent]` as a user crate on
//! edition 2021 sees them, each case with exactly the errors its `.stderr` shows.
