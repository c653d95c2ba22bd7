//! rig tools (rig-core 0.44): key parts from rig's [`ToolContext`], where the agent loop (not
//! the model) puts the run and the step it is at.
//!
//! The host inserts a [`RunStep`] into the context it dispatches the tool with; the tool takes
//! the context as a parameter (rig keeps it out of the model's arguments) and names it as its
//! key. The model never sees, invents or reuses the key, and the tool's description says so.
//!
//! ```text
//! #[idempotent(key = "ctx", mutating, required, name = "rig.charge")]
//! #[rig_core::rig_tool]
//! async fn charge(ctx: &mut rig_core::tool::ToolContext, customer: String, amount_cents: u64)
//!     -> Result<u64, Declined> { … }
//!
//! let mut ctx = ToolContext::new();
//! ctx.insert(RunStep::new("run-9", "3"))?;
//! CHARGE.call_with_context(args, &mut ctx).await?;
//! ```
//!
//! The context is never part of the fingerprint (it carries the host's own data, which changes
//! between calls); a context without a `RunStep` is a missing key (`Error::MissingKey` with
//! `required`, an unprotected call without).

use rig_core::tool::{ContextValue, ToolContext};
use serde::{Deserialize, Serialize};

use idem_core::canonical::CanonicalError;
use idem_core::key::{InvalidKey, KeyPart, KeyPartProbe};
use idem_core::validate_key_string;

/// The run and the step an agent loop is at: the key of a rig tool that names its
/// [`ToolContext`] in `key`. Each is a key string (1 to 255 visible ASCII characters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStep {
    /// The agent run.
    pub run_id: String,
    /// The step of that run.
    pub step_id: String,
}

impl RunStep {
    /// A run and a step.
    pub fn new(run_id: impl Into<String>, step_id: impl Into<String>) -> Self {
        RunStep {
            run_id: run_id.into(),
            step_id: step_id.into(),
        }
    }
}

impl ContextValue for RunStep {
    const KEY: &'static str = "idem.run_step";
}

/// The key part of a context: its [`RunStep`], or `None` when the host put none there.
fn context_key_part(context: &ToolContext) -> Result<Option<KeyPart>, InvalidKey> {
    let step = context.get::<RunStep>().map_err(|_| {
        // The decoder's message may quote the value: say what is wrong, not what is there.
        InvalidKey::Unserializable(CanonicalError::Custom(format!(
            "the tool context's `{}` is not a run and step id",
            RunStep::KEY
        )))
    })?;
    let Some(step) = step else {
        return Ok(None);
    };
    validate_key_string(&step.run_id)?;
    validate_key_string(&step.step_id)?;
    KeyPart::new(&step).map(Some)
}

/// Chosen for a rig [`ToolContext`] named as a key part: its [`RunStep`]. The attribute's
/// machinery (the facade names it as `idem::__private::ContextKeyPart` when the feature `rig`
/// is on).
#[doc(hidden)]
pub trait ContextKeyPart {
    /// The canonical key part, or `None` when the context holds no run step.
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey>;
}

impl ContextKeyPart for KeyPartProbe<'_, &mut ToolContext> {
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey> {
        context_key_part(self.0)
    }
}

impl ContextKeyPart for KeyPartProbe<'_, &ToolContext> {
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey> {
        context_key_part(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_key_is_its_run_step() {
        let mut context = ToolContext::new();
        assert_eq!(context_key_part(&context), Ok(None));
        context.insert(RunStep::new("run-9", "3")).unwrap();
        let part = context_key_part(&context).unwrap().unwrap();
        assert_eq!(Some(part), KeyPart::new(&RunStep::new("run-9", "3")).ok());
        context.insert(RunStep::new("run 9", "3")).unwrap();
        assert!(
            context_key_part(&context).is_err(),
            "a space is not a key character"
        );
    }
}
