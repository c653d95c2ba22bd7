//! Lowercase hexadecimal, as keys, tenants and digests are spelled in store keys and ids.
//!
//! On the hot path: the Redis store spells the tenant and the key of every claim and completion.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Each byte's two digits, looked up at once.
const PAIRS: [[u8; 2]; 256] = {
    let mut pairs = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        pairs[b] = [DIGITS[b >> 4], DIGITS[b & 0x0f]];
        b += 1;
    }
    pairs
};

/// Appends `bytes` to `out`, two digits each: a byte's pair looked up at once, spelled 32 bytes
/// at a time on the stack and appended at once (a `char` at a time costs four times as many
/// instructions).
pub fn push(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    let mut spelled = [0u8; 64];
    for chunk in bytes.chunks(32) {
        for (digits, &b) in spelled.chunks_exact_mut(2).zip(chunk) {
            digits.copy_from_slice(&PAIRS[usize::from(b)]);
        }
        let text = &spelled[..chunk.len() * 2];
        out.push_str(std::str::from_utf8(text).expect("hex digits are ASCII"));
    }
}

/// `bytes`, two digits each.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push(&mut out, bytes);
    out
}

/// The bytes `text` spells (either case); `None` unless it is an even number of hex digits
/// and nothing else (no sign, no spaces).
pub fn decode(text: &str) -> Option<Vec<u8>> {
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
        assert_eq!(super::decode(&text), Some(all.clone()));
        // Appended after what is there, in chunks that need not be whole.
        let mut out = String::from("k:");
        super::push(&mut out, &all[..33]);
        assert_eq!(out, format!("k:{}", &formatted[..66]));
        assert_eq!(super::decode("0A"), Some(vec![10]));
        for bad in ["a", "0g", "é0", "+1", "-1", " 1"] {
            assert_eq!(super::decode(bad), None, "{bad:?}");
        }
    }
}
