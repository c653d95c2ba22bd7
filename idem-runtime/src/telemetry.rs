//! What every keyed call reports: a `tracing` span and `metrics` by the Prometheus conventions.
//!
//! - The span `idem.call`, one per call of a keyed tool, with `tool`, `tenant`, `key` (the short
//!   hash, never the key), `token` (the fencing token, when the call holds the key), `outcome`
//!   and `duration_ms`; an event `idempotent call` at its end (DEBUG; WARN for store errors).
//! - [`CALLS`] (`idem_calls_total{tool, outcome}`): every keyed call, by how it ended.
//! - [`BODY_RUNS`] (`idem_body_runs_total{tool}`): how many times a body really ran (a fresh
//!   call, a tool error, a completion the store failed to record): the effects.
//! - [`CALL_DURATION`] (`idem_call_duration_seconds{tool, outcome}`): a histogram of the whole
//!   call, store round trips and body included.
//!
//! | `outcome` | the call |
//! |---|---|
//! | `fresh` | ran the body and recorded its result |
//! | `unprotected` | ran the body without a key (an optional key was omitted) |
//! | `replayed` | answered a stored result |
//! | `replayed_error` | answered a stored error of the tool |
//! | `in_flight` | found the key held by another call |
//! | `mismatch` | found the key used with other arguments |
//! | `unknown` | found the key blocked as unknown |
//! | `tool_error` | ran the body, which failed |
//! | `store_error` | could not reach the store; the body did not run |
//! | `completion_failed` | ran the body; the store failed to record its result |
//! | `refused` | was refused before the store (a malformed key, arguments too large, …) |
//!
//! Labels never carry a key. Everything is a no-op until the application installs a `tracing`
//! subscriber or a `metrics` recorder (a Prometheus exporter, say); the descriptions ([`describe`])
//! reach the recorder installed before the first keyed call, or call [`describe`] yourself.

use std::sync::Once;
use std::time::Instant;

use metrics::Unit;
use tracing::{Instrument as _, Span};

use crate::error::Error;
use crate::key::IdempotencyKey;
use crate::outcome::Outcome;

/// Every keyed call, labelled by `tool` and `outcome`.
pub const CALLS: &str = "idem_calls_total";
/// Every run of a tool's body, labelled by `tool`: the effects.
pub const BODY_RUNS: &str = "idem_body_runs_total";
/// The duration of each keyed call in seconds, labelled by `tool` and `outcome`.
pub const CALL_DURATION: &str = "idem_call_duration_seconds";

/// Describes the three metrics (unit and help text) to the installed `metrics` recorder.
///
/// idem does it by itself before its first keyed call; call this after installing a recorder
/// later than that, or to have the descriptions before any call.
pub fn describe() {
    metrics::describe_counter!(CALLS, Unit::Count, "Keyed tool calls, by tool and outcome");
    metrics::describe_counter!(
        BODY_RUNS,
        Unit::Count,
        "Runs of a tool's body (its effects), by tool"
    );
    metrics::describe_histogram!(
        CALL_DURATION,
        Unit::Seconds,
        "Duration of keyed tool calls, store round trips and body included, by tool and outcome"
    );
}

/// Runs `call`, one keyed call of `tool`, inside its span `idem.call` (lent to `call`, which
/// records the fencing token on it), and reports how it ended ([`finish`]). When no subscriber
/// wants the span, the call is not wrapped in it at all: entering and leaving a disabled span
/// at every poll is work for nothing.
pub(crate) async fn observe<T, E>(
    tool: &'static str,
    tenant: &str,
    key: IdempotencyKey,
    call: impl AsyncFnOnce(&Span) -> Result<Outcome<T>, Error<E>>,
) -> Result<Outcome<T>, Error<E>> {
    let span = tracing::info_span!(
        "idem.call",
        tool,
        tenant,
        key = %key.short_hash(),
        token = tracing::field::Empty,
        outcome = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
    );
    let started = Instant::now();
    let running = call(&span);
    let result = if span.is_disabled() {
        running.await
    } else {
        running.instrument(span.clone()).await
    };
    finish(&span, tool, &result, started);
    result
}

/// Records how the call ended on its span and in the counters.
fn finish<T, E>(
    span: &Span,
    tool: &'static str,
    result: &Result<Outcome<T>, Error<E>>,
    started: Instant,
) {
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(describe);
    let (outcome, body_ran) = match result {
        Ok(Outcome::Fresh(_)) => ("fresh", true),
        Ok(Outcome::Unprotected(_)) => ("unprotected", true),
        Ok(Outcome::Replayed(_)) => ("replayed", false),
        Ok(Outcome::InFlight(_)) => ("in_flight", false),
        Ok(Outcome::Mismatch(_)) => ("mismatch", false),
        Ok(Outcome::Unknown(_)) => ("unknown", false),
        Err(Error::Tool { replayed: true, .. }) => ("replayed_error", false),
        Err(Error::Store(_)) => ("store_error", false),
        Err(Error::CompletionFailed { .. }) => ("completion_failed", true),
        Err(Error::NotCommitted { .. }) => ("not_committed", true),
        Err(e) if e.body_ran() => ("tool_error", true),
        Err(_) => ("refused", false),
    };
    let elapsed = started.elapsed();
    if !span.is_disabled() {
        span.record("outcome", outcome);
        span.record("duration_ms", elapsed.as_secs_f64() * 1e3);
    }
    metrics::counter!(CALLS, "tool" => tool, "outcome" => outcome).increment(1);
    metrics::histogram!(CALL_DURATION, "tool" => tool, "outcome" => outcome)
        .record(elapsed.as_secs_f64());
    if body_ran {
        metrics::counter!(BODY_RUNS, "tool" => tool).increment(1);
    }
    if matches!(
        outcome,
        "store_error" | "completion_failed" | "not_committed"
    ) {
        tracing::warn!(parent: span, outcome, "idempotent call: the store failed");
    } else {
        tracing::debug!(parent: span, outcome, "idempotent call");
    }
}
