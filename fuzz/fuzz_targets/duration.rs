//! The duration parser of the attribute (`ttl = "24h"`, `lease = "1h30m"`): never panics, never
//! answers zero, and reads back exactly what the tool report writes (`format_duration`).
#![no_main]

use std::time::Duration;

use idem_macros_core::duration::parse_millis;
use idem_runtime::registry::format_duration;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_millis(text) {
        Ok(millis) => {
            assert!(millis > 0, "{text:?} parsed to zero");
            let written = format_duration(Duration::from_millis(millis));
            assert_eq!(
                parse_millis(&written),
                Ok(millis),
                "{text:?} written as {written:?}"
            );
        }
        Err(message) => assert!(!message.is_empty(), "{text:?}: an empty error"),
    }
});
