//! What the `#[idempotent]` macro expands to calls. Not a public API: it changes without notice.
//!
//! The generated code is thin: it hands the key parts, the fingerprint input and the original
//! body (as a future) to [`run_keyed`], [`run_keyed_checked`], [`run_checked`] or
//! [`run_natural`], naming the tool's `on_error` policy ([`ReleaseErrors`], …). Every
//! decision is made here, in ordinary, unit-tested Rust.

use std::future::Future;

use std::time::Duration;
use tracing::Instrument as _;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};

pub use inventory;

pub use crate::fingerprint::ArgsFingerprint;
pub use crate::registry::{ErrorPolicy, OrphanPolicy, Registration, ToolInfo};

use crate::ToolResult;
use crate::canonical::CanonicalError;
use crate::error::{ClassifyError, Error, ErrorClass};
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, InvalidKey, KeyPart, derive_key};
use crate::outcome::{InFlight, Mismatch, Outcome, Unknown};
use crate::runtime::Scope;
use crate::store::{Claim, ClaimRequest, Completion, Fenced, Orphans, RecordStatus};

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

/// The key parts of one call, collected in declaration order.
pub struct KeyParts {
    parts: Vec<KeyPart>,
    missing: Option<&'static str>,
    invalid: Option<(&'static str, InvalidKey)>,
}

impl KeyParts {
    /// No parts yet.
    pub fn new() -> Self {
        KeyParts {
            parts: Vec::with_capacity(2),
            missing: None,
            invalid: None,
        }
    }

    /// Adds the part named `name` (as declared in `key = "…"`).
    pub fn part(mut self, name: &'static str, part: Result<Option<KeyPart>, InvalidKey>) -> Self {
        match part {
            Ok(Some(part)) => self.parts.push(part),
            Ok(None) => {
                self.missing.get_or_insert(name);
            }
            Err(reason) => {
                self.invalid.get_or_insert((name, reason));
            }
        }
        self
    }
}

impl Default for KeyParts {
    fn default() -> Self {
        Self::new()
    }
}

/// An argument of a keyed tool: anything `Serialize`. Adding it to the fingerprint through this
/// trait makes a non-serializable argument one error, at the parameter, with this message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted: every argument of an `#[idempotent]` tool must implement `serde::Serialize`",
    label = "this argument is not `Serialize`",
    note = "derive it: `#[derive(serde::Serialize)]`; the fingerprint detects a retry with changed arguments"
)]
pub trait ToolArgument {
    /// Adds `self` to the fingerprint input under `name`.
    fn add_to<'s>(
        &self,
        fingerprint: ArgsFingerprint<'s>,
        name: &'static str,
    ) -> ArgsFingerprint<'s>;
}

impl<T: Serialize + ?Sized> ToolArgument for T {
    fn add_to<'s>(
        &self,
        fingerprint: ArgsFingerprint<'s>,
        name: &'static str,
    ) -> ArgsFingerprint<'s> {
        fingerprint.arg(name, self)
    }
}

/// The value a keyed tool returns: stored for replays, so `Serialize + DeserializeOwned`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored for replay: the value an `#[idempotent]` tool returns must implement `serde::Serialize` and `serde::Deserialize`",
    label = "this type is not `Serialize + DeserializeOwned`",
    note = "derive both: `#[derive(serde::Serialize, serde::Deserialize)]`; a retry gets the stored value back"
)]
pub trait StorableResult: Serialize + DeserializeOwned {}
impl<T: Serialize + DeserializeOwned> StorableResult for T {}

/// The error of a tool with `on_error = "store"`: stored for replays.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored for replay: with `on_error = \"store\"` the tool's error type must implement `serde::Serialize` and `serde::Deserialize`",
    label = "this error type is not `Serialize + DeserializeOwned`",
    note = "derive both, or use `on_error = \"release\"` (the default) to let a corrected retry run instead"
)]
pub trait StorableError: Serialize + DeserializeOwned {}
impl<T: Serialize + DeserializeOwned> StorableError for T {}

/// The error of a tool with `on_error = "classify"`: it says what each error means, and the
/// ones it classifies [`ErrorClass::Store`] are stored for replays.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify itself: with `on_error = \"classify\"` the tool's error type must implement `idem::ClassifyError`, `serde::Serialize` and `serde::Deserialize`",
    label = "this error type is not `ClassifyError + Serialize + DeserializeOwned`",
    note = "implement `idem::ClassifyError` (its default says `Release`) and derive the serde traits: errors classified `Store` are replayed"
)]
pub trait ClassifiedError: ClassifyError + Serialize + DeserializeOwned {}
impl<T: ClassifyError + Serialize + DeserializeOwned> ClassifiedError for T {}

/// What a record stores: the body's value or, when its class is `Store`, its error.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum StoredRef<'a, T, E> {
    Ok(&'a T),
    Err(&'a E),
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Stored<T, E> {
    Ok(T),
    Err(E),
}

/// How an error type is handled under the `on_error` policy `P` of a tool: what each error
/// means for the claim, and how the stored ones are encoded. `P` is one unit struct per policy,
/// which the generated code names; the bounds of each impl are what the policy requires of the
/// error type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not fit the `on_error` policy of this tool (`{P}`)",
    label = "this error type lacks what the tool's `on_error` policy needs",
    note = "`on_error = \"store\"` keeps errors for replay: the error type must implement `serde::Serialize` and `serde::Deserialize`; `on_error = \"classify\"` needs those and `idem::ClassifyError`; `\"release\"` (the default) and `\"unknown\"` need nothing"
)]
pub trait ErrorHandling<P>: Sized {
    /// The class of this error.
    fn class(&self) -> ErrorClass;
    /// Encodes an error of class [`ErrorClass::Store`].
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error>;
    /// Decodes a completed record into the value or the stored error.
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, Self>, serde_json::Error>;
}

/// Decodes a record of a tool whose errors are never stored.
fn decode_value<T: DeserializeOwned, E>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
    match serde_json::from_slice::<Stored<T, IgnoredAny>>(bytes)? {
        Stored::Ok(v) => Ok(Ok(v)),
        Stored::Err(_) => Err(serde::de::Error::custom(
            "the record holds an error, but the tool no longer stores errors",
        )),
    }
}

/// Decodes a record of a tool whose errors may be stored.
fn decode_stored<T: DeserializeOwned, E: DeserializeOwned>(
    bytes: &[u8],
) -> Result<Result<T, E>, serde_json::Error> {
    Ok(match serde_json::from_slice::<Stored<T, E>>(bytes)? {
        Stored::Ok(v) => Ok(v),
        Stored::Err(e) => Err(e),
    })
}

/// What a record holds instead of a result too large to keep.
#[derive(Serialize, Deserialize)]
struct TooLarge {
    too_large: TooLargeSize,
}

#[derive(Serialize, Deserialize)]
struct TooLargeSize {
    size: usize,
    limit: usize,
}

fn too_large_record(size: usize, limit: usize) -> Vec<u8> {
    serde_json::to_vec(&TooLarge {
        too_large: TooLargeSize { size, limit },
    })
    .expect("two numbers serialize")
}

/// `(size, limit)` when the record holds [`too_large_record`] (a stored value or error starts
/// with `{"ok"` or `{"err"`, never with this).
fn too_large_marker(bytes: &[u8]) -> Option<(usize, usize)> {
    if !bytes.starts_with(br#"{"too_large""#) {
        return None;
    }
    let TooLarge { too_large } = serde_json::from_slice(bytes).ok()?;
    Some((too_large.size, too_large.limit))
}

fn never_stored() -> serde_json::Error {
    serde::ser::Error::custom("this tool's policy never stores an error")
}

/// `on_error = "release"` (the default): every error releases the claim.
pub struct ReleaseErrors;

impl<E> ErrorHandling<ReleaseErrors> for E {
    fn class(&self) -> ErrorClass {
        ErrorClass::Release
    }
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        Err(never_stored())
    }
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
        decode_value(bytes)
    }
}

/// `on_error = "store"`: every error is stored and replayed.
pub struct StoreErrors;

impl<E: StorableError> ErrorHandling<StoreErrors> for E {
    fn class(&self) -> ErrorClass {
        ErrorClass::Store
    }
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&StoredRef::<(), E>::Err(self))
    }
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
        decode_stored(bytes)
    }
}

/// `on_error = "unknown"`: every error leaves the key blocked as unknown.
pub struct UnknownErrors;

impl<E> ErrorHandling<UnknownErrors> for E {
    fn class(&self) -> ErrorClass {
        ErrorClass::Unknown
    }
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        Err(never_stored())
    }
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
        decode_value(bytes)
    }
}

/// `on_error = "classify"`: the error type says, error by error ([`ClassifyError`]).
pub struct ClassifiedErrors;

impl<E: ClassifiedError> ErrorHandling<ClassifiedErrors> for E {
    fn class(&self) -> ErrorClass {
        ClassifyError::class(self)
    }
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&StoredRef::<(), E>::Err(self))
    }
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
        decode_stored(bytes)
    }
}

/// Runs a keyed tool: claim, run the body at most once, settle the record as `policy` says.
pub async fn run_keyed<H, R, F>(
    tool: &'static ToolInfo,
    _policy: H,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    body: F,
) -> Result<Outcome<R::Ok>, Error<R::Err>>
where
    R: ToolResult,
    R::Err: ErrorHandling<H>,
    R::Ok: StorableResult,
    F: Future<Output = R>,
{
    let body = move |()| async { body.await.into_result() };
    // No check: a closure of a concrete type, so that the call's future stays `Send`.
    let no_check = Some(async |_: &()| Ok(None)).filter(|_| false);
    execute::<_, _, _, _, _, _, H>(tool, key, fingerprint, (), no_check, body).await
}

/// Runs a keyed tool with a state check (`check = …`) that reconciles orphans and `unknown`
/// records. `args` are the tool's arguments, lent to `check` and then given to `body`.
pub async fn run_keyed_checked<H, R, A, C, B, F>(
    tool: &'static ToolInfo,
    _policy: H,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    args: A,
    check: C,
    body: B,
) -> Result<Outcome<R::Ok>, Error<R::Err>>
where
    R: ToolResult,
    R::Err: ErrorHandling<H>,
    R::Ok: StorableResult,
    C: AsyncFnOnce(&A) -> Result<Option<R::Ok>, R::Err>,
    B: FnOnce(A) -> F,
    F: Future<Output = R>,
{
    let body = move |args| async { body(args).await.into_result() };
    execute::<_, _, _, _, _, _, H>(tool, key, fingerprint, args, Some(check), body).await
}

/// Runs a tool decided by its state check alone (no key): `found` is the check's answer, made
/// before the body future exists. `Some(result)`: the effect already happened, `Replayed`;
/// `None`: the body runs, `Fresh`.
pub async fn run_checked<R, F>(
    tool: &'static ToolInfo,
    found: Result<Option<R::Ok>, R::Err>,
    body: F,
) -> Result<Outcome<R::Ok>, Error<R::Err>>
where
    R: ToolResult,
    F: Future<Output = R>,
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
pub async fn run_natural<R, F>(
    _tool: &'static ToolInfo,
    body: F,
) -> Result<Outcome<R::Ok>, Error<R::Err>>
where
    R: ToolResult,
    F: Future<Output = R>,
{
    crate::registry::write_report_from_env(None);
    body.await
        .into_result()
        .map(Outcome::Fresh)
        .map_err(|error| Error::Tool {
            error,
            replayed: false,
            class: ErrorClass::Release,
        })
}

async fn execute<T, E, A, C, B, F, H>(
    tool: &'static ToolInfo,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    args: A,
    check: Option<C>,
    body: B,
) -> Result<Outcome<T>, Error<E>>
where
    T: Serialize + DeserializeOwned,
    C: AsyncFnOnce(&A) -> Result<Option<T>, E>,
    B: FnOnce(A) -> F,
    F: Future<Output = Result<T, E>>,
    E: ErrorHandling<H>,
{
    let name = tool.name;
    // Every check that can fail does so before the store is touched and before the body runs.
    let Some(scope) = Scope::current() else {
        return Err(Error::NoRuntime { tool: name });
    };
    let fingerprint =
        fingerprint.map_err(|source| Error::Unfingerprintable { tool: name, source })?;
    if let Some((part, reason)) = key.invalid {
        return Err(Error::InvalidKey {
            tool: name,
            part,
            reason,
        });
    }
    if let Some(part) = key.missing {
        if tool.key_required {
            return Err(Error::MissingKey { tool: name, part });
        }
        return match body(args).await {
            Ok(v) => Ok(Outcome::Unprotected(v)),
            Err(error) => Err(Error::Tool {
                class: ErrorHandling::<H>::class(&error),
                error,
                replayed: false,
            }),
        };
    }
    let tenant = scope.tenant();
    if tenant.is_empty() || tenant.len() > 255 || tenant.contains('\0') {
        return Err(Error::InvalidTenant { tool: name });
    }

    let key = derive_key(tenant, name, &key.parts);
    crate::retry::note_call(name, key);
    let span = crate::telemetry::call_span(name, tenant, &key.short_hash());
    let started = std::time::Instant::now();
    let result =
        claim_and_run::<T, E, A, C, B, F, H>(tool, scope, key, fingerprint, args, check, body)
            .instrument(span.clone())
            .await;
    crate::telemetry::finish(&span, name, &result, started);
    result
}

/// The call once its key is known: claim, then replay, refuse, check or run.
async fn claim_and_run<T, E, A, C, B, F, H>(
    tool: &'static ToolInfo,
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    args: A,
    check: Option<C>,
    body: B,
) -> Result<Outcome<T>, Error<E>>
where
    T: Serialize + DeserializeOwned,
    C: AsyncFnOnce(&A) -> Result<Option<T>, E>,
    B: FnOnce(A) -> F,
    F: Future<Output = Result<T, E>>,
    E: ErrorHandling<H>,
{
    let name = tool.name;
    let tenant = scope.tenant();
    let idem = scope.idem();
    let store = idem.store();
    let ttl = tool.effective_ttl(idem);
    let now = idem.clock().now();
    let orphans = match check {
        Some(_) => Orphans::Reconcile,
        None => tool.orphans(),
    };
    let claim = store
        .claim(ClaimRequest {
            tenant,
            key,
            tool: name,
            fingerprint,
            now,
            lease: tool.effective_lease(idem),
            ttl,
            orphans,
        })
        .await?;
    // Settles the claimed record as `status` with `bytes`, fenced by `token`.
    let settle = |token, status, bytes: Vec<u8>| async move {
        store
            .complete(Completion {
                tenant,
                key,
                token,
                status,
                result: &bytes,
                now: idem.clock().now(),
                ttl,
            })
            .await
    };
    let not_stored = |source| Error::ResultNotStored {
        tool: name,
        key: key.short_hash(),
        source,
    };
    let token = match claim {
        Claim::Mismatch => return Ok(Outcome::Mismatch(Mismatch::new(name, key.short_hash()))),
        Claim::InFlight { lease_expires_at } => {
            // Until the lease lapses, by this caller's clock; never more than one lease (the
            // owner read its clock a little later than this caller, or runs slightly ahead).
            let retry_after = Duration::from_millis(lease_expires_at.saturating_sub(now))
                .min(tool.effective_lease(idem));
            return Ok(Outcome::InFlight(InFlight::new(
                name,
                key.short_hash(),
                retry_after,
            )));
        }
        Claim::Unknown => return Ok(Outcome::Unknown(Unknown::new(name, key.short_hash()))),
        Claim::Completed { result } => {
            if let Some((size, limit)) = too_large_marker(&result) {
                return Err(Error::ResultTooLarge {
                    tool: name,
                    key: key.short_hash(),
                    size,
                    limit,
                    replayed: true,
                });
            }
            return match <E as ErrorHandling<H>>::decode::<T>(&result) {
                Ok(Ok(v)) => Ok(Outcome::Replayed(v)),
                Ok(Err(error)) => Err(Error::Tool {
                    error,
                    replayed: true,
                    class: ErrorClass::Store,
                }),
                Err(source) => Err(Error::StoredResultUnreadable {
                    tool: name,
                    key: key.short_hash(),
                    source,
                }),
            };
        }
        Claim::Acquired { token, takeover } => {
            tracing::Span::current().record("token", token.get());
            // An orphan or an unknown record: an earlier owner may have had the effect. The
            // state check, if the tool has one, says which before anything runs again.
            if let Some(check) = check.filter(|_| takeover) {
                match crate::current::run_as(name, key, check(&args)).await {
                    Ok(Some(value)) => {
                        let bytes = serde_json::to_vec(&StoredRef::<T, ()>::Ok(&value))
                            .map_err(not_stored)?;
                        return match settle(token, RecordStatus::Completed, bytes).await {
                            Ok(Fenced::Applied) => Ok(Outcome::Replayed(value)),
                            Ok(Fenced::Lost) => Err(Error::LeaseLost {
                                tool: name,
                                key: key.short_hash(),
                            }),
                            Err(e) => Err(Error::Store(e)),
                        };
                    }
                    Ok(None) => {}
                    // Still unknown whether the effect happened: keep the claim (the lease
                    // protects it, and the next claim checks again) and run nothing.
                    Err(error) => return Err(Error::CheckFailed { tool: name, error }),
                }
            }
            token
        }
    };

    let result = crate::current::run_as(name, key, body(args)).await;
    let (class, settled) = match &result {
        Ok(v) => (
            None,
            Some((
                RecordStatus::Completed,
                serde_json::to_vec(&StoredRef::<T, ()>::Ok(v)),
            )),
        ),
        Err(e) => {
            let class = ErrorHandling::<H>::class(e);
            let settled = match class {
                ErrorClass::Release => None,
                ErrorClass::Store => Some((RecordStatus::Completed, ErrorHandling::<H>::encode(e))),
                ErrorClass::Unknown => Some((RecordStatus::Unknown, Ok(Vec::new()))),
            };
            (Some(class), settled)
        }
    };
    match settled {
        // No effect happened: release, so a corrected retry may run. If the release itself
        // fails the lease still protects the key, so the tool's error, the more useful of the
        // two, is what the caller gets.
        None => {
            let _ = store.release(tenant, key, token).await;
        }
        Some((_, Err(source))) => return Err(not_stored(source)),
        Some((status, Ok(bytes))) => {
            // Never truncated: a result too large to keep is recorded as such.
            let limit = idem.max_result_bytes();
            let too_large = (bytes.len() > limit).then_some(bytes.len());
            let bytes = match too_large {
                Some(size) => too_large_record(size, limit),
                None => bytes,
            };
            let settled =
                settle(token, status, bytes)
                    .await
                    .map_err(|source| Error::CompletionFailed {
                        tool: name,
                        key: key.short_hash(),
                        source,
                    })?;
            if settled == Fenced::Lost {
                return Err(Error::LeaseLost {
                    tool: name,
                    key: key.short_hash(),
                });
            }
            if let Some(size) = too_large {
                return Err(Error::ResultTooLarge {
                    tool: name,
                    key: key.short_hash(),
                    size,
                    limit,
                    replayed: false,
                });
            }
        }
    }
    match (result, class) {
        (Ok(v), _) => Ok(Outcome::Fresh(v)),
        (Err(error), class) => Err(Error::Tool {
            error,
            replayed: false,
            class: class.unwrap_or(ErrorClass::Release),
        }),
    }
}
