//! MCP tools (rmcp): a tool that returns `Result<Outcome<T>, idem::Error<E>>` answers
//! `tools/call` with structured content the model can act on.
//!
//! The structured content is the outcome as [`Outcome`]'s `Serialize` writes it: `status`
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

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult};
use serde::Serialize;

use crate::error::Error;
use crate::outcome::Outcome;

impl<T: Serialize> IntoCallToolResult for Outcome<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        let json = serde_json::to_value(&self).map_err(|e| {
            rmcp::ErrorData::internal_error(
                format!("the tool's value does not serialize: {e}"),
                None,
            )
        })?;
        // `structured` also writes the JSON as the text content, for clients that read only text.
        let mut result = CallToolResult::structured(json);
        result.is_error = Some(self.status() != "ok");
        Ok(result.into())
    }
}

impl<E: std::fmt::Display> IntoCallToolResult for Error<E> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        let json = serde_json::json!({
            "status": "error",
            "replayed": matches!(self, Error::Tool { replayed: true, .. }),
            "retry": self.is_store(),
            "message": self.to_string(),
        });
        let mut result = CallToolResult::structured(json);
        result.is_error = Some(true);
        Ok(result.into())
    }
}
