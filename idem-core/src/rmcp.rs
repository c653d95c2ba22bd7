//! MCP (rmcp): an outcome and an error answer `tools/call` with structured content the model
//! can act on (feature `rmcp`; the MCP integration is the `idem-mcp` crate, whose docs say how
//! to write a tool).
//!
//! These two impls live here, beside [`Outcome`] and [`Error`], because Rust lets a trait of
//! another crate (rmcp's `IntoCallToolResult`) be implemented only in the crate of the trait or
//! of the type.

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
