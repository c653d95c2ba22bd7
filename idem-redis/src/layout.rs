//! Offsets of a record's fixed-width header, as the crate docs lay the record out (1-based
//! there, 0-based ranges here): the fingerprint, the status, the expiry, the lease's expiry, the
//! creation time, the token and the length of the tool name, then the name; and how a number
//! field reads.

pub(crate) const FINGERPRINT: std::ops::Range<usize> = 0..32;
pub(crate) const STATUS: usize = 32;
pub(crate) const EXPIRES: std::ops::Range<usize> = 33..49;
pub(crate) const LEASE: std::ops::Range<usize> = 49..65;
pub(crate) const CREATED: std::ops::Range<usize> = 65..81;
pub(crate) const TOKEN: std::ops::Range<usize> = 81..100;
pub(crate) const TOOL_LEN: std::ops::Range<usize> = 100..104;
pub(crate) const HEADER: usize = 104;

/// The number a fixed-width field spells: its digits, zero-padded, and nothing else (read from
/// the bytes as they are: no text to validate first).
pub(crate) fn digits(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    field.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::digits;

    #[test]
    fn a_field_is_its_digits_and_nothing_else() {
        assert_eq!(digits(b"0001700000000000"), Some(1_700_000_000_000));
        assert_eq!(digits(b"0000"), Some(0));
        assert_eq!(digits(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"+123",
            b"-1",
            b"12 3",
            b"0x10",
            b"18446744073709551616",
        ] {
            assert_eq!(digits(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
