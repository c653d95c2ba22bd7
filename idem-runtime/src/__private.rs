//! What the `#[idempotent]` macro expands to calls. Not a public API: it changes without notice.
//!
//! The generated code is thin: it collects the key parts (through the probes here), feeds each
//! argument to the fingerprint ([`ToolArgument`](idem_core::fingerprint::ToolArgument)), and hands the original body, as a future, to
//! [`run_keyed`], [`run_keyed_checked`], [`run_checked`] or [`run_natural`], naming the tool's
//! `on_error` policy ([`ReleaseErrors`], …). Only what the generated code names is here; the
//! call itself is the crate's call protocol (`protocol`), ordinary, unit-tested Rust.

use std::future::Future;

use serde::Serialize;

pub use idem_core::key::KeyPartProbe;
pub use inventory;

pub use crate::protocol::batch::BatchEntry;
pub use crate::protocol::call::KeyParts;
pub use crate::protocol::policy::{
    ClassifiedErrors, ErrorHandling, ReleaseErrors, StoreErrors, UnknownErrors,
};
pub use crate::registry::{ErrorPolicy, OrphanPolicy, Registration, ToolInfo};
pub use idem_core::fingerprint::ArgsFingerprint;

use idem_core::canonical::CanonicalError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{InvalidKey, KeyPart};
use idem_core::{Batch, Error, ErrorClass, Outcome};

use crate::protocol::call::{self, NoCheck, StateCheck};
use crate::protocol::checked::CheckedAnswer;
use crate::value::{Checked, Replayable};

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
/// ([`ToolArgument`](idem_core::fingerprint::ToolArgument)) is the one error
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

/// Chosen for a rig `ToolContext` named as a key part: without the rig integration
/// (`idem-rig`, the facade's feature `rig`) it has no impl, and a context part is an ordinary
/// (unserializable) argument. With it, the facade names `idem_rig`'s trait of the same name,
/// implemented for the context.
pub trait ContextKeyPart {
    /// The canonical key part, or `None` when the context holds no run step.
    fn idem_key_part(&self) -> Result<Option<KeyPart>, InvalidKey>;
}

/// The `run_id` part of a tool that takes it from the durable run it is called in
/// ([`crate::run`]): `None` outside a run's step.
pub fn run_id_part() -> Option<Result<KeyPart, InvalidKey>> {
    crate::run::run_id_part()
}

/// The `step_id` part of a call of `tool` that takes it from the durable run: the step's id,
/// numbered for the later calls of the tool in the step; `None` outside a run's step.
pub fn step_id_part(tool: &'static ToolInfo) -> Option<Result<KeyPart, InvalidKey>> {
    crate::run::step_id_part(tool.name)
}

/// Finishes the fingerprint of a keyed call's arguments under the running scope's limit
/// ([`Idem::max_argument_bytes`](crate::Idem::max_argument_bytes); outside a scope
/// [`DEFAULT_MAX_ARGUMENT_BYTES`](crate::DEFAULT_MAX_ARGUMENT_BYTES)).
pub fn finish_fingerprint(args: ArgsFingerprint<'_>) -> Result<Fingerprint, CanonicalError> {
    let limit = crate::Scope::with_current(|scope| {
        scope.map_or(crate::DEFAULT_MAX_ARGUMENT_BYTES, |s| {
            s.idem().max_argument_bytes()
        })
    });
    args.finish(limit)
}

/// Runs a keyed tool: claim, run the body at most once, settle the record as `policy` says.
/// The body is the user's, its value already a plain `Result` (`ToolResult::into_result`, in
/// the generated code, at the return type: a return type that is not a `Result` is one error
/// there, and the bounds below then hold for the error type without more noise).
///
/// The value's one bound is [`Replayable`], the bound the attribute puts on the tool itself:
/// inside the tool it holds, so a value that cannot be stored is one error, the tool's.
pub fn run_keyed<H, V, E, F>(
    tool: &'static ToolInfo,
    _policy: H,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    body: F,
) -> impl Future<Output = Result<Outcome<V>, Error<E>>>
where
    E: ErrorHandling<H>,
    V: Replayable,
    F: Future<Output = Result<V, E>>,
{
    let body = move |()| async move { body.await.map(Checked) };
    let run = call::run::<Checked<V>, _, H, _, _, _, _>(tool, key, fingerprint, (), NoCheck, body);
    async move { run.await.map(|outcome| outcome.map(|checked| checked.0)) }
}

/// Runs a keyed tool with a state check (`check = …`) that reconciles orphans and `unknown`
/// records. `args` are the tool's arguments, lent to `check` and then given to `body`. The value
/// as for [`run_keyed`].
pub fn run_keyed_checked<H, V, E, A, C, B, F>(
    tool: &'static ToolInfo,
    _policy: H,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    args: A,
    check: C,
    body: B,
) -> impl Future<Output = Result<Outcome<V>, Error<E>>>
where
    E: ErrorHandling<H>,
    V: Replayable,
    C: AsyncFnOnce(&A) -> Result<Option<V>, E>,
    B: FnOnce(A) -> F,
    F: Future<Output = Result<V, E>>,
{
    let check = CheckedAnswer(StateCheck(check));
    let body = move |args| {
        let body = body(args);
        async move { body.await.map(Checked) }
    };
    let run = call::run::<Checked<V>, _, H, _, _, _, _>(tool, key, fingerprint, args, check, body);
    async move { run.await.map(|outcome| outcome.map(|checked| checked.0)) }
}

/// Runs a batch tool (`key = "…, items[].id"`): `entries` are the items' key parts and
/// fingerprints, in the items' order; the body gets the items to run and answers one result per
/// item, in their order. The value as for [`run_keyed`].
pub fn run_batch<H, V, E, I, B, F>(
    tool: &'static ToolInfo,
    _policy: H,
    entries: Vec<BatchEntry>,
    items: Vec<I>,
    body: B,
) -> impl Future<Output = Result<Batch<V, E>, Error<E>>>
where
    E: ErrorHandling<H>,
    V: Replayable,
    B: FnOnce(Vec<I>) -> F,
    F: Future<Output = Vec<Result<V, E>>>,
{
    let body = move |items| {
        let body = body(items);
        async move {
            let results = body.await;
            results.into_iter().map(|r| r.map(Checked)).collect()
        }
    };
    let run =
        crate::protocol::batch::run_batch::<Checked<V>, E, H, I, _, _>(tool, entries, items, body);
    async move {
        let batch = run.await?;
        let items = batch.into_iter();
        Ok(Batch::new(
            items
                .map(|item| item.map(|outcome| outcome.map(|checked| checked.0)))
                .collect(),
        ))
    }
}

/// Runs a streaming tool (its last parameter an [`Emitter`](crate::Emitter)): `body` gets the
/// emitter; the answer comes once the claim is decided, and its [`Streamed`](crate::Streamed)
/// runs the body, or reads the recorded chunks, as it is read.
pub fn run_stream<H, T, V, E, B, F>(
    tool: &'static ToolInfo,
    _policy: H,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    body: B,
) -> impl Future<Output = Result<Outcome<crate::Streamed<T, V, E>>, Error<E>>>
where
    T: Replayable + Send + 'static,
    V: Replayable + Send + 'static,
    E: ErrorHandling<H> + Send + 'static,
    H: 'static,
    B: FnOnce(crate::Emitter<T>) -> F + Send + 'static,
    F: Future<Output = Result<V, E>> + Send + 'static,
{
    crate::protocol::stream::run_stream::<T, V, E, H, B, F>(tool, key, fingerprint, body)
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
