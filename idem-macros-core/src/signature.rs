//! The signature and body the attribute gives the user's function, shared by the expansion and
//! by the fallback (which keeps them on error, so that call sites still type-check).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{AttrStyle, ItemFn, ReturnType};

use crate::ast::{Ret, Tool};

/// The user's signature with `-> Result<T, E>` turned into
/// `-> Result<Outcome<T>, idem::Error<E>>`; an alias (or anything else) goes through one
/// projection, `<R as ToolResult>::Rewritten`, so that a return type that is not a `Result` is
/// one error, at the type.
pub fn rewritten_signature(tool: &Tool) -> syn::Signature {
    let mut sig = tool.item.sig.clone();
    // The transaction and the emitter are filled in by idem, never passed by callers.
    let filled: Vec<usize> = tool
        .transaction
        .iter()
        .map(|t| t.index)
        .chain(tool.emitter.iter().map(|e| e.index))
        .collect();
    if !filled.is_empty() {
        sig.inputs = sig
            .inputs
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !filled.contains(i))
            .map(|(_, input)| input)
            .collect();
    }
    let span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => Span::call_site(),
    };
    if let Some(emitter) = &tool.emitter {
        let chunk = &emitter.chunk;
        let (ok, err) = match &tool.ret {
            Ret::Explicit { ok, err } | Ret::Batch { ok, err } => (quote!(#ok), quote!(#err)),
            Ret::Alias(ty) => (
                quote!(<#ty as ::idem::ToolResult>::Ok),
                quote!(<#ty as ::idem::ToolResult>::Err),
            ),
        };
        sig.output = syn::parse_quote_spanned! {span=>
            -> ::core::result::Result<
                ::idem::Outcome<::idem::Streamed<#chunk, #ok, #err>>,
                ::idem::Error<#err>,
            >
        };
        return sig;
    }
    sig.output = match &tool.ret {
        Ret::Explicit { ok, err } => syn::parse_quote_spanned! {span=>
            -> ::core::result::Result<::idem::Outcome<#ok>, ::idem::Error<#err>>
        },
        Ret::Alias(ty) => syn::parse_quote_spanned! {span=>
            -> <#ty as ::idem::ToolResult>::Rewritten
        },
        Ret::Batch { ok, err } => syn::parse_quote_spanned! {span=>
            -> ::core::result::Result<::idem::Batch<#ok, #err>, ::idem::Error<#err>>
        },
    };
    sig
}

/// `async move { let __idem_out: R = { body }; ToolResult::into_result(__idem_out) }` (a batch
/// tool's `Vec<Result<T, E>>` as it is): the body
/// as a future of a plain `Result`, whose type errors are reported at the user's own
/// expressions, and a return type that is not a `Result` at that type (once: the signature's
/// projection reports the same).
///
/// What a keyed tool keeps (its value, and its errors under `store` and `classify`) is bounded
/// by the tool's own where-clause, not here (see `expand::kept_bounds`).
pub fn body_future(tool: &Tool) -> TokenStream {
    let block = &tool.item.block;
    let (ret, span) = match &tool.item.sig.output {
        ReturnType::Type(_, ty) => (quote!(#ty), ty.span()),
        ReturnType::Default => (quote!(()), Span::call_site()),
    };
    // At the return type, where the runtime call is spanned too. A batch tool's results are
    // handed on as they are.
    let into_result = match &tool.ret {
        Ret::Batch { .. } => quote!(__idem_out),
        _ => quote_spanned!(span=> ::idem::ToolResult::into_result(__idem_out)),
    };
    quote! {
        async move {
            #[allow(unreachable_code, clippy::diverging_sub_expression)]
            let __idem_out: #ret = #block;
            #into_result
        }
    }
}

/// Outer attributes stay on the function, inner ones (`#![allow(…)]`) open the new body.
pub fn split_attrs(item: &ItemFn) -> (Vec<&syn::Attribute>, Vec<&syn::Attribute>) {
    item.attrs
        .iter()
        .partition(|a| matches!(a.style, AttrStyle::Outer))
}
