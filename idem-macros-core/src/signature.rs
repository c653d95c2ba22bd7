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
    if let Some(transaction) = &tool.transaction {
        // Filled in by idem, never passed by callers.
        sig.inputs = sig
            .inputs
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i != transaction.index)
            .map(|(_, input)| input)
            .collect();
    }
    let span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => Span::call_site(),
    };
    sig.output = match &tool.ret {
        Ret::Explicit { ok, err } => syn::parse_quote_spanned! {span=>
            -> ::core::result::Result<::idem::Outcome<#ok>, ::idem::Error<#err>>
        },
        Ret::Alias(ty) => syn::parse_quote_spanned! {span=>
            -> <#ty as ::idem::ToolResult>::Rewritten
        },
    };
    sig
}

/// What the first call of a tool keeps for its retries, so what its values must allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Nothing (natural tools, state checks without a key, the fallback).
    Nothing,
    /// The success value; errors release or block.
    Value,
    /// The value, and the errors (`on_error = "store"`).
    ValueAndErrors,
    /// The value, and the errors the error type classifies `Store` (`on_error = "classify"`).
    ValueAndClassifiedErrors,
}

/// `async move { let __idem_out: R = { body }; ToolResult::into_result(__idem_out) }`: the body
/// as a future of a plain `Result`, whose type errors are reported at the user's own
/// expressions, and a return type that is not a `Result` at that type (once: the signature's
/// projection reports the same).
///
/// What the tool keeps goes through `Replayable::checked` (the value) and `StoredError::checked`
/// or `ClassifiedError::checked` (the error), at the return type: a type that cannot be kept
/// is one error there, and the runtime's own bounds see only the failed projection, which
/// reports nothing more.
pub fn body_future(tool: &Tool, kept: Kept) -> TokenStream {
    let block = &tool.item.block;
    let (ret, span) = match &tool.item.sig.output {
        ReturnType::Type(_, ty) => (quote!(#ty), ty.span()),
        ReturnType::Default => (quote!(()), Span::call_site()),
    };
    // At the return type, where the runtime call is spanned too: rustc reports the runtime's
    // own bounds on the same types at the same place once, with these messages. (At `T` or `E`
    // themselves, the runtime's bounds would be reported again, in the runtime's words.)
    let value = match kept {
        Kept::Nothing => quote!(__idem_value),
        _ => quote_spanned!(span=> ::idem::Replayable::checked(__idem_value)),
    };
    let error = match kept {
        Kept::Nothing | Kept::Value => quote!(__idem_error),
        Kept::ValueAndErrors => {
            quote_spanned!(span=> ::idem::StoredError::checked(__idem_error))
        }
        Kept::ValueAndClassifiedErrors => {
            quote_spanned!(span=> ::idem::ClassifiedError::checked(__idem_error))
        }
    };
    let into_result = if kept == Kept::Nothing {
        quote_spanned!(span=> ::idem::ToolResult::into_result(__idem_out))
    } else {
        quote_spanned! {span=>
            match ::idem::ToolResult::into_result(__idem_out) {
                ::core::result::Result::Ok(__idem_value) => ::core::result::Result::Ok(#value),
                ::core::result::Result::Err(__idem_error) => ::core::result::Result::Err(#error),
            }
        }
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
