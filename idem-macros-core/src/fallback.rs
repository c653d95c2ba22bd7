//! The output when the attribute is misused: the error, and the user's function with the
//! signature the attribute would have given it, so that call sites still type-check and the user
//! sees one error instead of a cascade of "cannot find function" or type mismatches.

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

use crate::ast::Tool;
use crate::signature::{body_future, rewritten_signature, split_attrs};

pub fn expand(error: syn::Error, item: ItemFn, transactional: bool) -> TokenStream {
    let errors = error.to_compile_error();
    let modelled = Tool::from_item(item.clone(), transactional);
    let tool = match (item.sig.asyncness.is_some(), modelled) {
        (true, Ok(tool)) => tool,
        _ => return quote!(#errors #item),
    };
    let (outer, inner) = split_attrs(&tool.item);
    let vis = &tool.item.vis;
    let sig = rewritten_signature(&tool);
    let mut body = body_future(&tool);
    if let Some(t) = &tool.transaction {
        // Not a parameter callers see, but the body names it: an async closure never called
        // lends it.
        let (pat, ty) = (&t.pat, &t.ty);
        body = quote!(async move |#pat: #ty| #body.await);
    }
    if let Some(e) = &tool.emitter {
        let (pat, ty) = (&e.pat, &e.ty);
        body = quote!(async move |#pat: #ty| #body.await);
    }
    quote! {
        #errors
        #(#outer)*
        #vis #sig {
            #(#inner)*
            // Type-check the body without running it: the attribute above is broken.
            let _ = #body;
            ::core::unreachable!("`#[idempotent]` could not expand; see the compile error")
        }
    }
}

pub fn not_a_function(item: TokenStream) -> TokenStream {
    let error = syn::Error::new(
        proc_macro2::Span::call_site(),
        "`#[idempotent]` goes on an `async fn` with a body (a free function or a method)",
    )
    .to_compile_error();
    quote!(#error #item)
}
