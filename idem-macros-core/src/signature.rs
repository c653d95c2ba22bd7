//! The signature and body the attribute gives the user's function, shared by the expansion and
//! by the fallback (which keeps them on error, so that call sites still type-check).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{AttrStyle, ItemFn, ReturnType};

use crate::ast::{Ret, Tool};

/// The value and error types of the rewritten signature.
pub fn result_types(tool: &Tool) -> (TokenStream, TokenStream) {
    match &tool.ret {
        Ret::Explicit { ok, err } => (quote!(#ok), quote!(#err)),
        Ret::Alias(ty) => (
            quote_spanned!(ty.span()=> <#ty as ::idem::ToolResult>::Ok),
            quote_spanned!(ty.span()=> <#ty as ::idem::ToolResult>::Err),
        ),
    }
}

/// The user's signature with `-> Result<T, E>` turned into
/// `-> Result<Outcome<T>, idem::Error<E>>`.
pub fn rewritten_signature(tool: &Tool) -> syn::Signature {
    let (ok, err) = result_types(tool);
    let mut sig = tool.item.sig.clone();
    let span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => Span::call_site(),
    };
    sig.output = syn::parse_quote_spanned! {span=>
        -> ::core::result::Result<::idem::Outcome<#ok>, ::idem::Error<#err>>
    };
    sig
}

/// `async move { let __idem_out: R = { body }; __idem_out }`: the body as a future whose type
/// errors are reported at the user's own expressions.
pub fn body_future(tool: &Tool) -> TokenStream {
    let block = &tool.item.block;
    let ret = match &tool.item.sig.output {
        ReturnType::Type(_, ty) => quote!(#ty),
        ReturnType::Default => quote!(()),
    };
    quote! {
        async move {
            #[allow(unreachable_code, clippy::diverging_sub_expression)]
            let __idem_out: #ret = #block;
            __idem_out
        }
    }
}

/// Outer attributes stay on the function, inner ones (`#![allow(…)]`) open the new body.
pub fn split_attrs(item: &ItemFn) -> (Vec<&syn::Attribute>, Vec<&syn::Attribute>) {
    item.attrs
        .iter()
        .partition(|a| matches!(a.style, AttrStyle::Outer))
}
