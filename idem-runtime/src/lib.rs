//! The runtime of [idem](https://docs.rs/idem-agent): keys, fingerprints, outcomes, stores and
//! the tool registry. Users depend on the facade, the `idem-agent` package (`use idem::…`),
//! which re-exports this crate and the `#[idempotent]` attribute; this crate's docs describe the
//! machinery.
//!
//! ```
//! use idem_runtime::{Idem, Outcome, derive_key, fingerprint};
//! use idem_runtime::key::KeyPart;
//!
//! // The same intent always derives the same key; the raw parts never leave the call.
//! let parts = [KeyPart::new("run-9").unwrap(), KeyPart::new("step-3").unwrap()];
//! let key = derive_key("tenant-a", "payments.register", &parts);
//! assert_eq!(key.to_string().len(), 12); // only a short hash is ever shown
//!
//! // Fingerprints do not depend on member order.
//! let a = fingerprint(&serde_json::json!({"amount": 500, "customer": "c"}), &[]).unwrap();
//! let b = fingerprint(&serde_json::json!({"customer": "c", "amount": 500}), &[]).unwrap();
//! assert_eq!(a, b);
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod canonical;
pub mod clock;
mod current;
mod error;
pub mod fingerprint;
mod hex;
#[cfg(any(feature = "http-server", feature = "http-client"))]
pub mod http;
pub mod key;
#[cfg(feature = "rmcp")]
pub mod mcp;
mod outcome;
mod protocol;
pub mod registry;
pub mod retry;
#[cfg(feature = "rig")]
pub mod rig;
mod runtime;
pub mod store;
pub mod telemetry;
mod timer;
pub mod transactional;

#[doc(hidden)]
pub mod __private;

pub use current::{Current, current};
pub use error::{ClassifyError, Error, ErrorClass, OpenError, StoreError, StoreErrorKind};
pub use fingerprint::{Fingerprint, fingerprint};
pub use key::{
    DownstreamKey, IdempotencyKey, InvalidKey, KeyHash, derive_downstream_key, derive_key,
    validate_key_string,
};
pub use outcome::{InFlight, Mismatch, Outcome, Unknown};
pub use registry::audit;
pub use runtime::{
    DEFAULT_LEASE, DEFAULT_MAX_ARGUMENT_BYTES, DEFAULT_MAX_RESULT_BYTES, DEFAULT_TTL, Idem,
    IdemBuilder, Scope,
};

/// The return type of an `#[idempotent]` tool: a `Result<T, E>` (or an alias of one).
///
/// The attribute rewrites `-> Result<T, E>` to `-> Result<Outcome<T>, idem::Error<E>>`; for an
/// alias such as `anyhow::Result<T>` it uses this trait to name `T` and `E`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `Result`: an `#[idempotent]` tool must return `Result<T, E>`",
    label = "return `Result<T, E>` here",
    note = "the error type decides what happens to the claim when the tool fails"
)]
pub trait ToolResult: sealed::Sealed {
    /// The success value.
    type Ok;
    /// The error.
    type Err;
    /// What the attribute makes the tool return: `Result<Outcome<Ok>, idem::Error<Err>>`.
    type Rewritten;
    /// The value as a plain `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
}

impl<T, E> ToolResult for Result<T, E> {
    type Ok = T;
    type Err = E;
    type Rewritten = Result<Outcome<T>, Error<E>>;
    fn into_result(self) -> Result<T, E> {
        self
    }
}

/// A value a retry gets back: what an `#[idempotent]` tool with a key returns must be
/// `Serialize` and `Deserialize`, since its first call stores it. Implemented for every such type;
/// the attribute names it so that a type that is not is one error, at the return type. Do not
/// implement it yourself: derive `Serialize` and `Deserialize` instead.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored for replay: the value an `#[idempotent]` tool returns must implement `serde::Serialize` and `serde::Deserialize`",
    label = "this type is not `Serialize + DeserializeOwned`",
    note = "derive both: `#[derive(serde::Serialize, serde::Deserialize)]`; a retry gets the stored value back"
)]
pub trait Replayable {
    /// `Self`, known to be storable.
    type Checked;
    /// The value itself.
    fn checked(self) -> Self::Checked;
}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Replayable for T {
    type Checked = T;
    fn checked(self) -> T {
        self
    }
}

/// An error a tool with `on_error = "store"` keeps for its retries: `Serialize` and
/// `Deserialize`. Implemented for every such type; the attribute names it so that an error type
/// that is not is one error, at the return type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored for replay: with `on_error = \"store\"` the tool's error type must implement `serde::Serialize` and `serde::Deserialize`",
    label = "this error type is not `Serialize + DeserializeOwned`",
    note = "derive both, or use `on_error = \"release\"` (the default) to let a corrected retry run instead"
)]
pub trait StoredError {
    /// `Self`, known to be storable.
    type Checked;
    /// The error itself.
    fn checked(self) -> Self::Checked;
}

#[diagnostic::do_not_recommend]
impl<E: serde::Serialize + serde::de::DeserializeOwned> StoredError for E {
    type Checked = E;
    fn checked(self) -> E {
        self
    }
}

/// An error of a tool with `on_error = "classify"`: it says what each error means
/// ([`ClassifyError`]), and the ones it classifies `Store` are kept for retries, so it is
/// `Serialize` and `Deserialize` too. Implemented for every such type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify itself: with `on_error = \"classify\"` the tool's error type must implement `idem::ClassifyError`, `serde::Serialize` and `serde::Deserialize`",
    label = "this error type is not `ClassifyError + Serialize + DeserializeOwned`",
    note = "implement `idem::ClassifyError` (its default says `Release`) and derive the serde traits: errors classified `Store` are replayed"
)]
pub trait ClassifiedError {
    /// `Self`, known to classify itself and be storable.
    type Checked;
    /// The error itself.
    fn checked(self) -> Self::Checked;
}

#[diagnostic::do_not_recommend]
impl<E: ClassifyError + serde::Serialize + serde::de::DeserializeOwned> ClassifiedError for E {
    type Checked = E;
    fn checked(self) -> E {
        self
    }
}

mod sealed {
    pub trait Sealed {}
    impl<T, E> Sealed for Result<T, E> {}
}
