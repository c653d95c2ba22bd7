//! The `on_error` policies: what an error of the body means for its claim, and what each
//! policy requires of the tool's types (the marker traits, whose messages are the compiler's
//! diagnostics when a type falls short).
//!
//! | policy | an error | requires of the error type |
//! |---|---|---|
//! | [`ReleaseErrors`] (`on_error = "release"`, the default) | releases the claim: a corrected retry runs | nothing |
//! | [`StoreErrors`] (`"store"`) | is stored and replayed | [`StorableError`] |
//! | [`UnknownErrors`] (`"unknown"`) | blocks the key as unknown | nothing |
//! | [`ClassifiedErrors`] (`"classify"`) | as its [`ClassifyError::class`] says | [`ClassifiedError`] |

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{ClassifyError, ErrorClass};
use crate::protocol::record::{decode_stored, decode_value, encode_error};

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
    /// Whether the policy may keep an error for replays (then a transactional tool's body runs
    /// under a savepoint, so that its writes can be rolled back without the record's).
    const MAY_STORE: bool;
    /// The class of this error.
    fn class(&self) -> ErrorClass;
    /// Encodes an error of class [`ErrorClass::Store`].
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error>;
    /// Decodes a completed record into the value or the stored error.
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, Self>, serde_json::Error>;
}

fn never_stored() -> serde_json::Error {
    serde::ser::Error::custom("this tool's policy never stores an error")
}

/// `on_error = "release"` (the default): every error releases the claim.
pub struct ReleaseErrors;

impl<E> ErrorHandling<ReleaseErrors> for E {
    const MAY_STORE: bool = false;
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
    const MAY_STORE: bool = true;
    fn class(&self) -> ErrorClass {
        ErrorClass::Store
    }
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        encode_error(self)
    }
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
        decode_stored(bytes)
    }
}

/// `on_error = "unknown"`: every error leaves the key blocked as unknown.
pub struct UnknownErrors;

impl<E> ErrorHandling<UnknownErrors> for E {
    const MAY_STORE: bool = false;
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
    const MAY_STORE: bool = true;
    fn class(&self) -> ErrorClass {
        ClassifyError::class(self)
    }
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        encode_error(self)
    }
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
        decode_stored(bytes)
    }
}
