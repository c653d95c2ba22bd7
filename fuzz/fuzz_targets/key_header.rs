//! The `Idempotency-Key` header parser: never panics; a key it accepts is valid, and quoting it
//! as a structured-field String parses back to the same key, strictly and leniently.
#![no_main]

use http::{HeaderMap, HeaderValue};
use idem_http::{IDEMPOTENCY_KEY, parse_key_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Lines are header fields (a repeated header is several lines).
    let mut headers = HeaderMap::new();
    for line in data.split(|b| *b == b'\n').take(4) {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append(IDEMPOTENCY_KEY, value);
        }
    }
    for lenient in [true, false] {
        let Ok(Some(key)) = parse_key_header(&headers, lenient) else {
            continue;
        };
        assert!(idem_core::validate_key_string(&key).is_ok(), "{key:?}");
        let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
        let mut again = HeaderMap::new();
        again.insert(IDEMPOTENCY_KEY, HeaderValue::from_str(&quoted).unwrap());
        assert_eq!(parse_key_header(&again, false), Ok(Some(key.clone())));
        assert_eq!(parse_key_header(&again, true), Ok(Some(key)));
    }
});
