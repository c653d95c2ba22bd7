//! Writes the glue: the registration, the type checks, the key parts, the fingerprint input,
//! and one call into the runtime with the original body as a future. Cannot fail: everything
//! that can be wrong was rejected in `valid.rs`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ReturnType};

use crate::args::{FieldPath, OnError, OnOrphan};
use crate::ast::{Ret, Tool};
use crate::signature::{body_future, rewritten_signature, split_attrs};
use crate::valid::{Checked, Form, KeyPartPlan, Keyed};

fn path_expr(path: &FieldPath, span: Span) -> TokenStream {
    let segments = path.segments.iter().enumerate().map(|(i, s)| {
        if i == 0 && path.each {
            // The item the batch's entry is made for.
            quote_spanned!(span=> (*__idem_item))
        } else if s == "self" {
            quote_spanned!(span=> self)
        } else if let Ok(index) = s.parse::<u32>() {
            let index = syn::Index { index, span };
            quote!(#index)
        } else {
            let ident = Ident::new(s, span);
            quote!(#ident)
        }
    });
    quote!(#(#segments).*)
}

fn registration(checked: &Checked) -> TokenStream {
    let name = &checked.name;
    let function = checked.tool.item.sig.ident.to_string();
    let mut info = quote! {
        ::idem::__private::ToolInfo::new(
            #name, #function, ::core::module_path!(), ::core::file!(), ::core::line!(),
        )
    };
    if checked.stable_name {
        info.extend(quote!(.stable_name()));
    }
    match &checked.form {
        Form::Natural => info.extend(quote!(.natural())),
        Form::StateCheck(path) => {
            let path = path_string(path);
            info.extend(quote!(.state_check().check(#path)));
        }
        Form::Keyed(keyed) => {
            if let Some(path) = &keyed.check {
                let path = path_string(path);
                info.extend(quote!(.check(#path)));
            }
            let parts = keyed.parts.iter().map(|p| p.path.dotted());
            let required = keyed.required;
            info.extend(quote!(.key(&[#(#parts),*], #required)));
            let from_run: Vec<String> = keyed
                .parts
                .iter()
                .filter(|p| p.from_run)
                .map(|p| p.path.dotted())
                .collect();
            if !from_run.is_empty() {
                info.extend(quote!(.run_parts(&[#(#from_run),*])));
            }
            if let Some(ms) = keyed.ttl_ms {
                info.extend(quote!(.ttl_ms(#ms)));
            }
            if let Some(ms) = keyed.lease_ms {
                info.extend(quote!(.lease_ms(#ms)));
            }
            if !keyed.skip.is_empty() {
                let paths = keyed.skip.iter().map(|p| {
                    let segs = &p.segments;
                    quote!(&[#(#segs),*])
                });
                info.extend(quote!(.skip(&[#(#paths),*])));
            }
            if keyed.on_error != OnError::Release {
                let variant = format_ident!("{}", keyed.on_error.names().1);
                info.extend(quote!(.on_error(::idem::__private::ErrorPolicy::#variant)));
            }
            if keyed.on_orphan == OnOrphan::Unknown {
                info.extend(quote!(.on_orphan(::idem::__private::OrphanPolicy::Unknown)));
            }
            if keyed.transactional {
                info.extend(quote!(.transactional()));
            }
            if let Some(ms) = keyed.wait_ms {
                info.extend(quote!(.wait_ms(#ms)));
            }
            if let Some(list) = &keyed.batch {
                let list = list.to_string();
                info.extend(quote!(.batch(#list)));
            }
            if checked.tool.emitter.is_some() {
                info.extend(quote!(.stream()));
            }
        }
    }
    quote! {
        static __IDEM_TOOL: ::idem::__private::ToolInfo = #info;
        ::idem::__private::inventory::submit! {
            ::idem::__private::Registration(&__IDEM_TOOL)
        }
    }
}

/// A path as the user wrote it, for the report (`checks::already_assigned`).
fn path_string(path: &syn::Path) -> String {
    quote!(#path).to_string().replace(' ', "")
}

/// The call of the state check on the arguments, all lent: `path(self, &a, &b)`, or, inside the
/// reconcile closure, `path(self, &args.0, &args.1)`.
fn check_call(tool: &Tool, path: &syn::Path, from_tuple: bool) -> TokenStream {
    let recv = tool.has_receiver.then(|| quote!(self,));
    let args = tool.params.iter().enumerate().map(|(i, p)| {
        if from_tuple {
            let index = syn::Index::from(i);
            quote!(&__idem_args.#index)
        } else {
            let ident = &p.ident;
            quote!(&#ident)
        }
    });
    quote_spanned!(path.span()=> #path(#recv #(#args),*).await)
}

/// The span of the return type: the runtime call is spanned there, so that a return type that
/// is not a `Result`, or whose value cannot be stored, is reported at it.
fn return_span(tool: &Tool) -> Span {
    match &tool.item.sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => Span::call_site(),
    }
}

/// The call that adds one key part to `__idem_key`'s builder. A part the durable run gives is
/// read where it is made, or, for a batch, from the binding `run_value` made once for all items.
fn key_part(tool: &Tool, part: &KeyPartPlan, run_value: Option<&Ident>) -> TokenStream {
    let name = part.path.dotted();
    if part.from_run {
        if let Some(value) = run_value {
            return quote_spanned! {part.span=>
                .run_part(#name, ::core::clone::Clone::clone(&#value))
            };
        }
        // The durable run gives it: no parameter has the name.
        let part_fn = format_ident!("{}_part", name);
        let tool_arg = (name == "step_id").then(|| quote!(&__IDEM_TOOL));
        return quote_spanned! {part.span=>
            .run_part(#name, ::idem::__private::#part_fn(#tool_arg))
        };
    }
    let expr = path_expr(&part.path, part.span);
    let from_context = tool
        .param(part.path.root())
        .is_some_and(|p| p.source() == crate::ast::Source::ToolContext);
    if from_context {
        // Named, not probed: importing this trait beside the others would make every
        // mistyped part ambiguous between them.
        quote_spanned! {part.span=>
            .part(#name, ::idem::__private::ContextKeyPart::idem_key_part(
                &::idem::__private::KeyPartProbe(&#expr),
            ))
        }
    } else {
        // The last resort of the probe, for a type that is not `Serialize`: a parameter
        // itself (or a batch's item) is also an argument, whose own check is the one error; a
        // field of one has its own error, at the part.
        let last = if part.path.segments.len() == 1 {
            quote!(::idem::__private::ArgumentKeyPart)
        } else {
            quote!(::idem::key::UnserializableKeyPart)
        };
        quote_spanned! {part.span=>
            .part(#name, {
                #[allow(unused_imports)]
                use ::idem::__private::{OptionalKeyPart as _, RequiredKeyPart as _};
                use #last as _;
                (&::idem::__private::KeyPartProbe(&#expr)).idem_key_part()
            })
        }
    }
}

fn keyed_call(tool: &Tool, keyed: &Keyed) -> TokenStream {
    if let Some(list) = &keyed.batch {
        return batch_call(tool, keyed, list);
    }
    let parts = keyed.parts.iter().map(|part| key_part(tool, part, None));
    // One statement per argument, spanned at its type: a type that is not `Serialize` is one
    // error, at the parameter.
    // rig's tool context carries the host's own data, which changes from call to call: it
    // names the call (its `RunStep`), it is not one of its arguments.
    let fingerprinted = tool
        .params
        .iter()
        .filter(|p| p.source() != crate::ast::Source::ToolContext);
    let args = fingerprinted.map(|p| {
        let ident = &p.ident;
        let name = ident.to_string();
        quote_spanned! {p.ty.span()=>
            let __idem_fingerprint =
                ::idem::fingerprint::ToolArgument::add_to(&#ident, __idem_fingerprint, #name);
        }
    });
    let body = body_future(tool);
    // Spanned at the return type: an error type that does not fit the policy is reported there.
    let policy = format_ident!("{}", keyed.on_error.names().0, span = return_span(tool));
    let call = match (&keyed.check, &tool.transaction) {
        _ if tool.emitter.is_some() => {
            // The body gets the emitter; it and the arguments it captures outlive this call
            // (the stream is read after it returns).
            let emitter = tool.emitter.as_ref().expect("a streaming tool");
            let (pat, ty) = (&emitter.pat, &emitter.ty);
            quote_spanned! {return_span(tool)=>
                ::idem::__private::run_stream(
                    &__IDEM_TOOL,
                    ::idem::__private::#policy,
                    __idem_key,
                    __idem_fingerprint,
                    move |#pat: #ty| #body,
                )
                .await
            }
        }
        (_, Some(transaction)) => {
            // The driver is the type the transaction points to; the body gets the transaction
            // as the user declared it (`&mut` or `&`).
            let (pat, ty, elem) = (&transaction.pat, &transaction.ty, &transaction.elem);
            let run =
                quote_spanned!(elem.span()=> <#elem as ::idem::transactional::Transactional>::run);
            quote_spanned! {return_span(tool)=>
                #run(
                    &__IDEM_TOOL,
                    ::idem::__private::#policy,
                    __idem_key,
                    __idem_fingerprint,
                    async move |__idem_tx: &mut #elem| {
                        let #pat: #ty = __idem_tx;
                        #body.await
                    },
                )
                .await
            }
        }
        (None, None) => {
            quote_spanned! {return_span(tool)=>
                ::idem::__private::run_keyed(
                    &__IDEM_TOOL,
                    ::idem::__private::#policy,
                    __idem_key,
                    __idem_fingerprint,
                    #body,
                )
                .await
            }
        }
        (Some(path), None) => {
            // The arguments go to the runtime as a tuple: lent to the check (only when an
            // orphan is taken over), then given to the body.
            let idents: Vec<_> = tool.params.iter().map(|p| &p.ident).collect();
            let bindings = tool.params.iter().map(|p| {
                let (m, ident) = (&p.mutability, &p.ident);
                quote!(#m #ident)
            });
            let types = tool.params.iter().map(|p| &p.ty);
            let check = check_call(tool, path, true);
            quote_spanned! {return_span(tool)=>
                ::idem::__private::run_keyed_checked(
                    &__IDEM_TOOL,
                    ::idem::__private::#policy,
                    __idem_key,
                    __idem_fingerprint,
                    (#(#idents,)*),
                    async |__idem_args: &(#(#types,)*)| #check,
                    move |(#(#bindings,)*)| #body,
                )
                .await
            }
        }
    };
    quote! {
        let __idem_key = ::idem::__private::KeyParts::new() #(#parts)*;
        let __idem_fingerprint = ::idem::__private::ArgsFingerprint::new(__IDEM_TOOL.skip);
        #(#args)*
        let __idem_fingerprint = ::idem::__private::finish_fingerprint(__idem_fingerprint);
        #call
    }
}

/// A batch tool's call: an entry (key parts and fingerprint) per item of `list`, the parts the
/// durable run gives read once for all of them, then one call into the runtime with the list
/// and the body as a function of the items to run.
fn batch_call(tool: &Tool, keyed: &Keyed, list: &Ident) -> TokenStream {
    let run_values: Vec<(Ident, TokenStream)> = keyed
        .parts
        .iter()
        .filter(|part| part.from_run)
        .enumerate()
        .map(|(i, part)| {
            let name = part.path.dotted();
            let part_fn = format_ident!("{}_part", name);
            let tool_arg = (name == "step_id").then(|| quote!(&__IDEM_TOOL));
            let binding = format_ident!("__idem_run_part_{}", i);
            let value = quote_spanned!(part.span=> ::idem::__private::#part_fn(#tool_arg));
            (binding, value)
        })
        .collect();
    let mut bindings = run_values.iter().map(|(binding, _)| binding);
    let parts: Vec<TokenStream> = keyed
        .parts
        .iter()
        .map(|part| {
            let run_value = part.from_run.then(|| bindings.next()).flatten();
            key_part(tool, part, run_value)
        })
        .collect();
    let run_lets = run_values
        .iter()
        .map(|(binding, value)| quote!(let #binding = #value;));
    let args = tool
        .params
        .iter()
        .filter(|p| p.source() != crate::ast::Source::ToolContext)
        .map(|p| {
            let ident = &p.ident;
            let name = ident.to_string();
            let value = if ident == list {
                quote!(__idem_item)
            } else {
                quote!(&#ident)
            };
            quote_spanned! {p.ty.span()=>
                let __idem_fingerprint =
                    ::idem::fingerprint::ToolArgument::add_to(#value, __idem_fingerprint, #name);
            }
        });
    let param = tool
        .params
        .iter()
        .find(|p| p.ident == *list)
        .expect("a batch's list is a parameter");
    let (mutability, ty) = (&param.mutability, &param.ty);
    let body = body_future(tool);
    let policy = format_ident!("{}", keyed.on_error.names().0, span = return_span(tool));
    let call = quote_spanned! {return_span(tool)=>
        ::idem::__private::run_batch(
            &__IDEM_TOOL,
            ::idem::__private::#policy,
            __idem_entries,
            #list,
            move |#mutability #list: #ty| #body,
        )
        .await
    };
    quote! {
        #(#run_lets)*
        let __idem_entries: ::std::vec::Vec<::idem::__private::BatchEntry> =
            ::core::iter::Iterator::collect(::core::iter::Iterator::map(
                ::core::iter::IntoIterator::into_iter(&#list),
                |__idem_item| {
                    let __idem_key = ::idem::__private::KeyParts::new() #(#parts)*;
                    let __idem_fingerprint =
                        ::idem::__private::ArgsFingerprint::new(__IDEM_TOOL.skip);
                    #(#args)*
                    ::idem::__private::BatchEntry::new(
                        __idem_key,
                        ::idem::__private::finish_fingerprint(__idem_fingerprint),
                    )
                },
            ));
        #call
    }
}

/// What a keyed tool keeps for its retries, as bounds of the tool itself, spanned at its return
/// type: its value `T: ::idem::Replayable`, and its error `E: ::idem::StoredError` (`store`) or
/// `E: ::idem::ClassifiedError` (`classify`). A type that cannot be kept is then one error, there:
/// rustc checks the tool's own bounds once, and inside the tool they hold, so the runtime's bounds
/// (the same traits) add nothing. (Bounds of the runtime's functions alone were reported again in
/// incremental builds, naming idem's private items.)
fn kept_bounds(tool: &Tool, keyed: &Keyed) -> Vec<syn::WherePredicate> {
    let span = return_span(tool);
    let error_trait = match keyed.on_error {
        OnError::Release | OnError::Unknown => None,
        OnError::Store => Some(quote_spanned!(span=> ::idem::StoredError)),
        OnError::Classify => Some(quote_spanned!(span=> ::idem::ClassifiedError)),
    };
    // A stream's chunks are kept as its value is.
    let chunk: Option<syn::WherePredicate> = tool.emitter.as_ref().map(|e| {
        let chunk = &e.chunk;
        syn::parse_quote_spanned! {e.ty.span()=> #chunk: ::idem::Replayable }
    });
    let mut bounds = kept_value_bounds(tool, span, error_trait);
    bounds.extend(chunk);
    bounds
}

/// [`kept_bounds`] of the value and the error.
fn kept_value_bounds(
    tool: &Tool,
    span: Span,
    error_trait: Option<TokenStream>,
) -> Vec<syn::WherePredicate> {
    match &tool.ret {
        Ret::Explicit { ok, err } | Ret::Batch { ok, err } => {
            let mut bounds = vec![syn::parse_quote_spanned! {span=> #ok: ::idem::Replayable }];
            if let Some(error_trait) = error_trait {
                bounds.push(syn::parse_quote_spanned! {span=> #err: #error_trait });
            }
            bounds
        }
        // What `ToolResult` says of a `Result` is stated too: where a return type that is not a
        // `Result` is taken for one (after its one error), the body still type-checks.
        Ret::Alias(ty) => {
            let err_bound = error_trait.map(|t| quote_spanned!(span=> Err: #t,));
            vec![syn::parse_quote_spanned! {span=>
                #ty: ::idem::ToolResult<
                    Ok: ::idem::Replayable,
                    #err_bound
                    Rewritten = ::core::result::Result<
                        ::idem::Outcome<<#ty as ::idem::ToolResult>::Ok>,
                        ::idem::Error<<#ty as ::idem::ToolResult>::Err>,
                    >,
                >
            }]
        }
    }
}

/// For a tool whose kept types name its type parameters: the bounds above would make any type
/// parameter fine here and refuse it at each call; instead a function of the tool's own generics
/// (without those bounds) asks for them, so a type parameter bounded too loosely is one error at
/// the tool, with rustc's hint to restrict it.
fn kept_check(tool: &Tool, keyed: &Keyed) -> Option<TokenStream> {
    let generics = &tool.item.sig.generics;
    let span = return_span(tool);
    let (ok, err) = match &tool.ret {
        Ret::Explicit { ok, err } | Ret::Batch { ok, err } => (quote!(#ok), quote!(#err)),
        Ret::Alias(ty) => (
            quote!(<#ty as ::idem::ToolResult>::Ok),
            quote!(<#ty as ::idem::ToolResult>::Err),
        ),
    };
    let named = |tokens: &TokenStream| names_type_parameter(tokens.clone(), generics);
    let mut checks = Vec::new();
    if named(&ok) {
        checks.push(quote_spanned!(span=> <#ok as ::idem::Replayable>::check();));
    }
    let error_trait = match keyed.on_error {
        OnError::Release | OnError::Unknown => None,
        OnError::Store => Some(quote_spanned!(span=> ::idem::StoredError)),
        OnError::Classify => Some(quote_spanned!(span=> ::idem::ClassifiedError)),
    };
    if let Some(error_trait) = error_trait.filter(|_| named(&err)) {
        checks.push(quote_spanned!(span=> <#err as #error_trait>::check();));
    }
    if checks.is_empty() {
        return None;
    }
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    Some(quote! {
        #[allow(dead_code, clippy::extra_unused_type_parameters)]
        fn __idem_kept #impl_generics () #where_clause {
            #(#checks)*
        }
    })
}

/// Whether `tokens` name one of the type parameters in `generics`.
fn names_type_parameter(tokens: TokenStream, generics: &syn::Generics) -> bool {
    let params: Vec<&Ident> = generics.type_params().map(|p| &p.ident).collect();
    fn walk(tokens: TokenStream, params: &[&Ident]) -> bool {
        tokens.into_iter().any(|tree| match tree {
            proc_macro2::TokenTree::Ident(ident) => params.contains(&&ident),
            proc_macro2::TokenTree::Group(group) => walk(group.stream(), params),
            _ => false,
        })
    }
    !params.is_empty() && walk(tokens, &params)
}

/// The idempotency contract in words, for the description an agent framework gives the model
/// (rmcp's `#[tool]` and rig's `#[rig_tool]` read the doc comment): what the key is, whether it
/// is optional, what `replayed` means.
fn contract_docs(checked: &Checked) -> Vec<String> {
    let last_segment = |a: &&syn::Attribute| {
        a.path()
            .segments
            .last()
            .is_some_and(|s| s.ident == "tool" || s.ident == "rig_tool")
    };
    if !checked.tool.item.attrs.iter().any(|a| last_segment(&a)) {
        return Vec::new();
    }
    let text = match &checked.form {
        Form::Keyed(keyed) => {
            let names: Vec<String> = keyed
                .parts
                .iter()
                .map(|p| p.path.segments.last().cloned().unwrap_or_default())
                .collect();
            let key = names.join("`, `");
            // A part may be absent when it is an `Option` parameter, or a field whose type the
            // macro cannot see.
            let is_option = |root: &str| {
                checked.tool.params.iter().any(|p| {
                    p.ident == root
                        && matches!(&p.ty, syn::Type::Path(t)
                            if t.path.segments.last().is_some_and(|s| s.ident == "Option"))
                })
            };
            let may_be_absent = !keyed.required
                && keyed
                    .parts
                    .iter()
                    .any(|p| p.path.segments.len() > 1 || is_option(p.path.root()));
            // Parts from the request's `_meta` (rmcp) or the tool context (rig) come from the
            // host: the model is told that it never passes a key.
            let source = |root: &str| checked.tool.param(root).map(|p| p.source());
            let where_from = |s| match s {
                Some(crate::ast::Source::Meta) => Some(format!("the request's `_meta` (`{key}`)")),
                Some(crate::ast::Source::ToolContext) => Some("its tool context".to_owned()),
                _ => None,
            };
            let hosts: Vec<String> = keyed
                .parts
                .iter()
                .filter_map(|p| where_from(source(p.path.root())))
                .collect();
            if hosts.len() == keyed.parts.len() {
                return vec![
                    String::new(),
                    format!(
                        "Idempotent: your host names each call in {}; you never pass a key. A \
                         retry of the same call takes effect once and returns the first result \
                         with `replayed: true`; `status: in_flight` means the first call still \
                         runs: retry later; `status: mismatch` means the host reused a name for \
                         other arguments.",
                        hosts[0]
                    ),
                ];
            }
            let absent = if keyed.required {
                format!(" `{key}` is required.")
            } else if may_be_absent {
                format!(
                    " `{key}` may be omitted, but then the call is not protected and a retry \
                     would repeat it."
                )
            } else {
                String::new()
            };
            format!(
                "Idempotent: calls with the same `{key}` and the same arguments take effect once; \
                 a retry returns the first result with `replayed: true`.{absent} Reusing it with \
                 other arguments answers `status: mismatch` (use a new key for a new request); \
                 `status: in_flight` means the first call still runs: retry later with the same key."
            )
        }
        Form::StateCheck(_) => "Safe to retry: it first checks whether this was already done, and \
             then answers `replayed: true` with the existing result instead of doing it again."
            .to_owned(),
        Form::Natural => {
            "Safe to retry: repeating the call with the same arguments has no further effect."
                .to_owned()
        }
    };
    vec![String::new(), text]
}

pub fn generate(checked: &Checked) -> TokenStream {
    let tool = &checked.tool;
    let (outer, inner) = split_attrs(&tool.item);
    let contract = contract_docs(checked);
    let vis = &tool.item.vis;
    let mut sig = rewritten_signature(tool);
    let mut kept = None;
    if let Form::Keyed(keyed) = &checked.form {
        if let Some(list) = &keyed.batch {
            // The list moves into the runtime: the body's own binding (in its closure) is the
            // one that may be `mut`.
            for input in &mut sig.inputs {
                if let syn::FnArg::Typed(typed) = input
                    && let syn::Pat::Ident(pat) = &mut *typed.pat
                    && pat.ident == *list
                {
                    pat.mutability = None;
                }
            }
        }
        kept = kept_check(tool, keyed);
        sig.generics
            .make_where_clause()
            .predicates
            .extend(kept_bounds(tool, keyed));
    }
    let registration = registration(checked);
    let call = match &checked.form {
        Form::Keyed(keyed) => keyed_call(tool, keyed),
        Form::Natural => {
            let body = body_future(tool);
            quote_spanned!(return_span(tool)=> ::idem::__private::run_natural(&__IDEM_TOOL, #body).await)
        }
        Form::StateCheck(path) => {
            // The check borrows the arguments and finishes before the body takes them.
            let check = check_call(tool, path, false);
            let body = body_future(tool);
            quote! {
                let __idem_found = #check;
                ::idem::__private::run_checked(&__IDEM_TOOL, __idem_found, #body).await
            }
        }
    };
    quote! {
        #(#outer)*
        #(#[doc = #contract])*
        #vis #sig {
            #(#inner)*
            #registration
            #kept
            #call
        }
    }
}
