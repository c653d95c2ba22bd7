//! The `on_error` policies: what an error of the body means for its claim, and what each
//! policy requires of the tool's error type (the marker traits, whose messages are the
//! compiler's diagnostics when a type falls short; what the value requires is
//! [`Replayable`](crate::Replayable)).
//!
//! | policy | an error | requires of the error type |
//! |---|---|---|
//! | [`ReleaseErrors`] (`on_error = "release"`, the default) | releases the claim: a corrected retry runs | nothing |
//! | [`StoreErrors`] (`"store"`) | is stored and replayed | [`StoredError`] |
//! | [`UnknownErrors`] (`"unknown"`) | blocks the key as unknown | nothing |
//! | [`ClassifiedErrors`] (`"classify"`) | as its `ClassifyError::class` says | [`ClassifiedError`] |

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::protocol::record::{decode_stored, decode_value, encode_error};
use crate::value::{ClassifiedError, StoredError};
use idem_core::ErrorClass;

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

impl<E: StoredError> ErrorHandling<StoreErrors> for E {
    const MAY_STORE: bool = true;
    fn class(&self) -> ErrorClass {
        ErrorClass::Store
    }
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        encode_error(&Kept::<_, StoreErrors>::new(self))
    }
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
        let stored = decode_stored::<T, Kept<E, StoreErrors>>(bytes)?;
        Ok(stored.map_err(|kept| kept.error))
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

/// `on_error = "classify"`: the error type says, error by error ([`ClassifyError`](idem_core::ClassifyError)).
pub struct ClassifiedErrors;

impl<E: ClassifiedError> ErrorHandling<ClassifiedErrors> for E {
    const MAY_STORE: bool = true;
    fn class(&self) -> ErrorClass {
        self.classified()
    }
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        encode_error(&Kept::<_, ClassifiedErrors>::new(self))
    }
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Result<T, E>, serde_json::Error> {
        let stored = decode_stored::<T, Kept<E, ClassifiedErrors>>(bytes)?;
        Ok(stored.map_err(|kept| kept.error))
    }
}

/// An error a policy keeps, as its record stores it: `Serialize` and `Deserialize` through the
/// trait the policy bounds the error type by ([`StoredError`], [`ClassifiedError`]), as the
/// error itself would be. `E` is the error, or a reference to it for encoding.
struct Kept<E, P> {
    error: E,
    policy: PhantomData<P>,
}

impl<E, P> Kept<E, P> {
    fn new(error: E) -> Self {
        Kept {
            error,
            policy: PhantomData,
        }
    }
}

impl<E: StoredError> Serialize for Kept<&E, StoreErrors> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.error.serialize_stored(serializer)
    }
}

impl<'de, E: StoredError> Deserialize<'de> for Kept<E, StoreErrors> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        E::deserialize_stored(deserializer).map(Kept::new)
    }
}

impl<E: ClassifiedError> Serialize for Kept<&E, ClassifiedErrors> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.error.serialize_classified(serializer)
    }
}

impl<'de, E: ClassifiedError> Deserialize<'de> for Kept<E, ClassifiedErrors> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        E::deserialize_classified(deserializer).map(Kept::new)
    }
}
