//! Restate handlers (restate-sdk 0.13): a tool called inside a journaled action is keyed by the
//! invocation and the step.
//!
//! Restate journals each `ctx.run` action's result, and runs an action again when its process
//! died after the effect but before the journal entry: at least once. [`Steps`] closes that gap.
//! It opens, for each action, the step of a durable run ([`idem_runtime::run`]) whose id is the
//! invocation's (stable across Restate's retries, replays and restarts) and whose step id is the
//! action's position and name in the handler (deterministic, as Restate requires the handler to
//! be). Inside, an `#[idempotent(key = "run_id, step_id", mutating)]` tool takes its key from
//! there: the action run again finds its key and replays.
//!
//! ```text
//! #[idempotent(key = "run_id, step_id", mutating, name = "payments.charge", ttl = "8d")]
//! async fn charge(customer: String, amount_cents: u64) -> Result<Payment, Declined> { … }
//!
//! #[restate_sdk::service]
//! impl Payments {
//!     async fn pay(&self, ctx: Context<'_>, order: Json<Order>) -> HandlerResult<Json<Payment>> {
//!         let steps = Steps::new(&ctx)?;
//!         let charge = steps.action("charge", move || async move {
//!             answer(charge(customer, cents).await).map(Json)
//!         })?;
//!         Ok(ctx.run(charge).name("charge").await?)
//!     }
//! }
//! ```
//!
//! [`answer`] turns a tool's answer into the action's result as Restate should treat it: a value
//! (fresh or replayed) is journaled; what a retry can change (a call in flight, a store that
//! failed, an outcome still unknown, an error that released its key) is retried by Restate; what
//! it cannot (a mismatch, a stored error, a misuse) is terminal.

use std::fmt::Display;
use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::{Error, ErrorClass, Outcome};
use idem_runtime::run::{Run, Step};
use restate_sdk::context::{
    Context, ObjectContext, SharedObjectContext, SharedWorkflowContext, WorkflowContext,
};
use restate_sdk::errors::{HandlerError, HandlerResult, TerminalError};
use tokio::task::futures::TaskLocalFuture;

/// A handler's context that knows its invocation: every Restate context.
pub trait Invocation {
    /// The invocation's id: the same across Restate's retries, replays and restarts.
    fn invocation_id(&self) -> &str;
}

macro_rules! invocation {
    ($($context:ident),*) => {$(
        impl Invocation for $context<'_> {
            fn invocation_id(&self) -> &str {
                $context::invocation_id(self)
            }
        }
    )*};
}

invocation!(
    Context,
    ObjectContext,
    SharedObjectContext,
    WorkflowContext,
    SharedWorkflowContext
);

/// The journaled actions of one execution of a handler, each the step of the durable run keyed by
/// the invocation. Make it at the start of the handler, and run each action through it.
#[derive(Debug)]
pub struct Steps {
    run: Run,
    /// Actions started so far in this execution of the handler.
    started: AtomicU32,
}

impl Steps {
    /// The steps of the invocation `ctx` runs. Restate's invocation ids are key strings; one that
    /// is not is a terminal error.
    pub fn new(ctx: &impl Invocation) -> Result<Steps, TerminalError> {
        let run = Run::new(ctx.invocation_id())
            .map_err(|e| TerminalError::new(format!("the invocation id cannot key a run: {e}")))?;
        Ok(Steps {
            run,
            started: AtomicU32::new(0),
        })
    }

    /// The run: the invocation's.
    pub fn run_of(&self) -> &Run {
        &self.run
    }

    /// The journaled action named `name`, for `ctx.run`: `action` runs inside the step
    /// `"{n}.{name}"` of the run (`n` counts the handler's actions from 1), so the tools it calls
    /// that take `run_id` and `step_id` from the run are keyed by this invocation and this
    /// action. `name` must be a key string (visible ASCII, no spaces), else a terminal error.
    ///
    /// ```text
    /// let charged = ctx.run(steps.action("charge", || async { … })?).name("charge").await?;
    /// ```
    pub fn action<R, F, T>(
        &self,
        name: &str,
        action: R,
    ) -> Result<impl FnOnce() -> TaskLocalFuture<Step, F> + Send + use<R, F, T>, TerminalError>
    where
        R: FnOnce() -> F + Send,
        F: Future<Output = HandlerResult<T>>,
    {
        let n = self.started.fetch_add(1, Ordering::Relaxed) + 1;
        let step = self.run.open_step(format!("{n}.{name}")).map_err(|e| {
            TerminalError::new(format!("action {n}: its name cannot be a step id: {e}"))
        })?;
        Ok(move || step.enter(action()))
    }
}

/// The answer of an idempotent tool as a journaled action's result: the value of `Fresh`,
/// `Replayed` and `Unprotected`; a retryable error where Restate's retry can change the answer
/// (`InFlight`, `Unknown`, a store failure, a lease lost, an error whose key was released); a
/// terminal error where it cannot (`Mismatch`, an error stored for replays, a misuse such as a
/// missing runtime or run). Messages never contain a key, only its short hash.
pub fn answer<T, E: Display>(result: Result<Outcome<T>, Error<E>>) -> HandlerResult<T> {
    let retry = |message: String| Err(HandlerError::from(message));
    let terminal = |message: String| Err(TerminalError::new(message).into());
    match result {
        Ok(Outcome::Fresh(value) | Outcome::Replayed(value) | Outcome::Unprotected(value)) => {
            Ok(value)
        }
        Ok(Outcome::InFlight(i)) => retry(format!(
            "tool `{}` (key {}): another execution holds the key; retry",
            i.tool, i.key
        )),
        Ok(Outcome::Unknown(u)) => retry(format!(
            "tool `{}` (key {}): the effect may have happened; the key waits for its state \
             check or an operator (`idem resolve`)",
            u.tool, u.key
        )),
        Ok(Outcome::Mismatch(m)) => terminal(format!(
            "tool `{}` (key {}): called again with other arguments",
            m.tool, m.key
        )),
        Err(
            e @ Error::Tool {
                class: ErrorClass::Store,
                ..
            },
        ) => terminal(e.to_string()),
        Err(
            e @ (Error::Tool { .. }
            | Error::Store(_)
            | Error::LeaseLost { .. }
            | Error::ResultNotStored { .. }
            | Error::CompletionFailed { .. }
            | Error::NotCommitted { .. }
            | Error::CheckFailed { .. }),
        ) => retry(e.to_string()),
        Err(e) => terminal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;
    use std::time::Duration;

    use idem_core::key::{KeyPart, derive_key};
    use idem_core::{InFlight, Mismatch, Unknown};
    use idem_core::{StoreError, StoreErrorKind};

    use super::*;

    /// `Ok(value)`, or whether the error is terminal, with its message.
    fn verdict(result: HandlerResult<u32>) -> Result<u32, (bool, String)> {
        result.map_err(|e| {
            let inner: &dyn StdError = e.as_ref();
            let text = inner.to_string();
            (text.starts_with("Terminal error"), text)
        })
    }

    #[test]
    fn answers_are_journaled_retried_or_terminal_as_a_retry_can_change_them() {
        let key = derive_key("t", "charge", &[KeyPart::new("run-1").unwrap()]).short_hash();
        let ok = |o: Outcome<u32>| verdict(answer::<u32, String>(Ok(o)));
        let err = |e: Error<String>| verdict(answer::<u32, String>(Err(e)));
        assert_eq!(ok(Outcome::Fresh(1)), Ok(1));
        assert_eq!(ok(Outcome::Replayed(2)), Ok(2));
        assert_eq!(ok(Outcome::Unprotected(3)), Ok(3));

        let retried = |v: Result<u32, (bool, String)>| matches!(v, Err((false, _)));
        let terminal = |v: Result<u32, (bool, String)>| matches!(v, Err((true, _)));
        let in_flight = InFlight::new("charge", key, Duration::from_secs(1));
        assert!(retried(ok(Outcome::InFlight(in_flight))));
        assert!(retried(ok(Outcome::Unknown(Unknown::new("charge", key)))));
        assert!(terminal(ok(Outcome::Mismatch(Mismatch::new(
            "charge", key
        )))));

        let tool = |class| Error::Tool {
            error: "declined".to_owned(),
            replayed: false,
            class,
        };
        assert!(terminal(err(tool(ErrorClass::Store))));
        assert!(retried(err(tool(ErrorClass::Release))));
        assert!(retried(err(tool(ErrorClass::Unknown))));
        let down = StoreError::new("sqlite", StoreErrorKind::Unavailable, "down");
        assert!(retried(err(Error::Store(down))));
        assert!(terminal(err(Error::NoRun {
            tool: "charge",
            part: "run_id"
        })));
        assert!(terminal(err(Error::NoRuntime { tool: "charge" })));

        let Err((_, message)) = ok(Outcome::InFlight(InFlight::new(
            "charge",
            key,
            Duration::from_secs(1),
        ))) else {
            unreachable!()
        };
        assert!(
            message.contains(&key.to_string()),
            "the short hash: {message}"
        );
        assert!(!message.contains("run-1"), "never the key: {message}");
    }
}
