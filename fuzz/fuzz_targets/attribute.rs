//! The attribute parser and the whole expansion of `#[idempotent]`, as the proc-macro runs them:
//! for any attribute (or, with the first byte's high bit set, any item under a fixed attribute)
//! the expansion never panics, is the same twice, is syntactically valid Rust when the item is a
//! function (otherwise one `compile_error!` before the item's own tokens), and carries a
//! `compile_error!` exactly when `check` reports an error.
#![no_main]

use std::str::FromStr;

use idem_macros_core::{check, expand};
use libfuzzer_sys::fuzz_target;
use proc_macro2::TokenStream;

/// Tool fns of each form the attribute meets: arguments, a request struct, a tuple, `&self`.
const ITEMS: [&str; 4] = [
    "async fn pay(run_id: String, step_id: String, amount: u64) -> Result<u64, E> { Ok(amount) }",
    "pub async fn book(req: Booking) -> Result<Receipt, Error> { todo() }",
    "async fn tool(&self, params: Parameters<Args>) -> Result<String, String> { Ok(String::new()) }",
    "async fn natural(entity: String, status: Status) -> idem::Result<Status, E> { Ok(status) }",
];

const ATTRIBUTE: &str = "key = \"run_id, step_id\", mutating, ttl = \"24h\", skip = \"amount\"";

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let (attr, item) = if first & 0x80 == 0 {
        (text, ITEMS[usize::from(first) % ITEMS.len()])
    } else {
        (ATTRIBUTE, text)
    };
    let (Ok(attr), Ok(item)) = (TokenStream::from_str(attr), TokenStream::from_str(item)) else {
        return;
    };
    let out = expand(attr.clone(), item.clone());
    let again = expand(attr.clone(), item.clone());
    assert_eq!(
        out.to_string(),
        again.to_string(),
        "the expansion changed between two runs"
    );
    if syn::parse2::<syn::ItemFn>(item.clone()).is_err() {
        // Not a function: one error, then the user's tokens as they were (their own errors
        // are the compiler's to report).
        let text = out.to_string();
        assert!(text.starts_with(":: core :: compile_error !"), "{text}");
        assert!(text.ends_with(&item.to_string()), "{text}");
        assert!(check(attr, item).is_err());
        return;
    }
    if let Err(e) = syn::parse2::<syn::File>(out.clone()) {
        panic!("the expansion is not Rust ({e}): {out}");
    }
    let refused = out.to_string().contains("compile_error");
    match check(attr, item) {
        Ok(()) => assert!(!refused, "accepted, yet the expansion has an error: {out}"),
        Err(message) => {
            assert!(!message.is_empty());
            assert!(
                refused,
                "refused ({message}), yet the expansion has no error"
            );
        }
    }
});
