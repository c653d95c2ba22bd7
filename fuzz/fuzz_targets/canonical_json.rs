//! Canonical JSON (RFC 8785): for any JSON document, canonicalize(parse(x)) is stable and
//! idempotent, and equal documents have equal fingerprints.
#![no_main]

use idem_core::canonical::to_canonical_json;
use idem_core::fingerprint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(first) = to_canonical_json(&value, &[]) else {
        return; // no canonical form (a non-finite number): an error, never a panic
    };
    let reparsed: serde_json::Value =
        serde_json::from_slice(&first).expect("canonical JSON is JSON");
    let second = to_canonical_json(&reparsed, &[]).expect("canonical JSON canonicalizes");
    assert_eq!(first, second, "canonicalization is idempotent");
    assert_eq!(
        fingerprint(&value, &[]).unwrap(),
        fingerprint(&reparsed, &[]).unwrap(),
        "equal documents, equal fingerprints"
    );
});
