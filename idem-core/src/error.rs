//! Errors of idempotent calls, of stores and of opening a runtime.

use std::error::Error as StdError;
use std::fmt;

use crate::canonical::CanonicalError;
use crate::key::{InvalidKey, KeyHash};

/// What a tool's error means for its key: did the effect happen?
///
/// A tool picks one class for all its errors with `on_error = "release" | "store" | "unknown"`,
/// or lets its error type decide error by error with `on_error = "classify"` and
/// [`ClassifyError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// No effect happened (validation failed, the provider refused before acting): the claim is
    /// released and a corrected retry runs the body.
    Release,
    /// The call ran to a definite end that must be replayed as is (a declined card): the error
    /// is stored, and retries get it back without running the body.
    Store,
    /// The effect may have happened (the provider timed out after the request left): the key is
    /// blocked as `unknown`. It never runs the body again blindly: the tool's state check
    /// (`check = …`) decides at the next call, or an operator resolves it.
    Unknown,
}

/// An error type that classifies each of its values, for tools with `on_error = "classify"`.
///
/// The default says [`ErrorClass::Release`], as `on_error = "release"` does; override
/// [`ClassifyError::class`] to tell the cases apart:
///
/// ```
/// use idem_core::{ClassifyError, ErrorClass};
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// enum ChargeError {
///     Invalid(String),
///     Declined,
///     ProviderTimedOut,
/// }
///
/// impl ClassifyError for ChargeError {
///     fn class(&self) -> ErrorClass {
///         match self {
///             ChargeError::Invalid(_) => ErrorClass::Release,
///             ChargeError::Declined => ErrorClass::Store,
///             ChargeError::ProviderTimedOut => ErrorClass::Unknown,
///         }
///     }
/// }
/// ```
pub trait ClassifyError {
    /// The class of this error.
    fn class(&self) -> ErrorClass {
        ErrorClass::Release
    }
}

/// The error of a call of an `#[idempotent]` tool: `E` is the tool's own error type.
///
/// Every variant but [`Error::Tool`] means the tool body did **not** run during this call,
/// except [`Error::LeaseLost`], [`Error::ResultNotStored`], [`Error::CompletionFailed`],
/// [`Error::NotCommitted`] and [`Error::StreamNotRecorded`], which say that it ran but its
/// result could not be recorded. No message contains a raw key or argument value.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E> {
    /// The tool returned an error. `replayed` is true when this is the stored error of an earlier
    /// call, false when the body just ran; `class` says what became of the key.
    Tool {
        /// The tool's error.
        error: E,
        /// Whether it was replayed from the store.
        replayed: bool,
        /// How the tool's `on_error` policy classified the error: `Release` (the key is free
        /// again; a corrected retry runs), `Store` (stored; a retry replays it) or `Unknown`
        /// (the effect may have happened; the key is blocked, and later calls get
        /// [`Outcome::Unknown`](crate::Outcome::Unknown) until a state check or an operator decides).
        class: ErrorClass,
    },
    /// The store failed or could not be reached; the call fails closed.
    Store(StoreError),
    /// A key part was refused before the store was touched.
    InvalidKey {
        /// The tool's stable name.
        tool: &'static str,
        /// The key part, as declared in `key = "…"`.
        part: &'static str,
        /// What is wrong with it.
        reason: InvalidKey,
    },
    /// The tool requires a key (`required`) and the caller passed `None`.
    MissingKey {
        /// The tool's stable name.
        tool: &'static str,
        /// The key part that was `None`.
        part: &'static str,
    },
    /// The tool takes a key part (`run_id`, `step_id`) from the durable run it is called in,
    /// and was called outside a run's step.
    NoRun {
        /// The tool's stable name.
        tool: &'static str,
        /// The key part the run would have given.
        part: &'static str,
    },
    /// The tenant of the scope is empty, longer than 255 bytes, or holds a NUL character.
    InvalidTenant {
        /// The tool's stable name.
        tool: &'static str,
    },
    /// The arguments have no canonical JSON form (a `NaN`, a map with non-string keys, …).
    Unfingerprintable {
        /// The tool's stable name.
        tool: &'static str,
        /// Why.
        source: CanonicalError,
    },
    /// No idem runtime is in scope: neither `Scope::run` nor `Idem::install` was used.
    NoRuntime {
        /// The tool's stable name.
        tool: &'static str,
    },
    /// The body ran, but its lease lapsed meanwhile and another call took the key over; this
    /// result was not stored (the new owner's is).
    LeaseLost {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
    },
    /// The body ran, but its result could not be encoded for the store; the key stays claimed
    /// until its lease lapses.
    ResultNotStored {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
        /// The encoding error.
        source: serde_json::Error,
    },
    /// The body ran, but its result could not be recorded: the store failed at every attempt
    /// for the whole completion window (the call's lease unless the runtime sets less; one
    /// attempt for an error that will not pass, such as a damaged schema), or the last
    /// attempt's answer was lost. The key stays in flight until its lease lapses; then the next
    /// call takes it over as the tool's `on_orphan` (or its state check) says.
    CompletionFailed {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
        /// How many times the completion was sent.
        attempts: u32,
        /// The store's last error.
        source: StoreError,
    },
    /// The body of a transactional tool (`#[idempotent(…, transactional)]`) ran, but its
    /// transaction did not commit: recording the result, or the commit itself, failed. Its writes
    /// and its record are kept together or not at all (all of them only if the commit's answer
    /// was lost after the server committed): a retry with the same key replays or runs again.
    NotCommitted {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key; `None` for a call without its optional key (unprotected).
        key: Option<KeyHash>,
        /// The store's error.
        source: StoreError,
    },
    /// The tool's state check (`check = …`) failed, so whether the effect already happened is
    /// unknown: the body did not run, and a claim the call held stays held until its lease lapses.
    CheckFailed {
        /// The tool's stable name.
        tool: &'static str,
        /// The check's error.
        error: E,
    },
    /// The body ran, but its encoded result (or stored error) is larger than the runtime keeps
    /// (the runtime's `IdemBuilder::max_result_bytes`). The record says
    /// so, nothing is truncated, and every retry gets this error (`replayed: true`) without
    /// running the body again.
    ResultTooLarge {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
        /// The encoded size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
        /// Whether this is a retry answered from the record.
        replayed: bool,
    },
    /// The stored result of an earlier call could not be decoded into the tool's return type
    /// (the type changed since it was stored).
    StoredResultUnreadable {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// A batch tool was given more items than one call takes; nothing was claimed and the body
    /// did not run. Split the items over several calls.
    BatchTooLarge {
        /// The tool's stable name.
        tool: &'static str,
        /// How many items were given.
        items: usize,
        /// The most one call takes.
        limit: usize,
    },
    /// An item of a batch has the same key as an earlier item of the same batch: it was not
    /// claimed, and the body did not run on it (the earlier item's answer is the key's).
    DuplicateInBatch {
        /// The tool's stable name.
        tool: &'static str,
        /// The item's position (from 0).
        item: usize,
        /// The position of the earlier item with the same key.
        first: usize,
    },
    /// A batch tool's body answered another number of results than the items it was given:
    /// its items may have had their effect, and which result is whose cannot be told, so each
    /// of them is blocked as `unknown` until a state check or an operator decides.
    BatchAnswer {
        /// The tool's stable name.
        tool: &'static str,
        /// How many items the body was given.
        expected: usize,
        /// How many results it answered.
        answered: usize,
    },
    /// A streaming tool's body was stopped because a chunk it emitted could not be recorded:
    /// the store failed at every attempt for the whole completion window. The chunks before it
    /// are recorded; the key stays in flight until its lease lapses, then the next call takes
    /// it over as the tool's `on_orphan` says.
    StreamNotRecorded {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
        /// The position of the chunk (from 0).
        chunk: u64,
        /// The store's last error.
        source: StoreError,
    },
    /// A stream being replayed or followed ended before its end: the call that produced it
    /// died and another took the key over, or its record was released or blocked as unknown.
    /// The chunks received so far belong to a run that did not finish; retry with the same key.
    StreamInterrupted {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
        /// How many chunks were received before the stream broke off.
        received: u64,
    },
}

impl<E> Error<E> {
    /// The tool's own error, if this is one.
    pub fn tool_error(&self) -> Option<&E> {
        match self {
            Error::Tool { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The tool's own error, if this is one.
    pub fn into_tool_error(self) -> Option<E> {
        match self {
            Error::Tool { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether the tool body may have run during this call.
    pub fn body_ran(&self) -> bool {
        matches!(
            self,
            Error::Tool {
                replayed: false,
                ..
            } | Error::LeaseLost { .. }
                | Error::ResultNotStored { .. }
                | Error::CompletionFailed { .. }
                | Error::NotCommitted { .. }
                | Error::BatchAnswer { .. }
                | Error::StreamNotRecorded { .. }
                | Error::ResultTooLarge {
                    replayed: false,
                    ..
                }
        )
    }

    /// Whether this is a store failure (retrying later with the same key is safe).
    pub fn is_store(&self) -> bool {
        matches!(self, Error::Store(_))
    }

    /// Changes the tool's error type; every other variant is kept.
    pub fn map_tool<F>(self, f: impl FnOnce(E) -> F) -> Error<F> {
        match self {
            Error::Tool {
                error,
                replayed,
                class,
            } => Error::Tool {
                error: f(error),
                replayed,
                class,
            },
            Error::Store(e) => Error::Store(e),
            Error::InvalidKey { tool, part, reason } => Error::InvalidKey { tool, part, reason },
            Error::MissingKey { tool, part } => Error::MissingKey { tool, part },
            Error::NoRun { tool, part } => Error::NoRun { tool, part },
            Error::InvalidTenant { tool } => Error::InvalidTenant { tool },
            Error::Unfingerprintable { tool, source } => Error::Unfingerprintable { tool, source },
            Error::NoRuntime { tool } => Error::NoRuntime { tool },
            Error::LeaseLost { tool, key } => Error::LeaseLost { tool, key },
            Error::ResultNotStored { tool, key, source } => {
                Error::ResultNotStored { tool, key, source }
            }
            Error::CompletionFailed {
                tool,
                key,
                attempts,
                source,
            } => Error::CompletionFailed {
                tool,
                key,
                attempts,
                source,
            },
            Error::NotCommitted { tool, key, source } => Error::NotCommitted { tool, key, source },
            Error::CheckFailed { tool, error } => Error::CheckFailed {
                tool,
                error: f(error),
            },
            Error::StoredResultUnreadable { tool, key, source } => {
                Error::StoredResultUnreadable { tool, key, source }
            }
            Error::ResultTooLarge {
                tool,
                key,
                size,
                limit,
                replayed,
            } => Error::ResultTooLarge {
                tool,
                key,
                size,
                limit,
                replayed,
            },
            Error::BatchTooLarge { tool, items, limit } => {
                Error::BatchTooLarge { tool, items, limit }
            }
            Error::DuplicateInBatch { tool, item, first } => {
                Error::DuplicateInBatch { tool, item, first }
            }
            Error::BatchAnswer {
                tool,
                expected,
                answered,
            } => Error::BatchAnswer {
                tool,
                expected,
                answered,
            },
            Error::StreamNotRecorded {
                tool,
                key,
                chunk,
                source,
            } => Error::StreamNotRecorded {
                tool,
                key,
                chunk,
                source,
            },
            Error::StreamInterrupted {
                tool,
                key,
                received,
            } => Error::StreamInterrupted {
                tool,
                key,
                received,
            },
        }
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Tool {
                error,
                replayed: true,
                ..
            } => write!(f, "{error} (replayed from the first call)"),
            Error::Tool {
                error,
                class: ErrorClass::Unknown,
                ..
            } => write!(
                f,
                "{error} (the effect may have happened: the key is blocked until reconciled)"
            ),
            Error::Tool { error, .. } => fmt::Display::fmt(error, f),
            Error::Store(e) => fmt::Display::fmt(e, f),
            Error::InvalidKey { tool, part, reason } => {
                write!(f, "tool `{tool}`: key part `{part}` is invalid: {reason}")
            }
            Error::MissingKey { tool, part } => write!(
                f,
                "tool `{tool}` requires an idempotency key, but `{part}` is None"
            ),
            Error::NoRun { tool, part } => write!(
                f,
                "tool `{tool}` takes its key part `{part}` from the durable run it is called in, \
                 and was called outside a run's step; call it inside `Run::step` (or an engine \
                 integration's step), or give the tool a `{part}` parameter"
            ),
            Error::InvalidTenant { tool } => {
                write!(
                    f,
                    "tool `{tool}`: the tenant must be 1 to 255 bytes long, without NUL"
                )
            }
            Error::Unfingerprintable { tool, .. } => {
                write!(f, "tool `{tool}`: the arguments cannot be fingerprinted")
            }
            Error::NoRuntime { tool } => write!(
                f,
                "tool `{tool}` was called with no idem runtime in scope; \
                 use `idem.scope(tenant).run(…)` or `idem.install(tenant)`"
            ),
            Error::LeaseLost { tool, key } => write!(
                f,
                "tool `{tool}` (key {key}): the lease lapsed while the body ran and another \
                 call took over; this result was not stored"
            ),
            Error::ResultNotStored { tool, key, .. } => write!(
                f,
                "tool `{tool}` (key {key}): the body ran but its result could not be encoded"
            ),
            Error::CheckFailed { tool, error } => write!(
                f,
                "tool `{tool}`: its state check failed ({error}); the body did not run"
            ),
            Error::CompletionFailed {
                tool,
                key,
                attempts,
                ..
            } => write!(
                f,
                "tool `{tool}` (key {key}): the body ran but its result was not recorded \
                 ({attempts} attempt{s} failed); the key stays in flight until its lease lapses",
                s = if *attempts == 1 { "" } else { "s" }
            ),
            Error::NotCommitted { tool, key, .. } => {
                write!(f, "tool `{tool}`")?;
                if let Some(key) = key {
                    write!(f, " (key {key})")?;
                }
                write!(
                    f,
                    ": the body ran but its transaction did not commit; its writes and its \
                     record are kept together or not at all, and a retry with the same key \
                     replays or runs again"
                )
            }
            Error::ResultTooLarge {
                tool,
                key,
                size,
                limit,
                ..
            } => write!(
                f,
                "tool `{tool}` (key {key}): its result is {size} bytes, over the limit of {limit} \
                 the store keeps; the call took effect once, and its result cannot be replayed"
            ),
            Error::StoredResultUnreadable { tool, key, .. } => write!(
                f,
                "tool `{tool}` (key {key}): the stored result does not decode into the \
                 tool's return type"
            ),
            Error::BatchTooLarge { tool, items, limit } => write!(
                f,
                "tool `{tool}` was given {items} items; one call takes at most {limit}: split \
                 them over several calls (nothing ran)"
            ),
            Error::DuplicateInBatch { tool, item, first } => write!(
                f,
                "tool `{tool}`: item {item} has the same key as item {first} of the same batch; \
                 it was not run (give each item its own key)"
            ),
            Error::BatchAnswer {
                tool,
                expected,
                answered,
            } => write!(
                f,
                "tool `{tool}`: the batch body answered {answered} results for {expected} items; \
                 its items may have had their effect and are blocked as unknown until reconciled \
                 (answer one result per item, in order)"
            ),
            Error::StreamNotRecorded {
                tool, key, chunk, ..
            } => write!(
                f,
                "tool `{tool}` (key {key}): chunk {chunk} of its stream could not be recorded, \
                 and the body was stopped; the key stays in flight until its lease lapses"
            ),
            Error::StreamInterrupted {
                tool,
                key,
                received,
            } => write!(
                f,
                "tool `{tool}` (key {key}): the stream broke off after {received} chunks (the \
                 call producing it stopped before its end); retry with the same key"
            ),
        }
    }
}

impl<E: StdError + 'static> StdError for Error<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Tool { error, .. } => error.source(),
            Error::Store(e) => e.source(),
            Error::InvalidKey { reason, .. } => Some(reason),
            Error::Unfingerprintable { source, .. } => Some(source),
            Error::ResultNotStored { source, .. }
            | Error::StoredResultUnreadable { source, .. } => Some(source),
            Error::CompletionFailed { source, .. }
            | Error::NotCommitted { source, .. }
            | Error::StreamNotRecorded { source, .. } => Some(source),
            Error::CheckFailed { error, .. } => error.source(),
            Error::MissingKey { .. }
            | Error::NoRun { .. }
            | Error::InvalidTenant { .. }
            | Error::NoRuntime { .. }
            | Error::LeaseLost { .. }
            | Error::ResultTooLarge { .. }
            | Error::BatchTooLarge { .. }
            | Error::DuplicateInBatch { .. }
            | Error::BatchAnswer { .. }
            | Error::StreamInterrupted { .. } => None,
        }
    }
}

impl<E> From<StoreError> for Error<E> {
    fn from(e: StoreError) -> Self {
        Error::Store(e)
    }
}

/// What went wrong in a store, coarsely, for deciding what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store cannot be reached or opened (connection refused, file not writable).
    Unavailable,
    /// The store did not answer in time (a lock held too long, a slow server).
    Timeout,
    /// The schema is missing, damaged, or newer than this build understands.
    Schema,
    /// A record in the store cannot be read back.
    Corrupt,
    /// The store is shutting down or its worker is gone.
    Closed,
    /// The store does not offer the operation (a store written before streams, asked to
    /// record one).
    Unsupported,
    /// Anything else the driver reported.
    Other,
}

/// A store failure: which backend, what kind, and the driver's error as its `source()`.
///
/// The message names the backend and the operation, never a key.
#[derive(Debug)]
pub struct StoreError {
    backend: &'static str,
    kind: StoreErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl StoreError {
    /// A store error with a message and no underlying cause.
    pub fn new(backend: &'static str, kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            backend,
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A store error caused by a driver error (kept as `source()`).
    pub fn with_source(
        backend: &'static str,
        kind: StoreErrorKind,
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        StoreError {
            backend,
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The backend that failed: `memory`, `sqlite`, ….
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} store: {}", self.backend, self.message)
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// Why a store could not be opened ([`admin::open`](crate::store::admin::open), `Idem::open`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL is malformed or has an unknown option.
    #[error("store URL `{url}` is malformed: {reason}")]
    InvalidUrl {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No backend for that scheme in this build.
    #[error("store scheme `{scheme}` is not supported by this build; available: {available}")]
    UnsupportedScheme {
        /// The scheme that was asked for.
        scheme: String,
        /// The schemes this build supports.
        available: String,
    },
    /// The backend failed to open.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The URL with the password of its user-info part (`user:password@`) replaced by `***`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_passwords() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/idem?x=1"),
            "postgres://app:***@db:5432/idem?x=1"
        );
        assert_eq!(redact_url("sqlite://idem.db"), "sqlite://idem.db");
        assert_eq!(redact_url("redis://user@h/0"), "redis://user@h/0");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("card declined")]
    struct Declined;

    #[test]
    fn tool_errors_show_through_and_say_when_replayed() {
        let fresh: Error<Declined> = Error::Tool {
            error: Declined,
            replayed: false,
            class: ErrorClass::Release,
        };
        assert_eq!(fresh.to_string(), "card declined");
        assert!(fresh.body_ran());
        let unknown: Error<Declined> = Error::Tool {
            error: Declined,
            replayed: false,
            class: ErrorClass::Unknown,
        };
        assert_eq!(
            unknown.to_string(),
            "card declined (the effect may have happened: the key is blocked until reconciled)"
        );
        let replay: Error<Declined> = Error::Tool {
            error: Declined,
            replayed: true,
            class: ErrorClass::Store,
        };
        assert_eq!(
            replay.to_string(),
            "card declined (replayed from the first call)"
        );
        assert!(!replay.body_ran());
    }

    #[test]
    fn store_errors_keep_the_cause_in_source_only() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = StoreError::with_source("sqlite", StoreErrorKind::Unavailable, "cannot open", io);
        assert_eq!(e.to_string(), "sqlite store: cannot open");
        assert_eq!(e.source().unwrap().to_string(), "denied");
        assert_eq!(e.kind(), StoreErrorKind::Unavailable);
        let wrapped: Error<Declined> = e.into();
        assert!(wrapped.is_store() && !wrapped.body_ran());
    }
}
