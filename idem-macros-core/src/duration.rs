//! Human durations of the attribute: `24h`, `30s`, `500ms`, `1h30m`, `7d`.

/// Parses a duration into milliseconds. Units: `ms`, `s`, `m`, `h`, `d`; several may follow each
/// other (`1h30m`). Zero and overflow are errors.
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let help =
        "expected a duration such as `24h`, `30s`, `500ms` or `1h30m` (units: ms, s, m, h, d)";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("the duration is empty; {help}"));
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("`{text}` is not a duration; {help}"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("`{text}` is too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let factor = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(format!("`{text}` has a number without a unit; {help}")),
            unit => return Err(format!("unknown unit `{unit}` in `{text}`; {help}")),
        };
        rest = &rest[unit_len..];
        total = value
            .checked_mul(factor)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("`{text}` is too large"))?;
    }
    if total == 0 {
        return Err(format!(
            "`{text}` is zero; a zero duration would disable the protection"
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn units_and_sequences() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("2m"), Ok(120_000));
        assert_eq!(parse_millis("24h"), Ok(86_400_000));
        assert_eq!(parse_millis("7d"), Ok(604_800_000));
        assert_eq!(parse_millis("1h30m"), Ok(5_400_000));
    }

    #[test]
    fn errors_say_what_is_expected() {
        for bad in [
            "",
            "h",
            "10",
            "10x",
            "1.5h",
            "0s",
            "-1s",
            "99999999999999999999d",
            "1h 30m",
        ] {
            let err = parse_millis(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
        }
        assert!(parse_millis("10").unwrap_err().contains("without a unit"));
        assert!(
            parse_millis("10x")
                .unwrap_err()
                .contains("unknown unit `x`")
        );
        assert!(parse_millis("0s").unwrap_err().contains("zero"));
    }
}
