//! The `#[idempotent]` attribute of [idem](https://docs.rs/idem-agent). Use it through the `idem`
//! facade, whose documentation describes every option. The expansion itself lives in
//! `idem-macros-core`, a plain library that the fuzz targets call too.

use proc_macro::TokenStream;

/// Makes an async tool function safe to retry. See the `idem` crate for the options.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    idem_macros_core::expand(attr.into(), item.into()).into()
}
