//! Progress notifications of a streaming tool, recorded and replayed: the tool emits
//! [`ProgressNote`]s (`out: Emitter<ProgressNote>`), each recorded under its key; the rmcp tool
//! method that calls it takes a [`Progress`] and sends each note as a `notifications/progress`
//! to the caller's `progressToken` ([`Progress::relay`]). A retried call (a new request, with
//! its own token) receives the same notes again, in the same order, then the same result; a
//! retry while the first call still streams receives the notes so far, then the rest as they
//! are recorded.

use std::fmt;

use idem_core::{Error, Outcome};
use idem_runtime::Streamed;
use rmcp::handler::server::common::{AsRequestContext, FromContextPart};
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleServer};
use serde::{Deserialize, Serialize, Serializer};

/// One progress notification of a streaming MCP tool, as MCP's `notifications/progress`
/// carries it: how far the work is (`progress`, rising with each note), out of how much
/// (`total`, if known), and what it is doing (`message`). A tool emits them through an
/// `Emitter<ProgressNote>`; each is recorded before it is sent, and replayed on a retry.
///
/// `progress` and `total` must be finite: a note with `NaN` or an infinity cannot be recorded,
/// and the call ends with that error (`Error::ResultNotStored`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressNote {
    /// How far the work is: more with each note.
    #[serde(serialize_with = "finite")]
    pub progress: f64,
    /// Out of how much, if known.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "finite_or_none"
    )]
    pub total: Option<f64>,
    /// What the tool is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ProgressNote {
    /// A note at `progress`, without a total or a message.
    pub fn new(progress: f64) -> Self {
        ProgressNote {
            progress,
            total: None,
            message: None,
        }
    }

    /// The same note, out of `total`.
    pub fn total(self, total: f64) -> Self {
        ProgressNote {
            total: Some(total),
            ..self
        }
    }

    /// The same note, saying `message`.
    pub fn message(self, message: impl Into<String>) -> Self {
        ProgressNote {
            message: Some(message.into()),
            ..self
        }
    }
}

fn finite<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    if !value.is_finite() {
        return Err(serde::ser::Error::custom(format!(
            "a progress note's progress and total must be finite numbers, not {value}"
        )));
    }
    serializer.serialize_f64(*value)
}

fn finite_or_none<S: Serializer>(value: &Option<f64>, serializer: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => finite(value, serializer),
        None => serializer.serialize_none(),
    }
}

/// Where a `tools/call`'s progress goes: the client that sent it, and the `progressToken` of its
/// `_meta` (none when the client asked for no progress). An rmcp tool method takes it as a
/// parameter (rmcp extracts it from the request; it is not part of the tool's input schema),
/// and answers with [`Progress::relay`] of its streaming tool's call.
#[derive(Clone)]
pub struct Progress {
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl<C: AsRequestContext> FromContextPart<C> for Progress {
    fn from_context_part(context: &mut C) -> Result<Self, rmcp::ErrorData> {
        let context = context.as_request_context();
        Ok(Progress {
            peer: context.peer.clone(),
            token: context.meta.get_progress_token(),
        })
    }
}

impl Progress {
    /// The request's `progressToken`, if it sent one.
    pub fn token(&self) -> Option<&ProgressToken> {
        self.token.as_ref()
    }

    /// Sends each note of a streaming tool's `call` to the client as a
    /// `notifications/progress` (when it sent a `progressToken`), in order, each once it is
    /// recorded (a fresh call), or as recorded (a replay, or a call that follows one still
    /// streaming); then answers the call's end, which an rmcp tool method returns as is. A
    /// notification the client cannot receive (it went away) stops no call: the stream is read
    /// to its end, so that a fresh call's body finishes and its result is recorded.
    pub async fn relay<V, E>(
        &self,
        call: Result<Outcome<Streamed<ProgressNote, V, E>>, Error<E>>,
    ) -> Result<Outcome<V>, Error<E>> {
        let (streamed, again): (_, fn(V) -> Outcome<V>) = match call? {
            Outcome::Fresh(streamed) => (streamed, Outcome::Fresh),
            Outcome::Replayed(streamed) => (streamed, Outcome::Replayed),
            Outcome::Unprotected(streamed) => (streamed, Outcome::Unprotected),
            Outcome::Mismatch(m) => return Ok(Outcome::Mismatch(m)),
            Outcome::InFlight(i) => return Ok(Outcome::InFlight(i)),
            Outcome::Unknown(u) => return Ok(Outcome::Unknown(u)),
        };
        let mut streamed = streamed;
        let mut listening = self.token.is_some();
        while let Some(note) = streamed.next_chunk().await {
            if let (true, Some(token)) = (listening, &self.token) {
                let mut param = ProgressNotificationParam::new(token.clone(), note.progress);
                param.total = note.total;
                param.message = note.message;
                listening = self.peer.notify_progress(param).await.is_ok();
            }
        }
        streamed.finish().await.map(again)
    }
}

#[cfg(test)]
mod tests {
    use super::ProgressNote;

    #[test]
    fn notes_are_recorded_as_json_and_only_when_finite() {
        let note = ProgressNote::new(3.0).total(10.0).message("row 3 of 10");
        let json = serde_json::to_string(&note).unwrap();
        assert_eq!(
            json,
            r#"{"progress":3.0,"total":10.0,"message":"row 3 of 10"}"#
        );
        assert_eq!(serde_json::from_str::<ProgressNote>(&json).unwrap(), note);
        let bare = serde_json::to_string(&ProgressNote::new(1.5)).unwrap();
        assert_eq!(bare, r#"{"progress":1.5}"#);
        let err = serde_json::to_string(&ProgressNote::new(f64::NAN)).unwrap_err();
        assert!(err.to_string().contains("must be finite"), "{err}");
        let err = serde_json::to_string(&ProgressNote::new(1.0).total(f64::INFINITY)).unwrap_err();
        assert!(err.to_string().contains("must be finite"), "{err}");
    }
}
