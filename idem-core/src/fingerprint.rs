//! Fingerprints: SHA-256 of the RFC 8785 canonical JSON of a tool's arguments.
//!
//! A retry with the same key must carry the same arguments; the fingerprint is how the store
//! tells. It is computed from canonical JSON (see [`crate::canonical`]) so that member order,
//! whitespace and `serde_json` features cannot turn a faithful retry into a mismatch, and with
//! declared volatile fields left out (`skip = "sent_at"`), so that a timestamp injected by a client
//! library does not either.

use std::borrow::Cow;
use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::canonical::{CanonicalError, Members, to_canonical_json};

/// SHA-256 of the canonical JSON of a tool's arguments.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Rebuilds a fingerprint from the 32 bytes a store kept.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }

    /// The 32 bytes stores keep.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The only hash of canonical bytes: every fingerprint goes through here.
    fn of_canonical(canonical: &[u8]) -> Self {
        Fingerprint(Sha256::digest(canonical).into())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// The fingerprint of one value: SHA-256 of its canonical JSON, with `skip` paths left out.
pub fn fingerprint<T: Serialize + ?Sized>(
    value: &T,
    skip: &[&[&str]],
) -> Result<Fingerprint, CanonicalError> {
    Ok(Fingerprint::of_canonical(&to_canonical_json(value, skip)?))
}

/// Builds the fingerprint of a tool's argument list, one named argument at a time.
///
/// The result equals [`fingerprint`] of a JSON object whose members are the arguments: tools
/// with the same arguments agree, whatever order the parameters are declared in.
#[must_use]
pub struct ArgsFingerprint<'s> {
    skip: &'s [&'s [&'s str]],
    members: Members,
    error: Option<CanonicalError>,
}

impl std::fmt::Debug for ArgsFingerprint<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArgsFingerprint").finish_non_exhaustive()
    }
}

impl<'s> ArgsFingerprint<'s> {
    /// Starts an empty argument list; `skip` paths start with an argument name.
    pub fn new(skip: &'s [&'s [&'s str]]) -> Self {
        ArgsFingerprint {
            skip,
            members: Members::reused(4, 256),
            error: None,
        }
    }

    /// Adds one argument under its parameter name.
    pub fn arg<T: Serialize + ?Sized>(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: &T,
    ) -> Self {
        if self.error.is_none()
            && let Err(e) = self.members.add(name.into(), value, self.skip)
        {
            self.error = Some(e);
        }
        self
    }

    /// The fingerprint of the arguments added so far. Arguments larger than `limit` bytes as
    /// canonical JSON are refused ([`CanonicalError::TooLarge`]): the runtime passes its
    /// `max_argument_bytes`.
    pub fn finish(self, limit: usize) -> Result<Fingerprint, CanonicalError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut members = self.members;
        let object = members.object()?;
        if object.len() > limit {
            return Err(CanonicalError::TooLarge {
                size: object.len(),
                limit,
            });
        }
        let fingerprint = Fingerprint::of_canonical(object);
        members.recycle();
        Ok(fingerprint)
    }
}

/// An argument of a keyed `#[idempotent]` tool: anything `Serialize`. The attribute adds every
/// argument to the fingerprint through this trait, so that one that is not `Serialize` is one
/// error, at the parameter. Implemented for every `Serialize` type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted: every argument of an `#[idempotent]` tool (key parts included) must implement `serde::Serialize`",
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

#[diagnostic::do_not_recommend]
impl<T: Serialize + ?Sized> ToolArgument for T {
    fn add_to<'s>(
        &self,
        fingerprint: ArgsFingerprint<'s>,
        name: &'static str,
    ) -> ArgsFingerprint<'s> {
        fingerprint.arg(name, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hex(fp: Fingerprint) -> String {
        crate::hex::encode(fp.as_bytes())
    }

    /// Golden vectors: each is `sha256` of the canonical text, so anyone can check them with
    /// `printf '%s' '{"a":1}' | sha256sum`. A release that changes one turns every faithful
    /// retry into a mismatch: do not update them.
    #[test]
    fn golden_vectors_are_pinned() {
        let cases: [(serde_json::Value, &str); 4] = [
            (
                json!({"b": 2, "a": 1}),
                "43258cff783fe7036d8a43033f830adfc60ec037382473548ac742b888292777",
            ),
            (
                json!({"customer": "cus_42", "amount_cents": 500, "run_id": "r-9", "step_id": "3"}),
                GOLDEN_PAYMENT,
            ),
            (
                json!({"numbers": [4.50, 1e30, 2e-3], "s": "€\n"}),
                GOLDEN_NUMBERS,
            ),
            (
                json!([]),
                "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(hex(fingerprint(&value, &[]).unwrap()), expected, "{value}");
        }
    }

    const GOLDEN_PAYMENT: &str = "d6b69b9788551d2fbfd7e6e475113eb754fd48bbd989961bdec199c716bb9280";
    const GOLDEN_NUMBERS: &str = "18149aa41f08001b8c5adf98508743138b67cdb01cd54ac6384817b4c5472e4a";

    #[test]
    fn args_builder_equals_the_fingerprint_of_the_object() {
        let built = ArgsFingerprint::new(&[])
            .arg("step_id", "3")
            .arg("run_id", "r-9")
            .arg("amount_cents", &500_u64)
            .arg("customer", "cus_42")
            .finish(usize::MAX)
            .unwrap();
        assert_eq!(hex(built), GOLDEN_PAYMENT);
    }

    #[test]
    fn skipped_arguments_and_fields_do_not_count() {
        let skip: &[&[&str]] = &[&["sent_at"], &["req", "trace_id"]];
        let a = ArgsFingerprint::new(skip)
            .arg("req", &json!({"amount": 5, "trace_id": "t-1"}))
            .arg("sent_at", &1_700_000_000_u64)
            .finish(usize::MAX)
            .unwrap();
        let b = ArgsFingerprint::new(skip)
            .arg("req", &json!({"amount": 5, "trace_id": "t-2"}))
            .arg("sent_at", &1_800_000_000_u64)
            .finish(usize::MAX)
            .unwrap();
        let c = ArgsFingerprint::new(skip)
            .arg("req", &json!({"amount": 6, "trace_id": "t-1"}))
            .finish(usize::MAX)
            .unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn buffers_reused_from_earlier_fingerprints_change_nothing() {
        // Member lists are kept per thread for the next object: whatever the last one left
        // (an error half-way, nested objects, a list too large to keep), the next is the same.
        let nested = json!({"req": {"b": [1, {"z": 1, "a": 2}], "a": "x"}, "n": 5});
        let first = ArgsFingerprint::new(&[])
            .arg("a", &nested)
            .arg("b", &1)
            .finish(usize::MAX)
            .unwrap();
        let _ = ArgsFingerprint::new(&[])
            .arg("q", &json!({"k": {"deep": 1}}))
            .arg("x", &f64::NAN)
            .finish(usize::MAX);
        let _ = fingerprint(&json!({"big": "y".repeat(20_000)}), &[]);
        for _ in 0..3 {
            let again = ArgsFingerprint::new(&[])
                .arg("b", &1)
                .arg("a", &nested)
                .finish(usize::MAX)
                .unwrap();
            assert_eq!(again, first);
        }
    }

    #[test]
    fn an_unserializable_argument_is_an_error() {
        let r = ArgsFingerprint::new(&[])
            .arg("ratio", &f64::NAN)
            .arg("x", &1)
            .finish(usize::MAX);
        assert_eq!(r, Err(CanonicalError::NonFiniteNumber));
    }

    #[test]
    fn fingerprints_ignore_insertion_order_with_or_without_preserve_order() {
        // With `--features __preserve_order` serde_json keeps insertion order in `Value`;
        // canonical JSON sorts anyway. CI runs this file both ways.
        let mut m1 = serde_json::Map::new();
        m1.insert("z".into(), json!(1));
        m1.insert("a".into(), json!({"y": 2, "b": 3}));
        let mut m2 = serde_json::Map::new();
        m2.insert("a".into(), json!({"b": 3, "y": 2}));
        m2.insert("z".into(), json!(1));
        assert_eq!(
            fingerprint(&m1, &[]).unwrap(),
            fingerprint(&m2, &[]).unwrap()
        );
    }
}
