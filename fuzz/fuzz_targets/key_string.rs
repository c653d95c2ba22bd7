//! Client key validation: it accepts exactly 1 to 255 visible ASCII characters, and a key part
//! made of a string is accepted exactly when the string is.
#![no_main]

use idem_core::key::KeyPart;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let valid =
        !text.is_empty() && text.len() <= 255 && text.bytes().all(|b| (0x21..=0x7e).contains(&b));
    assert_eq!(
        idem_core::validate_key_string(text).is_ok(),
        valid,
        "{text:?}"
    );
    assert_eq!(KeyPart::new(text).is_ok(), valid, "{text:?}");
});
