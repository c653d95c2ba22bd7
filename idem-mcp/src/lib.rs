//! MCP tools (rmcp): a tool that returns `Result<Outcome<T>, idem::Error<E>>` answers
//! `tools/call` with structured content the model can act on.
//!
//! The structured content is the outcome as `Outcome`'s `Serialize` writes it: `status`
//! (`ok`, `in_flight`, `mismatch`, `unknown`), `replayed`, the `value` when there is one, and a
//! `message` that tells the model what to do otherwise. The same JSON is the text content, for
//! clients that read only text. Anything but `ok` is flagged `isError`, so that a model does not
//! take a call that did not happen for one that did. Errors carry their message, never a key.
//!
//! Stack `#[idempotent]` **above** rmcp's `#[tool]` inside a `#[tool_router]` impl:
//!
//! ```text
//! #[tool_router]
//! impl Payments {
//!     #[idempotent(key = "params.0.idempotency_key", mutating, name = "payments.register")]
//!     #[tool(description = "Charge a customer once per idempotency_key")]
//!     async fn register_payment(&self, params: Parameters<Charge>) -> Result<Payment, PaymentError> { … }
//! }
//! ```
//!
//! (`#[tool]` turns the method into a fn returning a boxed future, which `#[idempotent]`, an
//! attribute for `async fn`s, refuses: the other order is a compile error that says so.)
//!
//! Key parts can also come from the request's `_meta`, where the agent's host (not the model)
//! puts them: take a [`MetaKeys`] parameter and name its fields in `key`. The model then never
//! sees, invents or reuses the key, and the tool's description says so.
//!
//! ```text
//! #[idempotent(key = "meta.run_id, meta.step_id", mutating, required)]
//! #[tool]
//! async fn charge(&self, params: Parameters<Charge>, meta: MetaKeys) -> Result<Payment, PaymentError> { … }
//! ```
//!
//! A tool that reports progress streams [`ProgressNote`]s (`out: Emitter<ProgressNote>`, see
//! the guide's Streams chapter): each is recorded under the call's key. The rmcp tool method
//! calls it and hands its call to a [`Progress`] parameter, which sends each note to the
//! client as `notifications/progress` and answers the call's end; a retried call receives the
//! same notifications again, then the same result:
//!
//! ```text
//! #[idempotent(key = "meta.run_id, meta.step_id", mutating, required, name = "reports.export")]
//! async fn export(meta: MetaKeys, rows: u32, out: Emitter<ProgressNote>) -> Result<Export, ExportError> { … }
//!
//! #[tool]
//! async fn export_ledger(&self, params: Parameters<Rows>, meta: MetaKeys, progress: Progress)
//!     -> Result<Outcome<Export>, idem::Error<ExportError>> {
//!     progress.relay(export(meta, params.0.rows).await).await
//! }
//! ```

mod lift;
mod progress;

pub use lift::{LiftKeys, LiftKeysLayer, lift_key, lift_keys};
pub use progress::{Progress, ProgressNote};

/// The name idem's idempotency goes by in a server's experimental capabilities (MCP has no
/// standard one yet: its proposal, SEP-3182, was closed without merging).
pub const CAPABILITY: &str = "idempotency";

/// `capabilities` with idem's idempotency advertised in `experimental`, under [`CAPABILITY`]:
/// `{"keys": ["_meta.idempotencyKey", "_meta.idempotency_key"]}`, where a client puts the key
/// of a `tools/call` for the tools that read it from `_meta` ([`MetaKeys`]). A call that sends
/// a key already used with other arguments is answered `isError` with `status: "mismatch"`,
/// and runs nothing.
pub fn advertise(
    mut capabilities: rmcp::model::ServerCapabilities,
) -> rmcp::model::ServerCapabilities {
    let mut idempotency = serde_json::Map::new();
    idempotency.insert(
        "keys".to_owned(),
        serde_json::json!(["_meta.idempotencyKey", "_meta.idempotency_key"]),
    );
    capabilities
        .experimental
        .get_or_insert_with(Default::default)
        .insert(CAPABILITY.to_owned(), idempotency);
    capabilities
}

use rmcp::handler::server::common::{AsRequestContext, FromContextPart};
use serde::Serialize;

/// Key parts an MCP host sends in a `tools/call` request's `_meta`, out of the model's sight:
/// `_meta.idempotency_key` (or `_meta.idempotencyKey`, as MCP's idempotency proposal and
/// earlier community practice spell it), `_meta.run_id` and `_meta.step_id`, each a string
/// when present.
/// An rmcp tool method takes it as a parameter (rmcp extracts it from the request, and it is
/// not part of the tool's input schema); `#[idempotent(key = "meta.run_id, meta.step_id")]`
/// then keys the call by them. A present value that is not a string is refused with
/// `invalid_params` before the tool runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MetaKeys {
    /// `_meta.idempotency_key` or `_meta.idempotencyKey`: one key naming the call.
    pub idempotency_key: Option<String>,
    /// `_meta.run_id`: the agent run the call belongs to.
    pub run_id: Option<String>,
    /// `_meta.step_id`: the step of that run.
    pub step_id: Option<String>,
}

impl MetaKeys {
    /// Reads the key parts from a request's `_meta` object.
    pub fn from_meta(meta: &serde_json::Map<String, serde_json::Value>) -> Result<Self, String> {
        let read = |name: &str| match meta.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!(
                "`_meta.{name}` must be a string, not {}",
                match other {
                    serde_json::Value::Bool(_) => "a boolean",
                    serde_json::Value::Number(_) => "a number",
                    serde_json::Value::Array(_) => "an array",
                    _ => "an object",
                }
            )),
        };
        let idempotency_key = match (read("idempotency_key")?, read("idempotencyKey")?) {
            (Some(snake), Some(camel)) if snake != camel => {
                return Err(
                    "`_meta.idempotency_key` and `_meta.idempotencyKey` name two different keys; \
                     send one"
                        .to_owned(),
                );
            }
            (snake, camel) => snake.or(camel),
        };
        Ok(MetaKeys {
            idempotency_key,
            run_id: read("run_id")?,
            step_id: read("step_id")?,
        })
    }
}

impl<C: AsRequestContext> FromContextPart<C> for MetaKeys {
    fn from_context_part(context: &mut C) -> Result<Self, rmcp::ErrorData> {
        // Read, not taken: other extractors of the same call still see the whole `_meta`.
        let meta = &context.as_request_context().meta;
        MetaKeys::from_meta(&meta.0.0)
            .map_err(|message| rmcp::ErrorData::invalid_params(message, None))
    }
}

#[cfg(test)]
mod tests {
    use super::MetaKeys;
    use serde_json::json;

    #[test]
    fn meta_keys_are_strings_or_absent() {
        let meta = json!({"run_id": "run-7", "step_id": "3", "progressToken": 1});
        let keys = MetaKeys::from_meta(meta.as_object().unwrap()).unwrap();
        assert_eq!(keys.run_id.as_deref(), Some("run-7"));
        assert_eq!(keys.step_id.as_deref(), Some("3"));
        assert_eq!(keys.idempotency_key, None);
        let empty = MetaKeys::from_meta(&serde_json::Map::new()).unwrap();
        assert_eq!(empty, MetaKeys::default());
        let bad = json!({"step_id": 3});
        let err = MetaKeys::from_meta(bad.as_object().unwrap()).unwrap_err();
        assert_eq!(err, "`_meta.step_id` must be a string, not a number");
    }

    #[test]
    fn the_key_may_be_spelled_as_mcps_proposal_spells_it() {
        let camel = json!({"idempotencyKey": "pay-7"});
        let keys = MetaKeys::from_meta(camel.as_object().unwrap()).unwrap();
        assert_eq!(keys.idempotency_key.as_deref(), Some("pay-7"));
        let both = json!({"idempotencyKey": "pay-7", "idempotency_key": "pay-7"});
        let keys = MetaKeys::from_meta(both.as_object().unwrap()).unwrap();
        assert_eq!(
            keys.idempotency_key.as_deref(),
            Some("pay-7"),
            "the same key twice"
        );
        let two = json!({"idempotencyKey": "pay-7", "idempotency_key": "pay-8"});
        let err = MetaKeys::from_meta(two.as_object().unwrap()).unwrap_err();
        assert!(err.contains("two different keys"), "{err}");
        let bad = json!({"idempotencyKey": 7});
        let err = MetaKeys::from_meta(bad.as_object().unwrap()).unwrap_err();
        assert_eq!(err, "`_meta.idempotencyKey` must be a string, not a number");
    }
}
