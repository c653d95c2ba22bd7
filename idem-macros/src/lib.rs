//! The `#[idempotent]` attribute of [idem](https://docs.rs/idem). Use it through the `idem`
//! facade, whose documentation describes every option.
//!
//! The pipeline, one stage per file: `args.rs` parses the attribute, `ast.rs` builds the checked
//! model of the tool fn, `valid.rs` applies the semantic rules, `expand.rs` writes the thin glue
//! that calls the runtime, and `fallback.rs` writes the error output (the `compile_error!` and the
//! user's function, so that call sites still resolve).

mod args;
mod ast;
mod duration;
mod expand;
mod fallback;
mod valid;

use proc_macro::TokenStream;

/// Makes an async tool function safe to retry. See the `idem` crate for the options.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(attr.into(), item.into()).into()
}
