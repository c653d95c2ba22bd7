//! The checked model of the annotated function: its parameters by name and its return type.

use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type};

/// A named parameter.
pub struct Param {
    pub ident: Ident,
    pub mutability: Option<syn::token::Mut>,
    pub ty: Type,
}

/// Where a parameter's key parts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The caller's (the model's) arguments.
    Arguments,
    /// rmcp's request `_meta` (`idem::mcp::MetaKeys`): the host's.
    Meta,
    /// rig's `&mut ToolContext` (`idem::rig::RunStep` inside): the host's. Never fingerprinted.
    ToolContext,
}

impl Param {
    /// Where this parameter comes from, by the last segment of its type's path (as rmcp and
    /// rig recognise their own extractors).
    pub fn source(&self) -> Source {
        let last = |ty: &Type| match ty {
            Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        match &self.ty {
            Type::Reference(r) if last(&r.elem).as_deref() == Some("ToolContext") => {
                Source::ToolContext
            }
            ty if last(ty).as_deref() == Some("MetaKeys") => Source::Meta,
            _ => Source::Arguments,
        }
    }
}

/// The return type: `Result<T, E>` as written, or something to resolve through `ToolResult`
/// (an alias such as `anyhow::Result<T>`).
pub enum Ret {
    Explicit { ok: Box<Type>, err: Box<Type> },
    Alias(Box<Type>),
}

pub struct Tool {
    pub item: ItemFn,
    pub params: Vec<Param>,
    pub has_receiver: bool,
    /// `self` taken by value (not `&self` / `&mut self`).
    pub receiver_by_value: bool,
    pub ret: Ret,
}

impl Tool {
    pub fn from_item(item: ItemFn) -> syn::Result<Self> {
        let mut params = Vec::new();
        let mut has_receiver = false;
        let mut receiver_by_value = false;
        for input in &item.sig.inputs {
            match input {
                FnArg::Receiver(r) => {
                    has_receiver = true;
                    receiver_by_value = !matches!(r.kind, syn::ReceiverKind::Reference(..));
                }
                FnArg::Typed(pat_type) => match &*pat_type.pat {
                    Pat::Ident(pat) if pat.subpat.is_none() && pat.by_ref.is_none() => {
                        params.push(Param {
                            ident: pat.ident.clone(),
                            mutability: pat.mutability,
                            ty: (*pat_type.ty).clone(),
                        });
                    }
                    other => {
                        return Err(syn::Error::new(
                            other.span(),
                            "destructured parameters cannot be fingerprinted by name; bind the \
                             parameter to a name (`req: Request`) and use field paths \
                             (`key = \"req.run_id\"`)",
                        ));
                    }
                },
            }
        }
        let ret = match &item.sig.output {
            ReturnType::Default => {
                return Err(syn::Error::new(
                    item.sig.paren_token.span.close(),
                    "`#[idempotent]` tools must return `Result<T, E>`: the value is stored for \
                     replays and the error decides what happens to the claim",
                ));
            }
            ReturnType::Type(_, ty) => explicit_result(ty).unwrap_or(Ret::Alias(ty.clone())),
        };
        Ok(Tool {
            item,
            params,
            has_receiver,
            receiver_by_value,
            ret,
        })
    }

    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.ident == name)
    }

    pub fn param_names(&self) -> String {
        let mut names: Vec<String> = self
            .params
            .iter()
            .map(|p| format!("`{}`", p.ident))
            .collect();
        if self.has_receiver {
            names.insert(0, "`self`".into());
        }
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }
}

/// `Result<T, E>` (any path ending in `Result` with two type arguments).
fn explicit_result(ty: &Type) -> Option<Ret> {
    let Type::Path(path) = ty else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let types: Vec<&Type> = args
        .args
        .iter()
        .filter_map(|a| match a {
            GenericArgument::Type(t) => Some(t),
            _ => None,
        })
        .collect();
    match types.as_slice() {
        [ok, err] if args.args.len() == 2 => Some(Ret::Explicit {
            ok: Box::new((*ok).clone()),
            err: Box::new((*err).clone()),
        }),
        _ => None,
    }
}
