//! Idempotency keys: the one derivation function and the validation of client-supplied keys.
//!
//! A key names one *intent*: tenant + tool name + the declared key parts, in order. The parts are
//! written in canonical JSON, every field is length-prefixed, and the whole is hashed with
//! SHA-256, so that no two different tuples can collide by concatenation (`("ab", "c")` and
//! `("a", "bc")` give different keys). Stores keep only the digest; logs, metrics and errors show
//! only [`IdempotencyKey::short_hash`]. The raw parts never leave the call.

use std::cell::Cell;
use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::canonical::{CanonicalError, write_canonical};

/// Longest client-supplied key string, in bytes (Stripe's and the IETF draft's limit).
pub const MAX_KEY_STRING_LEN: usize = 255;

/// The derived identity of one intent: SHA-256 over tenant, tool name and key parts.
///
/// Its `Debug` and `Display` show only a short prefix of the digest, so a key can be logged safely.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey([u8; 32]);

impl IdempotencyKey {
    /// Rebuilds a key from the 32 bytes a store kept.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        IdempotencyKey(bytes)
    }

    /// The 32 bytes stores keep.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The first 12 hex digits of the digest: enough to find a record, safe to log.
    pub fn short_hash(&self) -> KeyHash {
        KeyHash(self.0[..6].try_into().expect("6 bytes"))
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({})", self.short_hash())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.short_hash(), f)
    }
}

/// A short, loggable hash of an [`IdempotencyKey`] (12 hex digits).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash([u8; 6]);

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHash({self})")
    }
}

impl Serialize for KeyHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One key part in canonical form, ready for [`derive_key`].
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPart(Vec<u8>);

impl fmt::Debug for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyPart(..)")
    }
}

impl KeyPart {
    /// Canonicalizes one key part value.
    ///
    /// A part that serializes to a string must be a valid key string (see [`validate_key_string`]):
    /// 1 to 255 visible ASCII characters. Other values (numbers, UUIDs, small structs) are taken in
    /// their canonical JSON form.
    pub fn new<T: Serialize + ?Sized>(value: &T) -> Result<Self, InvalidKey> {
        let mut canonical = SPARE_PART.try_with(Cell::take).unwrap_or_default();
        canonical.reserve(64);
        write_canonical(&mut canonical, value, &[]).map_err(InvalidKey::Unserializable)?;
        if canonical.first() == Some(&b'"') {
            let inner = &canonical[1..canonical.len() - 1];
            if inner.contains(&b'\\') {
                // Escapes only come from `"`, `\` or control characters: decode to check.
                let text: String = serde_json::from_slice(&canonical).map_err(|e| {
                    InvalidKey::Unserializable(CanonicalError::Custom(e.to_string()))
                })?;
                validate_key_string(&text)?;
            } else {
                validate_key_bytes(inner)?;
            }
        }
        Ok(KeyPart(canonical))
    }

    /// Gives the part's buffer to this thread's next [`KeyPart::new`].
    fn recycle(self) {
        keep_spare(&SPARE_PART, self.0);
    }
}

thread_local! {
    /// The buffer of the last part [`EncodedParts`] took in, for the next part made on the thread.
    static SPARE_PART: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    /// The buffer of the last [`EncodedParts`] a key was derived from, for the next.
    static SPARE_PARTS: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// A buffer larger than this is freed, not kept for the next call.
const MAX_SPARE_BYTES: usize = 4096;

/// Keeps `buffer`, emptied, in the thread's `spare` for the next call, unless it is too large.
fn keep_spare(spare: &'static std::thread::LocalKey<Cell<Vec<u8>>>, mut buffer: Vec<u8>) {
    if buffer.capacity() <= MAX_SPARE_BYTES {
        buffer.clear();
        let _ = spare.try_with(|spare| spare.set(buffer));
    }
}

/// A call's key parts, in order, written as [`derive_key`] hashes them: each its length (8
/// bytes, big-endian), then its canonical JSON. What `#[idempotent]` collects: a call then
/// derives its key without allocating, reusing the buffers of the thread's previous call.
pub struct EncodedParts {
    bytes: Vec<u8>,
    count: usize,
}

impl Default for EncodedParts {
    fn default() -> Self {
        Self::new()
    }
}

impl EncodedParts {
    /// No parts yet.
    pub fn new() -> Self {
        let mut bytes = SPARE_PARTS.try_with(Cell::take).unwrap_or_default();
        bytes.reserve(128);
        EncodedParts { bytes, count: 0 }
    }

    /// Appends `part`.
    pub fn push(&mut self, part: KeyPart) {
        self.bytes
            .extend_from_slice(&(part.0.len() as u64).to_be_bytes());
        self.bytes.extend_from_slice(&part.0);
        self.count += 1;
        part.recycle();
    }

    /// The key of these parts for `tool` under `tenant`: [`derive_key`] of the same parts.
    pub fn derive(self, tenant: &str, tool: &str) -> IdempotencyKey {
        let mut h = key_hasher(tenant, tool, self.count);
        h.update(&self.bytes);
        keep_spare(&SPARE_PARTS, self.bytes);
        IdempotencyKey(h.finalize().into())
    }
}

/// Why a key (or one of its parts) was refused before the store was touched.
///
/// Messages describe the problem, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The key string is empty.
    #[error("the key is empty")]
    Empty,
    /// The key string is longer than [`MAX_KEY_STRING_LEN`] bytes.
    #[error("the key is {len} bytes long; at most 255 are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The key string has a byte that is not visible ASCII (`!` to `~`).
    #[error("the key has a character that is not visible ASCII at byte {position}")]
    InvalidCharacter {
        /// Byte offset of the first offending character.
        position: usize,
    },
    /// The key part has no canonical JSON form.
    #[error("the key part cannot be canonicalized: {0}")]
    Unserializable(CanonicalError),
}

/// Checks a client-supplied key string: 1 to 255 visible ASCII characters (`!` to `~`).
///
/// This is the syntax of Stripe's keys and of the IETF `Idempotency-Key` draft; UUIDs,
/// `req-…` identifiers and `run_id:step_id` pairs all pass.
pub fn validate_key_string(key: &str) -> Result<(), InvalidKey> {
    validate_key_bytes(key.as_bytes())
}

fn validate_key_bytes(key: &[u8]) -> Result<(), InvalidKey> {
    if key.is_empty() {
        return Err(InvalidKey::Empty);
    }
    if key.len() > MAX_KEY_STRING_LEN {
        return Err(InvalidKey::TooLong { len: key.len() });
    }
    match key.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        Some(position) => Err(InvalidKey::InvalidCharacter { position }),
        None => Ok(()),
    }
}

/// Derives the key of an intent. This is the only place keys are made.
pub fn derive_key(tenant: &str, tool: &str, parts: &[KeyPart]) -> IdempotencyKey {
    let mut h = key_hasher(tenant, tool, parts.len());
    for part in parts {
        field(&mut h, &part.0);
    }
    IdempotencyKey(h.finalize().into())
}

/// The hash of a key, fed with all but its parts: each part then goes in as a [`field`].
fn key_hasher(tenant: &str, tool: &str, parts: usize) -> Sha256 {
    let mut h = Sha256::new();
    h.update(b"idem/key/v1\0");
    field(&mut h, tenant.as_bytes());
    field(&mut h, tool.as_bytes());
    field(&mut h, &(parts as u64).to_be_bytes());
    h
}

/// One field of a key's hash: its length (8 bytes, big-endian), then its bytes.
fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// A key for a call a tool makes downstream (a payment provider, another API), derived from the
/// tool's own key and a name for the downstream call.
///
/// The same intent always derives the same downstream key: across retries, and across a
/// re-execution after a crash, so the provider deduplicates what idem could not know happened.
/// It is 64 lowercase hexadecimal characters: a valid `Idempotency-Key` (≤ 255 visible ASCII)
/// and a valid AWS-style client token (≤ 64 ASCII). It reveals nothing of the key parts.
/// Its `Debug` shows only a prefix; [`DownstreamKey::as_str`] gives the value to send.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DownstreamKey(String);

impl DownstreamKey {
    /// The value to send, e.g. as the `Idempotency-Key` header or a `ClientToken`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DownstreamKey({}…)", &self.0[..12])
    }
}

/// Derives the downstream key named `name` of `key`. This is the only place downstream keys are
/// made.
pub fn derive_downstream_key(key: &IdempotencyKey, name: &str) -> DownstreamKey {
    let mut h = Sha256::new();
    h.update(b"idem/downstream/v1\0");
    h.update(key.as_bytes());
    h.update((name.len() as u64).to_be_bytes());
    h.update(name.as_bytes());
    let digest: [u8; 32] = h.finalize().into();
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    DownstreamKey(hex)
}

/// Wraps a key part value so that method resolution can tell `Option<_>` parts (optional keys)
/// from every other type (autoref specialization: the runtime's `OptionalKeyPart` and
/// `RequiredKeyPart`, then [`UnserializableKeyPart`]). The attribute's machinery, named by the
/// code it generates.
#[doc(hidden)]
pub struct KeyPartProbe<'a, T: ?Sized>(pub &'a T);

/// A value that can be a key part: anything `Serialize` (strings, numbers, and structs of them).
/// The attribute names it so that a part that is not is one error, at the part.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a key part: a key part of an `#[idempotent]` tool must implement `serde::Serialize`",
    label = "this key part is not `Serialize`",
    note = "derive it (`#[derive(serde::Serialize)]`), or name a field of it that is: `key = \"param.field\"`"
)]
pub trait KeyPartValue {
    /// The canonical key part.
    fn key_part(&self) -> Result<KeyPart, InvalidKey>;
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + ?Sized> KeyPartValue for T {
    fn key_part(&self) -> Result<KeyPart, InvalidKey> {
        KeyPart::new(self)
    }
}

/// Chosen last, for a part whose type is not `Serialize`: method resolution always finds
/// something, so the error is the one of [`KeyPartValue`], at the part, not "no method".
/// (The attribute's machinery, public so that its errors name no private path.)
pub trait UnserializableKeyPart<T: ?Sized> {
    /// Not callable: its bound is not met.
    fn idem_key_part(&mut self) -> Result<Option<KeyPart>, InvalidKey>
    where
        T: KeyPartValue;
}

impl<T: ?Sized> UnserializableKeyPart<T> for &KeyPartProbe<'_, T> {
    fn idem_key_part(&mut self) -> Result<Option<KeyPart>, InvalidKey>
    where
        T: KeyPartValue,
    {
        self.0.key_part().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downstream_keys_are_stable_distinct_and_fit_every_provider() {
        let key = derive_key(
            "tenant-a",
            "payments.register",
            &[part("run-9"), part("step-3")],
        );
        let stripe = derive_downstream_key(&key, "stripe");
        assert_eq!(stripe, derive_downstream_key(&key, "stripe"), "stable");
        assert_ne!(
            stripe,
            derive_downstream_key(&key, "ledger"),
            "one per downstream call"
        );
        let other = derive_key(
            "tenant-b",
            "payments.register",
            &[part("run-9"), part("step-3")],
        );
        assert_ne!(
            stripe,
            derive_downstream_key(&other, "stripe"),
            "one per intent"
        );
        assert_eq!(stripe.as_str().len(), 64);
        assert!(
            stripe
                .as_str()
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert!(validate_key_string(stripe.as_str()).is_ok());
        assert!(!format!("{stripe:?}").contains(&stripe.as_str()[12..]));
        // Pinned (recomputed independently with Python's hashlib): a change here would make
        // re-executions after an upgrade send new keys downstream.
        assert_eq!(
            stripe.as_str(),
            "c1fe607baf89e6371f81a4b44f927deaf354d826530370d16ea6f5738ee0135b"
        );
    }

    fn part(s: &str) -> KeyPart {
        KeyPart::new(s).unwrap()
    }

    #[test]
    fn key_strings_are_one_to_255_visible_ascii() {
        assert_eq!(validate_key_string(""), Err(InvalidKey::Empty));
        assert!(validate_key_string("req-8e1f0c2a-5b3d-4f6e-9a7b-1c2d3e4f5a6b").is_ok());
        assert!(validate_key_string(&"k".repeat(255)).is_ok());
        assert_eq!(
            validate_key_string(&"k".repeat(256)),
            Err(InvalidKey::TooLong { len: 256 })
        );
        assert_eq!(
            validate_key_string("run 9"),
            Err(InvalidKey::InvalidCharacter { position: 3 })
        );
        assert_eq!(
            validate_key_string("señal"),
            Err(InvalidKey::InvalidCharacter { position: 2 })
        );
        assert_eq!(
            validate_key_string("a\0"),
            Err(InvalidKey::InvalidCharacter { position: 1 })
        );
    }

    #[test]
    fn string_parts_are_validated_other_values_are_not() {
        assert_eq!(KeyPart::new(""), Err(InvalidKey::Empty));
        assert!(KeyPart::new(&42_u64).is_ok());
        assert!(
            KeyPart::new(&("a b", 1)).is_ok(),
            "only top-level strings are key strings"
        );
    }

    #[test]
    fn derivation_is_injective_over_boundaries() {
        let a = derive_key("t", "tool", &[part("ab"), part("c")]);
        let b = derive_key("t", "tool", &[part("a"), part("bc")]);
        let c = derive_key("tt", "ool", &[part("ab"), part("c")]);
        let d = derive_key("t", "tool", &[part("c"), part("ab")]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(a, derive_key("t", "tool", &[part("ab"), part("c")]));
    }

    #[test]
    fn numbers_and_strings_with_the_same_digits_are_different_parts() {
        let n = derive_key("t", "tool", &[KeyPart::new(&42).unwrap()]);
        let s = derive_key("t", "tool", &[part("42")]);
        assert_ne!(n, s);
    }

    #[test]
    fn golden_key_is_pinned() {
        // A release that changes this value orphans every stored key: do not update it lightly.
        let key = derive_key(
            "tenant-a",
            "payments.register",
            &[part("r-9"), part("step-3")],
        );
        assert_eq!(key.short_hash().to_string(), GOLDEN_KEY_PREFIX);
    }

    const GOLDEN_KEY_PREFIX: &str = "6d4ced499334";

    #[test]
    fn parts_collected_one_by_one_derive_the_same_key_call_after_call() {
        // What `#[idempotent]` collects (`EncodedParts`) must derive what `derive_key` derives,
        // also on later calls of the thread, which reuse the buffers of earlier ones.
        for (tenant, parts) in [
            ("tenant-a", vec!["r-9", "step-3"]),
            (
                "tenant-b",
                vec!["a-much-longer-run-identifier-than-the-last"],
            ),
            ("tenant-a", vec![]),
            ("tenant-a", vec!["r-9", "step-3"]),
        ] {
            let mut encoded = EncodedParts::new();
            for p in &parts {
                encoded.push(part(p));
            }
            let collected: Vec<KeyPart> = parts.iter().map(|p| part(p)).collect();
            assert_eq!(
                encoded.derive(tenant, "payments.register"),
                derive_key(tenant, "payments.register", &collected),
                "{tenant} {parts:?}"
            );
        }
        let mut encoded = EncodedParts::new();
        encoded.push(part("r-9"));
        encoded.push(part("step-3"));
        let key = encoded.derive("tenant-a", "payments.register");
        assert_eq!(key.short_hash().to_string(), GOLDEN_KEY_PREFIX);
    }

    #[test]
    fn display_never_shows_the_parts() {
        let key = derive_key("tenant-a", "tool", &[part("secret-run-id")]);
        assert!(!format!("{key} {key:?}").contains("secret"));
        assert_eq!(key.to_string().len(), 12);
    }
}
