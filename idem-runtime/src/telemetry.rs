//! What every keyed call reports: a `tracing` span and `metrics` counters.
//!
//! - The span `idem.call`, one per call of a keyed tool, with `tool`, `tenant`, `key` (the short
//!   hash, never the key), `token` (the fencing token, when the call holds the key), `outcome`
//!   and `duration_ms`; an event `idempotent call` at its end (DEBUG; WARN for store errors).
//! - Counters, labelled by `tool`: `idempotency_fresh` (the body ran), `idempotency_replay`,
//!   `idempotency_conflict` (in flight elsewhere), `idempotency_mismatch`,
//!   `idempotency_unknown` and `idempotency_store_error`.
//!
//! Both are no-ops until the application installs a `tracing` subscriber or a `metrics`
//! recorder (a Prometheus exporter, say).

use std::time::Instant;

use tracing::Span;

use crate::error::Error;
use crate::outcome::Outcome;

/// The names of the counters.
pub mod counters {
    /// The body ran.
    pub const FRESH: &str = "idempotency_fresh";
    /// A stored result (or stored error) was replayed.
    pub const REPLAY: &str = "idempotency_replay";
    /// Another call held the key (in flight).
    pub const CONFLICT: &str = "idempotency_conflict";
    /// The key was used with other arguments.
    pub const MISMATCH: &str = "idempotency_mismatch";
    /// The key is blocked as unknown.
    pub const UNKNOWN: &str = "idempotency_unknown";
    /// The store failed.
    pub const STORE_ERROR: &str = "idempotency_store_error";
}

/// The span of one keyed call; `key` is the short hash.
pub(crate) fn call_span(tool: &'static str, tenant: &str, key: &crate::key::KeyHash) -> Span {
    tracing::info_span!(
        "idem.call",
        tool,
        tenant,
        key = %key,
        token = tracing::field::Empty,
        outcome = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
    )
}

/// Records how the call ended on its span and in the counters.
pub(crate) fn finish<T, E>(
    span: &Span,
    tool: &'static str,
    result: &Result<Outcome<T>, Error<E>>,
    started: Instant,
) {
    let (outcome, counted): (&str, &[&'static str]) = match result {
        Ok(Outcome::Fresh(_) | Outcome::Unprotected(_)) => ("fresh", &[counters::FRESH]),
        Ok(Outcome::Replayed(_)) => ("replayed", &[counters::REPLAY]),
        Ok(Outcome::InFlight(_)) => ("in_flight", &[counters::CONFLICT]),
        Ok(Outcome::Mismatch(_)) => ("mismatch", &[counters::MISMATCH]),
        Ok(Outcome::Unknown(_)) => ("unknown", &[counters::UNKNOWN]),
        Err(Error::Tool { replayed: true, .. }) => ("replayed_error", &[counters::REPLAY]),
        Err(Error::Store(_)) => ("store_error", &[counters::STORE_ERROR]),
        Err(Error::CompletionFailed { .. }) => (
            "completion_failed",
            &[counters::FRESH, counters::STORE_ERROR],
        ),
        Err(e) if e.body_ran() => ("tool_error", &[counters::FRESH]),
        Err(_) => ("refused", &[]),
    };
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    span.record("outcome", outcome);
    span.record("duration_ms", elapsed);
    for name in counted {
        metrics::counter!(*name, "tool" => tool).increment(1);
    }
    if counted.contains(&counters::STORE_ERROR) {
        tracing::warn!(parent: span, outcome, "idempotent call: the store failed");
    } else {
        tracing::debug!(parent: span, outcome, "idempotent call");
    }
}
