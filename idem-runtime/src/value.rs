//! What an `#[idempotent]` tool returns, as the attribute checks it: a `Result`
//! ([`ToolResult`]) whose value can be stored ([`Replayable`]), and whose error, under the
//! `store` and `classify` policies, can be too ([`StoredError`], [`ClassifiedError`]). Each
//! trait's message is the compiler's error when a type falls short.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use idem_core::{ClassifyError, Error, ErrorClass, Outcome};

/// The return type of an `#[idempotent]` tool: a `Result<T, E>` (or an alias of one).
///
/// The attribute rewrites `-> Result<T, E>` to `-> Result<Outcome<T>, idem::Error<E>>`; for an
/// alias such as `anyhow::Result<T>` it uses this trait to name `T` and `E`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `Result`: an `#[idempotent]` tool must return `Result<T, E>`",
    label = "return `Result<T, E>` here",
    note = "the error type decides what happens to the claim when the tool fails"
)]
pub trait ToolResult {
    /// The success value.
    type Ok;
    /// The error.
    type Err;
    /// What the attribute makes the tool return: `Result<Outcome<Ok>, idem::Error<Err>>`.
    type Rewritten;
    /// The value as a plain `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// Seals the trait: only `Result` implements it. (A supertrait would seal it too, but
    /// rustc would report a return type that is not a `Result` twice, once for each trait.)
    #[doc(hidden)]
    fn sealed(_: sealed::Sealed);
}

impl<T, E> ToolResult for Result<T, E> {
    type Ok = T;
    type Err = E;
    type Rewritten = Result<Outcome<T>, Error<E>>;
    fn into_result(self) -> Result<T, E> {
        self
    }
    fn sealed(_: sealed::Sealed) {}
}

/// A value a retry gets back: what an `#[idempotent]` tool with a key returns must be
/// `Serialize` and `Deserialize`, since its first call stores it. Implemented for every such type;
/// the attribute bounds the tool's value by it, so that a type that is not is one error, at the
/// return type, and the runtime stores the value through it. Do not implement it yourself:
/// derive `Serialize` and `Deserialize` instead.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored for replay: the value an `#[idempotent]` tool returns must implement `serde::Serialize` and `serde::Deserialize`",
    label = "this type is not `Serialize + DeserializeOwned`",
    note = "derive both: `#[derive(serde::Serialize, serde::Deserialize)]`; a retry gets the stored value back"
)]
pub trait Replayable: Sized {
    /// Nothing: names the bound, for the attribute's check of a generic tool's types.
    #[doc(hidden)]
    fn check() {}
    /// Serializes the value for its record, as `Serialize` does.
    #[doc(hidden)]
    fn serialize_replayable<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    /// Reads a value back from its record, as `Deserialize` does.
    #[doc(hidden)]
    fn deserialize_replayable<'de, D: Deserializer<'de>>(deserializer: D)
    -> Result<Self, D::Error>;
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> Replayable for T {
    fn serialize_replayable<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.serialize(serializer)
    }
    fn deserialize_replayable<'de, D: Deserializer<'de>>(deserializer: D) -> Result<T, D::Error> {
        T::deserialize(deserializer)
    }
}

/// A value of an `#[idempotent]` tool as the runtime stores it: `Serialize` and `Deserialize`
/// for every [`Replayable`] value, as the value itself. (The runtime's entry points bound the
/// value by `Replayable` alone, the bound the attribute puts on the tool, and store
/// `Checked<V>`.)
#[doc(hidden)]
pub struct Checked<V>(pub V);

impl<V: Replayable> Serialize for Checked<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_replayable(serializer)
    }
}

impl<'de, V: Replayable> Deserialize<'de> for Checked<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        V::deserialize_replayable(deserializer).map(Checked)
    }
}

/// A borrowed [`Checked`]: serializes a [`Replayable`] value in place (a stream's chunk, which
/// its reader gets after it is recorded).
pub(crate) struct CheckedRef<'a, V>(pub(crate) &'a V);

impl<V: Replayable> Serialize for CheckedRef<'_, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_replayable(serializer)
    }
}

/// An error a tool with `on_error = "store"` keeps for its retries: `Serialize` and
/// `Deserialize`. Implemented for every such type; the attribute bounds the tool's error by it,
/// so that an error type that is not is one error, at the return type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored for replay: with `on_error = \"store\"` the tool's error type must implement `serde::Serialize` and `serde::Deserialize`",
    label = "this error type is not `Serialize + DeserializeOwned`",
    note = "derive both, or use `on_error = \"release\"` (the default) to let a corrected retry run instead"
)]
pub trait StoredError: Sized {
    /// Nothing: names the bound, for the attribute's check of a generic tool's types.
    #[doc(hidden)]
    fn check() {}
    /// Serializes the error for its record, as `Serialize` does.
    #[doc(hidden)]
    fn serialize_stored<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    /// Reads an error back from its record, as `Deserialize` does.
    #[doc(hidden)]
    fn deserialize_stored<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}

#[diagnostic::do_not_recommend]
impl<E: Serialize + DeserializeOwned> StoredError for E {
    fn serialize_stored<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.serialize(serializer)
    }
    fn deserialize_stored<'de, D: Deserializer<'de>>(deserializer: D) -> Result<E, D::Error> {
        E::deserialize(deserializer)
    }
}

/// An error of a tool with `on_error = "classify"`: it says what each error means
/// ([`ClassifyError`]), and the ones it classifies `Store` are kept for retries, so it is
/// `Serialize` and `Deserialize` too. Implemented for every such type; the attribute bounds the
/// tool's error by it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify itself: with `on_error = \"classify\"` the tool's error type must implement `idem::ClassifyError`, `serde::Serialize` and `serde::Deserialize`",
    label = "this error type is not `ClassifyError + Serialize + DeserializeOwned`",
    note = "implement `idem::ClassifyError` (its default says `Release`) and derive the serde traits: errors classified `Store` are replayed"
)]
pub trait ClassifiedError: Sized {
    /// Nothing: names the bound, for the attribute's check of a generic tool's types.
    #[doc(hidden)]
    fn check() {}
    /// The error's class, as [`ClassifyError::class`] says.
    #[doc(hidden)]
    fn classified(&self) -> ErrorClass;
    /// Serializes the error for its record, as `Serialize` does.
    #[doc(hidden)]
    fn serialize_classified<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    /// Reads an error back from its record, as `Deserialize` does.
    #[doc(hidden)]
    fn deserialize_classified<'de, D: Deserializer<'de>>(deserializer: D)
    -> Result<Self, D::Error>;
}

#[diagnostic::do_not_recommend]
impl<E: ClassifyError + Serialize + DeserializeOwned> ClassifiedError for E {
    fn classified(&self) -> ErrorClass {
        self.class()
    }
    fn serialize_classified<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.serialize(serializer)
    }
    fn deserialize_classified<'de, D: Deserializer<'de>>(deserializer: D) -> Result<E, D::Error> {
        E::deserialize(deserializer)
    }
}

mod sealed {
    /// A type no other crate can name, so no other crate can implement `ToolResult`.
    #[derive(Debug)]
    pub struct Sealed;
}
