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
//! - [`COMPLETION_RETRIES`] (`idem_completion_retries_total{tool}`), [`COMPLETIONS_LATE`]
//!   (`idem_completions_late_total{tool}`), [`COMPLETIONS_LOST`]
//!   (`idem_completions_lost_total{tool}`): completions sent again after a store error, those
//!   that then landed, and those that did not (the body ran, its result is not recorded). The
//!   HTTP layer's recordings count under the tool `http`.
//! - [`WAITS`] (`idem_waits_total{tool}`): calls that found their key held by a live call and
//!   waited for it (`wait`); the call's `outcome` says how the wait ended (`replayed`,
//!   `fresh` after a release or a takeover, `in_flight` past the wait).
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

use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};
use std::time::Instant;

use metrics::{Metadata, Unit};
use tracing::Span;

use crate::metric_keys::Ending;
use crate::registry::ToolInfo;
use idem_core::Error;
use idem_core::Outcome;
use idem_core::key::IdempotencyKey;

pub use crate::metric_keys::{
    BODY_RUNS, CALL_DURATION, CALLS, COMPLETION_RETRIES, COMPLETIONS_LATE, COMPLETIONS_LOST, WAITS,
};

/// Describes idem's metrics (unit and help text) to the installed `metrics` recorder.
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
    metrics::describe_counter!(
        COMPLETION_RETRIES,
        Unit::Count,
        "Completions sent again after a store error, by tool"
    );
    metrics::describe_counter!(
        COMPLETIONS_LATE,
        Unit::Count,
        "Completions that landed after a store error, by tool"
    );
    metrics::describe_counter!(
        COMPLETIONS_LOST,
        Unit::Count,
        "Completions that did not land because of the store (the body ran), by tool"
    );
    metrics::describe_counter!(
        WAITS,
        Unit::Count,
        "Calls that found their key held by a live call and waited for it, by tool"
    );
}

/// A call of `tool` that found its key held and waits for the holder.
pub(crate) fn waits(tool: &'static str) {
    metrics::counter!(WAITS, "tool" => tool).increment(1);
}

/// Reports a completion that met the store's errors: its `retries` (the attempts after the
/// first), and whether it was `lost` (did not land) or landed late. Only this rare path builds
/// its metric keys.
pub(crate) fn completion(tool: &'static str, retries: u32, lost: bool) {
    if retries > 0 {
        metrics::counter!(COMPLETION_RETRIES, "tool" => tool).increment(retries.into());
    }
    if lost {
        metrics::counter!(COMPLETIONS_LOST, "tool" => tool).increment(1);
        tracing::warn!(
            tool,
            attempts = retries + 1,
            "idempotent call: the body ran and its result could not be recorded"
        );
    } else if retries > 0 {
        metrics::counter!(COMPLETIONS_LATE, "tool" => tool).increment(1);
        tracing::info!(
            tool,
            attempts = retries + 1,
            "idempotent call: its result was recorded after the store failed"
        );
    }
}

/// One keyed call of a tool, observed: its span `idem.call`, and when it started.
///
/// [`start`](Observation::start) it once the key is known, run the call's steps
/// [`within`](Observation::within) it, [`finish`](Observation::finish) it with the call's result.
pub(crate) struct Observation {
    tool: &'static ToolInfo,
    span: Span,
    started: Instant,
}

impl Observation {
    /// Opens the call's span and starts its clock.
    pub(crate) fn start(tool: &'static ToolInfo, tenant: &str, key: IdempotencyKey) -> Self {
        let span = tracing::info_span!(
            "idem.call",
            tool = tool.name,
            tenant,
            key = %key.short_hash(),
            token = tracing::field::Empty,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        Observation {
            tool,
            span,
            started: Instant::now(),
        }
    }

    /// The call's span (a claim records its fencing token on it).
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Runs `step` of the call inside its span. When no subscriber wants the span, `step` is not
    /// entered in it at all: entering and leaving a disabled span at every poll is work for
    /// nothing.
    pub(crate) fn within<F: Future>(&self, step: F) -> InSpan<'_, F> {
        InSpan {
            span: (!self.span.is_disabled()).then_some(&self.span),
            step,
        }
    }

    /// Reports how the call ended: on its span, in the metrics, and as an event.
    pub(crate) fn finish<T, E>(self, result: &Result<Outcome<T>, Error<E>>) {
        finish(&self.span, self.tool, result, self.started);
    }
}

pin_project_lite::pin_project! {
    /// A step of a call, polled inside the call's span when one is wanted
    /// ([`Observation::within`]). Unlike an `async` wrapper, it holds the step once.
    pub(crate) struct InSpan<'a, F> {
        span: Option<&'a Span>,
        #[pin]
        step: F,
    }
}

impl<F: Future> Future for InSpan<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.span.map(Span::enter);
        this.step.poll(cx)
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
    let ending = Ending::of(result);
    let outcome = ending.label();
    let elapsed = started.elapsed();
    if !span.is_disabled() {
        span.record("outcome", outcome);
        span.record("duration_ms", elapsed.as_secs_f64() * 1e3);
    }
    let keys = tool.metrics();
    let index = ending as usize;
    metrics::with_recorder(|r| r.register_counter(&keys.calls[index], &METADATA)).increment(1);
    metrics::with_recorder(|r| r.register_histogram(&keys.durations[index], &METADATA))
        .record(elapsed.as_secs_f64());
    if ending.body_ran() {
        metrics::with_recorder(|r| r.register_counter(&keys.body_runs, &METADATA)).increment(1);
    }
    if ending.store_failed() {
        tracing::warn!(parent: span, outcome, "idempotent call: the store failed");
    } else {
        tracing::debug!(parent: span, outcome, "idempotent call");
    }
}
