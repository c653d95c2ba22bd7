//! Canonical JSON (RFC 8785, JCS) written straight from any `serde::Serialize` value.
//!
//! Fingerprints and key parts must not depend on field order, map order, whitespace or the
//! `serde_json/preserve_order` feature, so idem never hashes the output of `serde_json`. This
//! serializer writes the JCS form directly:
//!
//! - object members sorted by the UTF-16 code units of their names, no whitespace;
//! - strings escaped as ECMAScript's `JSON.stringify` does (only `"`, `\` and control characters);
//! - floating-point numbers in ECMAScript's shortest form (`4.50` → `4.5`, `1E30` → `1e+30`).
//!
//! One deliberate strictness beyond JCS: integers are written exactly, in full, instead of being
//! rounded through an IEEE double. Two different `u64` amounts above 2^53 therefore never share a
//! fingerprint. Below 2^53 the output is identical to JCS. Non-finite floats (`NaN`, `inf`) and
//! non-string map keys other than integers are errors: they have no JSON form.
//!
//! The output does not depend on which features another crate turned on in `serde_json`: with
//! `arbitrary_precision`, a `serde_json::Number` serializes as a private struct holding its text,
//! which is read back here and written as `serde_json` would without the feature (integers that
//! fit `u64`/`i64` exactly, other numbers as the nearest double in ECMAScript's form); a
//! `serde_json::value::RawValue` is parsed and written canonical, not hashed as its text.
//!
//! | value | canonical form |
//! |---|---|
//! | integers, `u128`/`i128` included | exact decimal digits |
//! | `f32`/`f64` | ECMAScript's shortest form; `NaN` and infinities are [`CanonicalError::NonFiniteNumber`] |
//! | bytes (`serialize_bytes`) | an array of numbers, as `serde_json` writes them |
//! | map keys | strings as they are; integers and chars as their text; anything else [`CanonicalError::NonStringKey`] |
//! | newtype structs, untagged enums | their content; newtype variants `{"Variant": value}` |
//! | `#[serde(flatten)]` | members of the enclosing object; a name twice is [`CanonicalError::DuplicateMember`] |

mod error;
mod map_key;
mod serializer;
mod text;

use serde::Serialize;

pub use self::error::CanonicalError;
pub(crate) use self::serializer::{Members, write_canonical};

/// Writes the canonical JSON of `value`, leaving out the members named by `skip`.
///
/// Each entry of `skip` is a path of member names from the top of `value`
/// (`["sent_at"]`, `["req", "trace_id"]`); a path that names nothing is ignored.
pub fn to_canonical_json<T: Serialize + ?Sized>(
    value: &T,
    skip: &[&[&str]],
) -> Result<Vec<u8>, CanonicalError> {
    let mut out = Vec::with_capacity(64);
    write_canonical(&mut out, value, skip)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
