//! Lowercase hexadecimal, as keys, tenants and digests are spelled in store keys and ids.
//!
//! On the hot path: the Redis store spells the tenant and the key of every claim and completion.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends `bytes` to `out`, two digits each.
pub(crate) fn push(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// `bytes`, two digits each.
pub(crate) fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push(&mut out, bytes);
    out
}

/// The bytes `text` spells (either case); `None` unless it is an even number of hex digits
/// and nothing else (no sign, no spaces).
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_byte_reads_back_and_matches_the_formatter() {
        let all: Vec<u8> = (0..=255).collect();
        let text = super::encode(&all);
        let formatted: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(text, formatted);
        assert_eq!(super::decode(&text), Some(all));
        assert_eq!(super::decode("0A"), Some(vec![10]));
        for bad in ["a", "0g", "é0", "+1", "-1", " 1"] {
            assert_eq!(super::decode(bad), None, "{bad:?}");
        }
    }
}
