//! The names of idem's metrics and each tool's keys: what [`telemetry`](crate::telemetry)
//! reports a call under, kept in the tool's registration.

use idem_core::{Error, Outcome};
use metrics::{Key, Label};

/// Every keyed call, labelled by `tool` and `outcome`.
pub const CALLS: &str = "idem_calls_total";
/// Every run of a tool's body, labelled by `tool`: the effects.
pub const BODY_RUNS: &str = "idem_body_runs_total";
/// The duration of each keyed call in seconds, labelled by `tool` and `outcome`.
pub const CALL_DURATION: &str = "idem_call_duration_seconds";
/// Every completion sent again after a store error, labelled by `tool`.
pub const COMPLETION_RETRIES: &str = "idem_completion_retries_total";
/// Every completion that landed after at least one store error, labelled by `tool`.
pub const COMPLETIONS_LATE: &str = "idem_completions_late_total";
/// Every completion that did not land because of the store (given up, or fenced out after a
/// failed attempt), labelled by `tool`: a body ran whose result is not recorded.
pub const COMPLETIONS_LOST: &str = "idem_completions_lost_total";
/// Every call that found its key held by a live call and waited for it (`wait`), labelled by
/// `tool`; how the call then ended is its `outcome` in [`CALLS`].
pub const WAITS: &str = "idem_waits_total";

/// How a keyed call ended: its `outcome` label (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Fresh,
    Unprotected,
    Replayed,
    InFlight,
    Mismatch,
    Unknown,
    ReplayedError,
    StoreError,
    CompletionFailed,
    NotCommitted,
    ToolError,
    Refused,
}

impl Ending {
    /// Every ending, in the order of their discriminants (the index of their metric keys).
    pub(crate) const ALL: [Ending; 12] = [
        Ending::Fresh,
        Ending::Unprotected,
        Ending::Replayed,
        Ending::InFlight,
        Ending::Mismatch,
        Ending::Unknown,
        Ending::ReplayedError,
        Ending::StoreError,
        Ending::CompletionFailed,
        Ending::NotCommitted,
        Ending::ToolError,
        Ending::Refused,
    ];

    pub(crate) fn of<T, E>(result: &Result<Outcome<T>, Error<E>>) -> Self {
        match result {
            Ok(Outcome::Fresh(_)) => Ending::Fresh,
            Ok(Outcome::Unprotected(_)) => Ending::Unprotected,
            Ok(Outcome::Replayed(_)) => Ending::Replayed,
            Ok(Outcome::InFlight(_)) => Ending::InFlight,
            Ok(Outcome::Mismatch(_)) => Ending::Mismatch,
            Ok(Outcome::Unknown(_)) => Ending::Unknown,
            Err(Error::Tool { replayed: true, .. }) => Ending::ReplayedError,
            Err(Error::Store(_)) => Ending::StoreError,
            Err(Error::CompletionFailed { .. }) => Ending::CompletionFailed,
            Err(Error::NotCommitted { .. }) => Ending::NotCommitted,
            Err(e) if e.body_ran() => Ending::ToolError,
            Err(_) => Ending::Refused,
        }
    }

    /// The `outcome` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Ending::Fresh => "fresh",
            Ending::Unprotected => "unprotected",
            Ending::Replayed => "replayed",
            Ending::InFlight => "in_flight",
            Ending::Mismatch => "mismatch",
            Ending::Unknown => "unknown",
            Ending::ReplayedError => "replayed_error",
            Ending::StoreError => "store_error",
            Ending::CompletionFailed => "completion_failed",
            Ending::NotCommitted => "not_committed",
            Ending::ToolError => "tool_error",
            Ending::Refused => "refused",
        }
    }

    /// Whether the tool's body ran: the call is an effect.
    pub(crate) fn body_ran(self) -> bool {
        matches!(
            self,
            Ending::Fresh
                | Ending::Unprotected
                | Ending::CompletionFailed
                | Ending::NotCommitted
                | Ending::ToolError
        )
    }

    /// Whether the store failed the call (logged as a warning).
    pub(crate) fn store_failed(self) -> bool {
        matches!(
            self,
            Ending::StoreError | Ending::CompletionFailed | Ending::NotCommitted
        )
    }
}

/// The metric keys of one tool, labels included, built at its first keyed call and kept in its
/// [`ToolInfo`](crate::registry::ToolInfo): reporting a call then builds no key and allocates nothing (a key built from
/// runtime labels costs a vector and a hash at each call, even with no recorder installed).
#[derive(Clone)]
pub(crate) struct ToolMetrics {
    /// By [`Ending`].
    pub(crate) calls: [Key; Ending::ALL.len()],
    /// By [`Ending`].
    pub(crate) durations: [Key; Ending::ALL.len()],
    /// Every run of the tool's body.
    pub(crate) body_runs: Key,
}

impl ToolMetrics {
    pub(crate) fn new(tool: &'static str) -> Self {
        let labelled = |name: &'static str, ending: Ending| {
            Key::from_parts(
                name,
                vec![
                    Label::from_static_parts("tool", tool),
                    Label::from_static_parts("outcome", ending.label()),
                ],
            )
        };
        ToolMetrics {
            calls: Ending::ALL.map(|ending| labelled(CALLS, ending)),
            durations: Ending::ALL.map(|ending| labelled(CALL_DURATION, ending)),
            body_runs: Key::from_parts(BODY_RUNS, vec![Label::from_static_parts("tool", tool)]),
        }
    }
}

impl std::fmt::Debug for ToolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolMetrics").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_are_listed_in_the_order_of_their_keys() {
        for (i, ending) in Ending::ALL.iter().enumerate() {
            assert_eq!(*ending as usize, i, "{ending:?}");
        }
    }

    #[test]
    fn a_tools_keys_carry_its_name_and_each_outcome() {
        let keys = ToolMetrics::new("pay");
        let labels = |key: &Key| -> Vec<(String, String)> {
            key.labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect()
        };
        for ending in Ending::ALL {
            let i = ending as usize;
            for (key, name) in [(&keys.calls[i], CALLS), (&keys.durations[i], CALL_DURATION)] {
                assert_eq!(key.name(), name);
                assert_eq!(
                    labels(key),
                    [
                        ("tool".into(), "pay".into()),
                        ("outcome".into(), ending.label().into())
                    ]
                );
            }
        }
        assert_eq!(keys.body_runs.name(), BODY_RUNS);
        assert_eq!(labels(&keys.body_runs), [("tool".into(), "pay".into())]);
    }
}
