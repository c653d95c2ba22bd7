//! JSON text as JCS writes it: strings escaped as ECMAScript's `JSON.stringify` does, and
//! objects with their members in UTF-16 order.

use std::borrow::Cow;
use std::ops::Range;

/// Writes the object of `entries`, in their order; `value` copies a member's value (a range of
/// the members' buffer) to `out`.
pub(super) fn write_object(
    out: &mut Vec<u8>,
    entries: &[(Cow<'static, str>, Range<usize>)],
    mut value: impl FnMut(&mut Vec<u8>, Range<usize>),
) {
    out.push(b'{');
    for (i, (name, range)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, name);
        out.push(b':');
        value(out, range.clone());
    }
    out.push(b'}');
}

/// JCS orders member names by their UTF-16 code units, which differs from byte order only for
/// characters outside the Basic Multilingual Plane. So the bytes decide wherever the first
/// difference is an ASCII byte (an ASCII character against another, or against the lead byte of
/// a longer one, which is larger in both orders); UTF-16 is compared only past a difference
/// between two non-ASCII bytes.
pub(super) fn compare_utf16(a: &str, b: &str) -> std::cmp::Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        Some(i) if x[i] < 0x80 || y[i] < 0x80 => x[i].cmp(&y[i]),
        Some(_) => a.encode_utf16().cmp(b.encode_utf16()),
    }
}

/// Escapes a string as ECMAScript's `JSON.stringify` does.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Most strings (ids, names, amounts) need no escape at all.
    if !bytes.iter().any(|&b| ESCAPED[usize::from(b)]) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// The bytes a JSON string escapes: control characters, `"` and `\`.
const ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};
