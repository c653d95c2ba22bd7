//! Why a value has no canonical JSON form.

use std::fmt;

use serde::ser;

/// Why a value has no canonical JSON form.
///
/// The message never contains the value itself: arguments can carry keys or personal data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// A float was `NaN` or infinite; JSON has no such number.
    #[error("a floating-point value is NaN or infinite, which has no JSON form")]
    NonFiniteNumber,
    /// A map key serialized to something other than a string or an integer.
    #[error("a map key is not a string or an integer, which has no JSON form")]
    NonStringKey,
    /// An object has the same member name twice (for example through `#[serde(flatten)]`).
    #[error("an object has the member `{0}` twice")]
    DuplicateMember(String),
    /// The value's own `Serialize` implementation failed.
    #[error("the value's Serialize implementation failed: {0}")]
    Custom(String),
    /// The arguments' canonical JSON is larger than idem fingerprints.
    #[error("the arguments are {size} bytes as canonical JSON, over the limit of {limit}")]
    TooLarge {
        /// Their size in bytes.
        size: usize,
        /// The limit (the runtime's `Idem::max_argument_bytes`).
        limit: usize,
    },
}

impl ser::Error for CanonicalError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        CanonicalError::Custom(msg.to_string())
    }
}
