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

use metrics::{Key, Label, Metadata, Unit};
use tracing::{Instrument as _, Span};

use crate::error::Error;
use crate::key::IdempotencyKey;
use crate::outcome::Outcome;
use crate::registry::ToolInfo;

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
    tool: &'static ToolInfo,
    tenant: &str,
    key: IdempotencyKey,
    call: impl AsyncFnOnce(&Span) -> Result<Outcome<T>, Error<E>>,
) -> Result<Outcome<T>, Error<E>> {
    let span = tracing::info_span!(
        "idem.call",
        tool = tool.name,
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

/// Every `outcome` label, in the order of [`outcome`]'s indices.
const OUTCOMES: [&str; 12] = [
    "fresh",
    "unprotected",
    "replayed",
    "in_flight",
    "mismatch",
    "unknown",
    "replayed_error",
    "store_error",
    "completion_failed",
    "not_committed",
    "tool_error",
    "refused",
];

/// The metric keys of one tool, labels included, built at its first keyed call and kept in its
/// [`ToolInfo`]: reporting a call then builds no key and allocates nothing (a key built from
/// runtime labels costs a vector and a hash at each call, even with no recorder installed).
#[derive(Clone)]
pub(crate) struct ToolMetrics {
    calls: [Key; OUTCOMES.len()],
    durations: [Key; OUTCOMES.len()],
    body_runs: Key,
}

impl ToolMetrics {
    pub(crate) fn new(tool: &'static str) -> Self {
        let labelled = |name: &'static str, outcome: &'static str| {
            Key::from_parts(
                name,
                vec![
                    Label::from_static_parts("tool", tool),
                    Label::from_static_parts("outcome", outcome),
                ],
            )
        };
        ToolMetrics {
            calls: OUTCOMES.map(|outcome| labelled(CALLS, outcome)),
            durations: OUTCOMES.map(|outcome| labelled(CALL_DURATION, outcome)),
            body_runs: Key::from_parts(BODY_RUNS, vec![Label::from_static_parts("tool", tool)]),
        }
    }
}

impl std::fmt::Debug for ToolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolMetrics").finish_non_exhaustive()
    }
}

/// How a call ended: its index in [`OUTCOMES`], and whether its body ran.
fn outcome<T, E>(result: &Result<Outcome<T>, Error<E>>) -> (usize, bool) {
    match result {
        Ok(Outcome::Fresh(_)) => (0, true),
        Ok(Outcome::Unprotected(_)) => (1, true),
        Ok(Outcome::Replayed(_)) => (2, false),
        Ok(Outcome::InFlight(_)) => (3, false),
        Ok(Outcome::Mismatch(_)) => (4, false),
        Ok(Outcome::Unknown(_)) => (5, false),
        Err(Error::Tool { replayed: true, .. }) => (6, false),
        Err(Error::Store(_)) => (7, false),
        Err(Error::CompletionFailed { .. }) => (8, true),
        Err(Error::NotCommitted { .. }) => (9, true),
        Err(e) if e.body_ran() => (10, true),
        Err(_) => (11, false),
    }
}

/// Records how the call ended on its span and in the counters.
fn finish<T, E>(
    span: &Span,
    tool: &'static ToolInfo,
    result: &Result<Outcome<T>, Error<E>>,
    started: Instant,
) {
    static DESCRIBED: Once = Once::new();
    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
    DESCRIBED.call_once(describe);
    let (index, body_ran) = outcome(result);
    let outcome = OUTCOMES[index];
    let elapsed = started.elapsed();
    if !span.is_disabled() {
        span.record("outcome", outcome);
        span.record("duration_ms", elapsed.as_secs_f64() * 1e3);
    }
    let keys = tool.metrics();
    metrics::with_recorder(|r| r.register_counter(&keys.calls[index], &METADATA)).increment(1);
    metrics::with_recorder(|r| r.register_histogram(&keys.durations[index], &METADATA))
        .record(elapsed.as_secs_f64());
    if body_ran {
        metrics::with_recorder(|r| r.register_counter(&keys.body_runs, &METADATA)).increment(1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_keys_carry_its_name_and_each_outcome() {
        let keys = ToolMetrics::new("pay");
        let labels = |key: &Key| -> Vec<(String, String)> {
            key.labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect()
        };
        for (i, outcome) in OUTCOMES.iter().enumerate() {
            for (key, name) in [(&keys.calls[i], CALLS), (&keys.durations[i], CALL_DURATION)] {
                assert_eq!(key.name(), name);
                assert_eq!(
                    labels(key),
                    [
                        ("tool".into(), "pay".into()),
                        ("outcome".into(), (*outcome).into())
                    ]
                );
            }
        }
        assert_eq!(keys.body_runs.name(), BODY_RUNS);
        assert_eq!(labels(&keys.body_runs), [("tool".into(), "pay".into())]);
    }

    #[test]
    fn outcomes_name_how_calls_ended() {
        let fresh: Result<Outcome<u8>, Error<String>> = Ok(Outcome::Fresh(1));
        let replayed: Result<Outcome<u8>, Error<String>> = Ok(Outcome::Replayed(1));
        assert_eq!(OUTCOMES[outcome(&fresh).0], "fresh");
        assert!(outcome(&fresh).1);
        assert_eq!(OUTCOMES[outcome(&replayed).0], "replayed");
        assert!(!outcome(&replayed).1);
    }
}
