//! What a call of an idempotent tool returns.

use std::time::Duration;

use serde::ser::{Serialize, SerializeStruct, Serializer};

use crate::key::KeyHash;

/// The outcome of one call of an `#[idempotent]` tool.
///
/// A replay is an outcome, not an error: the caller gets the first call's value and the flag
/// that says it was replayed. `Mismatch` and `InFlight` are outcomes too, because the right
/// reaction to each (a new key for a deliberate change; back off and retry with the same key)
/// belongs to the agent loop, not to `?`.
///
/// It serializes into a small JSON object for the model, with a `status` it can act on
/// (`ok`, `in_flight`, `mismatch`, `unknown`) and a `replayed` flag; the raw key is never part of it:
///
/// ```
/// # use idem_core::Outcome;
/// let out: Outcome<u32> = Outcome::Replayed(7);
/// assert_eq!(
///     serde_json::to_string(&out).unwrap(),
///     r#"{"status":"ok","replayed":true,"value":7}"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an idempotent call can be a mismatch or still in flight; look at the outcome"]
pub enum Outcome<T> {
    /// The key was new: the body ran now, its result is stored for replays.
    Fresh(T),
    /// The key was already completed with the same arguments: the body did not run, this is the
    /// stored result of the first call.
    Replayed(T),
    /// The tool's key is optional and the caller passed none: the body ran without protection,
    /// and a retry of this call would run it again.
    ///
    /// (A distinct variant rather than a flag on `Fresh`, so that a `match` cannot ignore it.)
    Unprotected(T),
    /// The key was already used with different arguments: the body did not run. Do not retry
    /// blindly; a deliberate change of arguments is a new intent and needs a new key.
    Mismatch(Mismatch),
    /// Another call with the same key and arguments is running now: the body did not run. Back
    /// off and retry with the same key.
    InFlight(InFlight),
    /// An earlier call with the same key and arguments may have had its effect, and nobody
    /// knows: it failed with an error classified unknown, or crashed and the tool blocks its
    /// orphans. The body did not run. Do not retry: the key stays blocked until the tool's state
    /// check or an operator resolves it (or its TTL ends).
    Unknown(Unknown),
}

/// Details of [`Outcome::Mismatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Mismatch {
    /// The stable name of the tool.
    pub tool: &'static str,
    /// Short hash of the key (never the key itself).
    pub key: KeyHash,
}

/// Details of [`Outcome::InFlight`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InFlight {
    /// The stable name of the tool.
    pub tool: &'static str,
    /// Short hash of the key (never the key itself).
    pub key: KeyHash,
    /// Time left on the running call's lease: after it, a retry may take the call over.
    pub retry_after: Duration,
}

/// Details of [`Outcome::Unknown`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unknown {
    /// The stable name of the tool.
    pub tool: &'static str,
    /// Short hash of the key (never the key itself): what an operator looks the record up by.
    pub key: KeyHash,
}

impl Unknown {
    /// The key of `tool` (by its short hash) is blocked as unknown.
    pub fn new(tool: &'static str, key: KeyHash) -> Self {
        Unknown { tool, key }
    }
}

impl Mismatch {
    /// The key of `tool` (by its short hash) was used with other arguments.
    pub fn new(tool: &'static str, key: KeyHash) -> Self {
        Mismatch { tool, key }
    }
}

impl InFlight {
    /// The key of `tool` (by its short hash) is held by a live call; retry after `retry_after`.
    pub fn new(tool: &'static str, key: KeyHash, retry_after: Duration) -> Self {
        InFlight {
            tool,
            key,
            retry_after,
        }
    }
}

impl<T> Outcome<T> {
    /// Whether the body ran during this call (`Fresh` or `Unprotected`).
    pub fn is_fresh(&self) -> bool {
        matches!(self, Outcome::Fresh(_) | Outcome::Unprotected(_))
    }

    /// Whether this is a stored result of an earlier call.
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }

    /// Whether the key was already used with different arguments.
    pub fn is_mismatch(&self) -> bool {
        matches!(self, Outcome::Mismatch(_))
    }

    /// Whether another call with the same key is still running.
    pub fn is_in_flight(&self) -> bool {
        matches!(self, Outcome::InFlight(_))
    }

    /// Whether an earlier call's effect is unknown and the key is blocked.
    pub fn is_unknown(&self) -> bool {
        matches!(self, Outcome::Unknown(_))
    }

    /// Whether the call was guarded by a key (everything but `Unprotected`).
    pub fn is_protected(&self) -> bool {
        !matches!(self, Outcome::Unprotected(_))
    }

    /// The tool's value, if this outcome carries one (`Fresh`, `Replayed`, `Unprotected`).
    pub fn value(&self) -> Option<&T> {
        match self {
            Outcome::Fresh(v) | Outcome::Replayed(v) | Outcome::Unprotected(v) => Some(v),
            Outcome::Mismatch(_) | Outcome::InFlight(_) | Outcome::Unknown(_) => None,
        }
    }

    /// The tool's value, if this outcome carries one.
    pub fn into_value(self) -> Option<T> {
        match self {
            Outcome::Fresh(v) | Outcome::Replayed(v) | Outcome::Unprotected(v) => Some(v),
            Outcome::Mismatch(_) | Outcome::InFlight(_) | Outcome::Unknown(_) => None,
        }
    }

    /// The status the model sees: `ok`, `in_flight`, `mismatch` or `unknown`.
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Fresh(_) | Outcome::Replayed(_) | Outcome::Unprotected(_) => "ok",
            Outcome::Mismatch(_) => "mismatch",
            Outcome::InFlight(_) => "in_flight",
            Outcome::Unknown(_) => "unknown",
        }
    }

    /// Maps the value, keeping the kind of outcome.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Fresh(v) => Outcome::Fresh(f(v)),
            Outcome::Replayed(v) => Outcome::Replayed(f(v)),
            Outcome::Unprotected(v) => Outcome::Unprotected(f(v)),
            Outcome::Mismatch(m) => Outcome::Mismatch(m),
            Outcome::InFlight(i) => Outcome::InFlight(i),
            Outcome::Unknown(u) => Outcome::Unknown(u),
        }
    }
}

const MISMATCH_MESSAGE: &str = "this request was already made with different arguments; \
     do not retry it as is: a deliberate change is a new request";
const IN_FLIGHT_MESSAGE: &str = "the same request is still being processed; \
     wait and retry it with the same arguments";
const UNKNOWN_MESSAGE: &str = "an earlier attempt of this request may have taken effect and \
     could not be confirmed; do not retry it: it must be checked before anything else runs";
const UNPROTECTED_MESSAGE: &str = "no idempotency key was given: a retry of this call \
     would perform it again";

impl<T: Serialize> Serialize for Outcome<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Outcome::Fresh(v) | Outcome::Replayed(v) => {
                let mut o = s.serialize_struct("Outcome", 3)?;
                o.serialize_field("status", "ok")?;
                o.serialize_field("replayed", &self.is_replayed())?;
                o.serialize_field("value", v)?;
                o.end()
            }
            Outcome::Unprotected(v) => {
                let mut o = s.serialize_struct("Outcome", 5)?;
                o.serialize_field("status", "ok")?;
                o.serialize_field("replayed", &false)?;
                o.serialize_field("protected", &false)?;
                o.serialize_field("message", UNPROTECTED_MESSAGE)?;
                o.serialize_field("value", v)?;
                o.end()
            }
            Outcome::Mismatch(_) => {
                let mut o = s.serialize_struct("Outcome", 3)?;
                o.serialize_field("status", "mismatch")?;
                o.serialize_field("replayed", &false)?;
                o.serialize_field("message", MISMATCH_MESSAGE)?;
                o.end()
            }
            Outcome::InFlight(i) => {
                let mut o = s.serialize_struct("Outcome", 4)?;
                o.serialize_field("status", "in_flight")?;
                o.serialize_field("replayed", &false)?;
                o.serialize_field(
                    "retry_after_ms",
                    &u64::try_from(i.retry_after.as_millis()).unwrap_or(u64::MAX),
                )?;
                o.serialize_field("message", IN_FLIGHT_MESSAGE)?;
                o.end()
            }
            Outcome::Unknown(_) => {
                let mut o = s.serialize_struct("Outcome", 3)?;
                o.serialize_field("status", "unknown")?;
                o.serialize_field("replayed", &false)?;
                o.serialize_field("message", UNKNOWN_MESSAGE)?;
                o.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{KeyPart, derive_key};
    use serde_json::json;

    fn key() -> KeyHash {
        derive_key("t", "tool", &[KeyPart::new("secret-key").unwrap()]).short_hash()
    }

    #[test]
    fn serializes_for_the_model_without_the_key() {
        let cases = [
            (
                Outcome::Fresh(1),
                json!({"status": "ok", "replayed": false, "value": 1}),
            ),
            (
                Outcome::Replayed(1),
                json!({"status": "ok", "replayed": true, "value": 1}),
            ),
            (
                Outcome::Mismatch(Mismatch::new("tool", key())),
                json!({"status": "mismatch", "replayed": false, "message": MISMATCH_MESSAGE}),
            ),
            (
                Outcome::InFlight(InFlight::new("tool", key(), Duration::from_millis(1500))),
                json!({"status": "in_flight", "replayed": false, "retry_after_ms": 1500,
                       "message": IN_FLIGHT_MESSAGE}),
            ),
            (
                Outcome::Unknown(Unknown::new("tool", key())),
                json!({"status": "unknown", "replayed": false, "message": UNKNOWN_MESSAGE}),
            ),
            (
                Outcome::Unprotected(1),
                json!({"status": "ok", "replayed": false, "protected": false,
                       "message": UNPROTECTED_MESSAGE, "value": 1}),
            ),
        ];
        for (outcome, expected) in cases {
            let text = serde_json::to_string(&outcome).unwrap();
            assert!(!text.contains("secret") && !text.contains(&key().to_string()));
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&text).unwrap(),
                expected
            );
            assert_eq!(expected["status"], outcome.status());
        }
    }

    #[test]
    fn helpers_agree_with_the_variant() {
        let fresh = Outcome::Fresh("v");
        assert!(fresh.is_fresh() && fresh.is_protected() && !fresh.is_replayed());
        assert_eq!(fresh.clone().map(str::len), Outcome::Fresh(1));
        assert_eq!(fresh.into_value(), Some("v"));
        let open = Outcome::Unprotected(2);
        assert!(open.is_fresh() && !open.is_protected());
        let m: Outcome<u8> = Outcome::Mismatch(Mismatch::new("tool", key()));
        assert!(m.is_mismatch() && m.value().is_none());
        let u: Outcome<u8> = Outcome::Unknown(Unknown::new("tool", key()));
        assert!(u.is_unknown() && u.is_protected() && !u.is_fresh() && u.into_value().is_none());
    }
}
