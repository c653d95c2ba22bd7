//! What the `#[idempotent]` macro expands to calls. Not a public API: it changes without notice.
//!
//! The generated code is thin: it collects the key parts (through the probes here), feeds each
//! argument to the fingerprint ([`ToolArgument`](crate::fingerprint::ToolArgument)), and hands the original body, as a future, to
//! [`run_keyed`], [`run_keyed_checked`], [`run_checked`] or [`run_natural`], naming the tool's
//! `on_error` policy ([`ReleaseErrors`], …). Only what the generated code names is here; the
//! call itself is the crate's call protocol (`protocol`), ordinary, unit-tested Rust.

use std::future::Future;

use serde::Serialize;

pub use inventory;

pub use crate::fingerprint::ArgsFingerprint;
pub use crate::protocol::call::KeyParts;
pub use crate::protocol::policy::{
    ClassifiedError, ClassifiedErrors, ErrorHandling, ReleaseErrors, StorableError, StorableResult,
    StoreErrors, UnknownErrors,
};
pub use crate::registry::{ErrorPolicy, OrphanPolicy, Registration, ToolInfo};

use crate::canonical::CanonicalError;
use crate::error::{Error, ErrorClass};
use crate::fingerprint::Fingerprint;
use crate::key::{InvalidKey, KeyPart};
use crate::outcome::Outcome;
use crate::protocol::call::{self, NoCheck, StateCheck};

/// Wraps a key part value so that method resolution can tell `Option<_>` parts (optional keys)
/// from every other type (autoref specialization; see [`OptionalKeyPart`] and
/// [`RequiredKeyPart`]).
pub struct KeyPartProbe<'a, T: ?Sized>(pub &'a T);

/// Chosen for `Option<T>` parts: `None` means the caller gave no key.
pub trait OptionalKeyPart {
    /// The canonical key part, or `None` when the caller gave none.
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey>;
}

impl<T: Serialize> OptionalKeyPart for KeyPartProbe<'_, Option<T>> {
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey> {
        self.0.as_ref().map(KeyPart::new).transpose()
    }
}

/// Chosen for every other part, one autoref later.
pub trait RequiredKeyPart {
    /// The canonical key part.
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey>;
}

impl<T: Serialize + ?Sized> RequiredKeyPart for &KeyPartProbe<'_, T> {
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey> {
        KeyPart::new(self.0).map(Some)
    }
}

/// Chosen last for a part that is a parameter itself, when its type is not `Serialize`: every
/// parameter is also an argument, and the argument's check
/// ([`ToolArgument`](crate::fingerprint::ToolArgument)) is the one error
/// such a tool gets, so this never runs.
pub trait ArgumentKeyPart {
    /// Not reached: the tool does not compile.
    fn idem_key_part(&mut self) -> Result<Option<KeyPart>, InvalidKey>;
}

impl<T: ?Sized> ArgumentKeyPart for &KeyPartProbe<'_, T> {
    fn idem_key_part(&mut self) -> Result<Option<KeyPart>, InvalidKey> {
        unreachable!("a parameter that is not `Serialize` fails the argument check at compile time")
    }
}

/// Chosen for a rig `ToolContext` named as a key part (feature `rig`): its
/// `idem::rig::RunStep`, put there by the agent loop. Without the feature the trait
/// has no impl and a context part is an ordinary (unserializable) argument.
pub trait ContextKeyPart {
    /// The canonical key part, or `None` when the context holds no run step.
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey>;
}

#[cfg(feature = "rig")]
impl ContextKeyPart for KeyPartProbe<'_, &mut rig_core::tool::ToolContext> {
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey> {
        crate::rig::context_key_part(self.0)
    }
}

#[cfg(feature = "rig")]
impl ContextKeyPart for KeyPartProbe<'_, &rig_core::tool::ToolContext> {
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey> {
        crate::rig::context_key_part(self.0)
    }
}

/// Runs a keyed tool: claim, run the body at most once, settle the record as `policy` says.
/// The body is the user's, its value already a plain `Result` (`ToolResult::into_result`, in
/// the generated code, at the return type: a return type that is not a `Result` is one error
/// there, and the bounds below then hold for the error type without more noise).
pub fn run_keyed<H, T, E, F>(
    tool: &'static ToolInfo,
    _policy: H,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    body: F,
) -> impl Future<Output = Result<Outcome<T>, Error<E>>>
where
    E: ErrorHandling<H>,
    T: StorableResult,
    F: Future<Output = Result<T, E>>,
{
    let body = move |()| body;
    call::run::<_, _, H, _, _, _, _>(tool, key, fingerprint, (), NoCheck, body)
}

/// Runs a keyed tool with a state check (`check = …`) that reconciles orphans and `unknown`
/// records. `args` are the tool's arguments, lent to `check` and then given to `body`.
pub fn run_keyed_checked<H, T, E, A, C, B, F>(
    tool: &'static ToolInfo,
    _policy: H,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    args: A,
    check: C,
    body: B,
) -> impl Future<Output = Result<Outcome<T>, Error<E>>>
where
    E: ErrorHandling<H>,
    T: StorableResult,
    C: AsyncFnOnce(&A) -> Result<Option<T>, E>,
    B: FnOnce(A) -> F,
    F: Future<Output = Result<T, E>>,
{
    let check = StateCheck(check);
    call::run::<_, _, H, _, _, _, _>(tool, key, fingerprint, args, check, body)
}

/// Runs a tool decided by its state check alone (no key): `found` is the check's answer, made
/// before the body future exists. `Some(result)`: the effect already happened, `Replayed`;
/// `None`: the body runs, `Fresh`.
pub async fn run_checked<T, E, F>(
    tool: &'static ToolInfo,
    found: Result<Option<T>, E>,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    F: Future<Output = Result<T, E>>,
{
    crate::registry::write_report_from_env(None);
    match found {
        Ok(Some(value)) => Ok(Outcome::Replayed(value)),
        // Nothing happened yet: the body runs as a natural tool's does.
        Ok(None) => run_natural(tool, body).await,
        Err(error) => Err(Error::CheckFailed {
            tool: tool.name,
            error,
        }),
    }
}

/// Runs a naturally idempotent tool: no key, no store, always `Fresh`.
pub async fn run_natural<T, E, F>(_tool: &'static ToolInfo, body: F) -> Result<Outcome<T>, Error<E>>
where
    F: Future<Output = Result<T, E>>,
{
    crate::registry::write_report_from_env(None);
    body.await.map(Outcome::Fresh).map_err(|error| Error::Tool {
        error,
        replayed: false,
        class: ErrorClass::Release,
    })
}
