//! HTTP on both sides of the wire: a tower layer that makes POST and PATCH routes idempotent
//! ([`server`], draft-ietf-httpapi-idempotency-key-header with Stripe's practical behaviour),
//! and a reqwest client that sends one key per intent and retries with it ([`client`]).
//!
//! Both share the syntax of the `Idempotency-Key` header, parsed by [`parse_key_header`].

use http::HeaderMap;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "server")]
pub mod server;

/// The header both sides use.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header a replayed response carries (`true`).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Why an `Idempotency-Key` header was refused (each is a 400 on the server side).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The header appears more than once.
    #[error("the Idempotency-Key header appears {count} times; send it once")]
    Repeated {
        /// How many times.
        count: usize,
    },
    /// The header is present but empty.
    #[error("the Idempotency-Key header is empty")]
    Empty,
    /// The value is not a structured-field String (`"…"`) and bare keys are not accepted, or a
    /// quoted value is not a valid structured-field String.
    #[error("the Idempotency-Key header is not a structured-field string (`\"…\"`): {reason}")]
    NotAString {
        /// What is wrong.
        reason: &'static str,
    },
    /// The key is longer than 255 characters or has a character that is not visible ASCII.
    #[error("the idempotency key is invalid: {0}")]
    Invalid(idem_core::key::InvalidKey),
}

/// Reads the `Idempotency-Key` of a request: `Ok(None)` when there is none.
///
/// The value is an RFC 9651 structured-field String (`"8e03978e-40d5"`, with `\"` and `\\`
/// escapes) or, when `lenient` (Stripe's clients send bare keys), the bare value. Either way the
/// key is 1 to 255 visible ASCII characters. A repeated header or an empty value is an error.
pub fn parse_key_header(
    headers: &HeaderMap,
    lenient: bool,
) -> Result<Option<String>, KeyHeaderError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let count = 1 + values.count();
    if count > 1 {
        return Err(KeyHeaderError::Repeated { count });
    }
    let raw = value.as_bytes().trim_ascii();
    if raw.is_empty() {
        return Err(KeyHeaderError::Empty);
    }
    let key = if raw.first() == Some(&b'"') {
        parse_sf_string(raw)?
    } else if lenient {
        String::from_utf8(raw.to_vec()).map_err(|_| {
            KeyHeaderError::Invalid(idem_core::key::InvalidKey::InvalidCharacter {
                position: raw.iter().position(|b| !b.is_ascii()).unwrap_or(0),
            })
        })?
    } else {
        return Err(KeyHeaderError::NotAString {
            reason: "it does not start with `\"`",
        });
    };
    idem_core::key::validate_key_string(&key).map_err(KeyHeaderError::Invalid)?;
    Ok(Some(key))
}

/// An RFC 9651 §4.2.5 String: `"`, printable ASCII with `\"` and `\\` escapes, `"`, nothing after.
fn parse_sf_string(raw: &[u8]) -> Result<String, KeyHeaderError> {
    let not = |reason| KeyHeaderError::NotAString { reason };
    let mut out = String::new();
    let mut bytes = raw[1..].iter();
    loop {
        match bytes.next() {
            None => return Err(not("the closing `\"` is missing")),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c as char),
                _ => return Err(not("`\\` escapes only `\"` and `\\`")),
            },
            Some(&c @ 0x20..=0x7e) => out.push(c as char),
            Some(_) => return Err(not("it has a character that is not printable ASCII")),
        }
    }
    if bytes.next().is_some() {
        // Parameters (`;a=1`) are legal structured fields, but no key needs them.
        return Err(not("something follows the closing `\"`"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parse(values: &[&[u8]], lenient: bool) -> Result<Option<String>, KeyHeaderError> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(v).unwrap());
        }
        parse_key_header(&headers, lenient)
    }

    #[test]
    fn structured_strings_and_bare_keys() {
        assert_eq!(parse(&[], true), Ok(None));
        assert_eq!(parse(&[b"\"abc-1\""], false), Ok(Some("abc-1".into())));
        assert_eq!(parse(&[b" \"abc\" "], false), Ok(Some("abc".into())));
        assert_eq!(
            parse(&[br#""a\"b\\c""#], false),
            Ok(Some(r#"a"b\c"#.into()))
        );
        assert_eq!(parse(&[b"abc-1"], true), Ok(Some("abc-1".into())));
        assert!(matches!(
            parse(&[b"abc-1"], false),
            Err(KeyHeaderError::NotAString { .. })
        ));
        let long = format!("\"{}\"", "k".repeat(255));
        assert_eq!(parse(&[long.as_bytes()], false), Ok(Some("k".repeat(255))));
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert_eq!(
            parse(&[b"a", b"b"], true),
            Err(KeyHeaderError::Repeated { count: 2 })
        );
        assert_eq!(parse(&[b""], true), Err(KeyHeaderError::Empty));
        assert_eq!(parse(&[b"   "], true), Err(KeyHeaderError::Empty));
        for bad in [&b"\"abc"[..], b"\"a\\nb\"", b"\"abc\";x=1", b"\"a\tb\""] {
            assert!(
                matches!(parse(&[bad], true), Err(KeyHeaderError::NotAString { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        for bad in [&b"\"\""[..], b"\"a b\"", b"a b"] {
            assert!(
                matches!(parse(&[bad], true), Err(KeyHeaderError::Invalid(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = "k".repeat(256);
        assert!(matches!(
            parse(&[long.as_bytes()], true),
            Err(KeyHeaderError::Invalid(
                idem_core::key::InvalidKey::TooLong { len: 256 }
            ))
        ));
        assert!(matches!(
            parse(&["clé".as_bytes()], true),
            Err(KeyHeaderError::Invalid(_))
        ));
    }
}
