//! The record codec: what a completed record's bytes hold, and how they read back.
//!
//! | bytes | meaning |
//! |---|---|
//! | `{"ok": VALUE}` | the body's value, replayed as `Outcome::Replayed` |
//! | `{"err": ERROR}` | an error the tool's policy stores, replayed as `Error::Tool { replayed: true, .. }` |
//! | `{"too_large": {"size": N, "limit": M}}` | a value or error larger than the runtime keeps: never truncated, answered `Error::ResultTooLarge` |

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};

/// What a record stores: the body's value or, when its class is `Store`, its error.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StoredRef<'a, T, E> {
    Ok(&'a T),
    Err(&'a E),
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Stored<T, E> {
    Ok(T),
    Err(E),
}

/// Encodes the body's value.
pub(crate) fn encode_value<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&StoredRef::<T, ()>::Ok(value))
}

/// Encodes an error the tool's policy stores.
pub(crate) fn encode_error<E: Serialize>(error: &E) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&StoredRef::<(), E>::Err(error))
}

/// Decodes a record of a tool whose errors are never stored.
pub(crate) fn decode_value<T: DeserializeOwned, E>(
    bytes: &[u8],
) -> Result<Result<T, E>, serde_json::Error> {
    match serde_json::from_slice::<Stored<T, IgnoredAny>>(bytes)? {
        Stored::Ok(v) => Ok(Ok(v)),
        Stored::Err(_) => Err(serde::de::Error::custom(
            "the record holds an error, but the tool no longer stores errors",
        )),
    }
}

/// Decodes a record of a tool whose errors may be stored.
pub(crate) fn decode_stored<T: DeserializeOwned, E: DeserializeOwned>(
    bytes: &[u8],
) -> Result<Result<T, E>, serde_json::Error> {
    Ok(match serde_json::from_slice::<Stored<T, E>>(bytes)? {
        Stored::Ok(v) => Ok(v),
        Stored::Err(e) => Err(e),
    })
}

/// What a record holds instead of a result too large to keep.
#[derive(Serialize, Deserialize)]
struct TooLarge {
    too_large: TooLargeSize,
}

#[derive(Serialize, Deserialize)]
struct TooLargeSize {
    size: usize,
    limit: usize,
}

pub(crate) fn too_large_record(size: usize, limit: usize) -> Vec<u8> {
    serde_json::to_vec(&TooLarge {
        too_large: TooLargeSize { size, limit },
    })
    .expect("two numbers serialize")
}

/// `(size, limit)` when the record holds [`too_large_record`] (a stored value or error starts
/// with `{"ok"` or `{"err"`, never with this).
pub(crate) fn too_large_marker(bytes: &[u8]) -> Option<(usize, usize)> {
    if !bytes.starts_with(br#"{"too_large""#) {
        return None;
    }
    let TooLarge { too_large } = serde_json::from_slice(bytes).ok()?;
    Some((too_large.size, too_large.limit))
}

#[cfg(test)]
mod tests {
    use super::{
        decode_stored, decode_value, encode_error, encode_value, too_large_marker, too_large_record,
    };

    #[test]
    fn a_value_and_a_stored_error_read_back_as_they_were() {
        let value = encode_value(&vec![1, 2]).unwrap();
        assert_eq!(value, br#"{"ok":[1,2]}"#);
        assert_eq!(
            decode_stored::<Vec<u8>, String>(&value).unwrap(),
            Ok(vec![1, 2])
        );
        let error = encode_error(&"declined").unwrap();
        assert_eq!(error, br#"{"err":"declined"}"#);
        assert_eq!(
            decode_stored::<Vec<u8>, String>(&error).unwrap(),
            Err("declined".to_owned())
        );
    }

    #[test]
    fn a_stored_error_is_unreadable_to_a_tool_that_no_longer_stores_errors() {
        let error = encode_error(&"declined").unwrap();
        assert!(decode_value::<u8, String>(&error).is_err());
        assert_eq!(decode_value::<u8, String>(br#"{"ok":3}"#).unwrap(), Ok(3));
    }

    #[test]
    fn the_too_large_marker_is_told_apart_from_every_value() {
        let marker = too_large_record(2_000_000, 1 << 20);
        assert_eq!(too_large_marker(&marker), Some((2_000_000, 1 << 20)));
        assert_eq!(too_large_marker(&encode_value(&"too_large").unwrap()), None);
        assert_eq!(too_large_marker(br#"{"ok":{"too_large":1}}"#), None);
    }
}
