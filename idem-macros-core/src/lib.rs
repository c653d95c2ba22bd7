//! The expansion of idem's `#[idempotent]` attribute as a plain library: the proc-macro crate
//! `idem-macros` is a one-line shim over [`expand`], and the fuzz targets (`fuzz/`) call the same
//! code on arbitrary attributes, items and durations without a compiler around it. Use the
//! attribute through the `idem` facade, whose documentation describes every option.
//!
//! The pipeline, one stage per file: `args.rs` parses the attribute, `ast.rs` builds the checked
//! model of the tool fn, `valid.rs` applies the semantic rules, `expand.rs` writes the thin glue
//! that calls the runtime, and `fallback.rs` writes the error output (the `compile_error!` and the
//! user's function, so that call sites still resolve); both take the rewritten signature and body
//! from `signature.rs`, and neither imports the other. This file runs the stages.

mod args;
mod ast;
pub mod duration;
mod expand;
mod fallback;
mod signature;
mod valid;

use proc_macro2::TokenStream;
use syn::ItemFn;

use crate::args::Args;
use crate::ast::Tool;

/// Expands `#[idempotent(attr)] item`. Never fails: a wrong attribute or item becomes a
/// `compile_error!` next to the user's function, so that call sites still resolve.
pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => return fallback::not_a_function(item),
    };
    let transactional = names_transactional(&attr);
    match try_expand(attr, item_fn.clone()) {
        Ok(tokens) => tokens,
        Err(error) => fallback::expand(error, item_fn, transactional),
    }
}

/// Whether the attribute says `transactional`, even when it does not parse: the fallback then
/// keeps the signature callers see (without the transaction), so that they do not cascade.
fn names_transactional(attr: &TokenStream) -> bool {
    attr.clone()
        .into_iter()
        .any(|t| matches!(t, proc_macro2::TokenTree::Ident(i) if i == "transactional"))
}

/// Parse → model → validate → generate; the first stage that refuses answers its errors.
fn try_expand(attr: TokenStream, item: ItemFn) -> syn::Result<TokenStream> {
    let args: Args = syn::parse2(attr)?;
    let tool = Tool::from_item(item, args.transactional.is_some())?;
    let checked = valid::check(args, tool)?;
    Ok(expand::generate(&checked))
}

/// Parses and checks `#[idempotent(attr)] item` as [`expand`] does, and answers the first
/// error's message instead of tokens.
pub fn check(attr: TokenStream, item: TokenStream) -> Result<(), String> {
    let item: syn::ItemFn = syn::parse2(item).map_err(|e| e.to_string())?;
    try_expand(attr, item).map(drop).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::{check, expand};
    use quote::quote;

    #[test]
    fn a_keyed_tool_expands_without_errors() {
        let attr = quote!(key = "run_id", mutating);
        let item = quote!(
            async fn pay(run_id: String, amount: u64) -> Result<u64, E> {
                Ok(amount)
            }
        );
        assert_eq!(check(attr.clone(), item.clone()), Ok(()));
        let out = expand(attr, item).to_string();
        assert!(out.contains("run_keyed"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
        syn::parse_str::<syn::File>(&out).expect("the expansion is Rust");
    }

    #[test]
    fn errors_become_one_compile_error_beside_the_function() {
        let item = quote!(
            async fn pay(amount: u64) -> Result<u64, E> {
                Ok(amount)
            }
        );
        let message = check(quote!(mutating), item.clone()).unwrap_err();
        assert!(message.contains("key"), "{message}");
        let out = expand(quote!(mutating), item).to_string();
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        assert!(
            out.contains("async fn pay"),
            "the user's function stays: {out}"
        );

        let out = expand(
            quote!(natural),
            quote!(
                struct NotAFunction;
            ),
        )
        .to_string();
        assert!(out.starts_with(":: core :: compile_error !"), "{out}");
        assert!(out.ends_with("struct NotAFunction ;"), "{out}");
    }

    #[test]
    fn a_rig_tool_context_is_a_whole_key_part_and_never_fingerprinted() {
        let item = quote!(
            async fn charge(ctx: &mut rig_core::tool::ToolContext, amount: u64) -> Result<u64, E> {
                Ok(amount)
            }
        );
        assert_eq!(check(quote!(key = "ctx", mutating), item.clone()), Ok(()));
        let out = expand(quote!(key = "ctx", mutating), item.clone()).to_string();
        assert!(out.contains("ContextKeyPart :: idem_key_part"), "{out}");
        assert!(
            !out.contains("add_to (& ctx"),
            "the context is not fingerprinted: {out}"
        );
        assert!(out.contains("add_to (& amount"), "{out}");
        let message = check(quote!(key = "ctx.run_id", mutating), item).unwrap_err();
        assert!(message.contains("RunStep"), "{message}");
    }

    #[test]
    fn any_keyed_tool_may_wait_and_a_natural_one_may_not() {
        let item = quote!(
            async fn send(run_id: String) -> Result<i64, E> {
                Ok(1)
            }
        );
        let attr = quote!(key = "run_id", mutating, wait = "10s");
        assert_eq!(check(attr.clone(), item.clone()), Ok(()));
        let out = expand(attr, item.clone()).to_string();
        assert!(
            out.contains(". wait_ms (10000u64)") && !out.contains(". transactional ()"),
            "{out}"
        );
        let natural = check(quote!(natural, wait = "10s"), item).unwrap_err();
        assert!(
            natural.contains("`wait` does not apply to `natural` tools"),
            "{natural}"
        );
    }

    #[test]
    fn a_transactional_tool_takes_its_transaction_first_and_callers_never_pass_it() {
        let item = quote!(
            async fn order(
                tx: &mut Transaction<'_>,
                run_id: String,
                item: String,
            ) -> Result<i64, E> {
                Ok(1)
            }
        );
        let attr = quote!(key = "run_id", mutating, transactional, wait = "1s");
        assert_eq!(check(attr.clone(), item.clone()), Ok(()));
        let out = expand(attr, item.clone()).to_string();
        assert!(out.contains("Transactional > :: run"), "{out}");
        assert!(
            out.contains(". transactional ()") && out.contains(". wait_ms (1000u64)"),
            "{out}"
        );
        assert!(
            !out.contains("add_to (& tx"),
            "the transaction is not an argument: {out}"
        );
        let file = syn::parse_str::<syn::File>(&out).expect("the expansion is Rust");
        let syn::Item::Fn(f) = &file.items[0] else {
            panic!("a function")
        };
        assert_eq!(f.sig.inputs.len(), 2, "callers pass the arguments only");

        // Broken, it keeps the signature callers see.
        let out = expand(quote!(key = "nope", mutating, transactional), item).to_string();
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        let file = syn::parse_str::<syn::File>(&out).expect("the fallback is Rust");
        let f = file.items.iter().find_map(|i| match i {
            syn::Item::Fn(f) => Some(f),
            _ => None,
        });
        assert_eq!(f.expect("the function").sig.inputs.len(), 2);

        let message = check(
            quote!(key = "run_id", mutating, transactional),
            quote!(
                async fn order(run_id: String) -> Result<i64, E> {
                    Ok(1)
                }
            ),
        )
        .unwrap_err();
        assert!(message.contains("takes its transaction first"), "{message}");
    }

    /// Found by the `attribute` fuzz target: the lexer drops comments, so a path segment such as
    /// `key // note` once parsed as the identifier `key` and then panicked the expansion.
    #[test]
    fn a_path_segment_is_one_plain_identifier() {
        let item = quote!(
            async fn pay(params: Parameters<P>) -> Result<u64, E> {
                Ok(1)
            }
        );
        for key in [
            "params.1.idemp55555M//55FF555otency_key",
            "params.0.key/*x*/",
            "r#params.0.key",
            "params.0.r#type",
        ] {
            let attr = quote!(key = #key, mutating, required);
            let message = check(attr.clone(), item.clone()).unwrap_err();
            assert!(
                message.contains("is not a parameter name"),
                "{key}: {message}"
            );
            let out = expand(attr, item.clone()).to_string();
            assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        }
    }
}
