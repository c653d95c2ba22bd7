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
    Explicit {
        ok: Box<Type>,
        err: Box<Type>,
    },
    Alias(Box<Type>),
    /// `Vec<Result<T, E>>`: a batch tool's one result per item.
    Batch {
        ok: Box<Type>,
        err: Box<Type>,
    },
}

/// The transaction of a transactional tool: its first parameter, a reference, which the
/// runtime fills in (callers never pass it).
pub struct Transaction {
    /// Its position in the signature's inputs.
    pub index: usize,
    /// The binding as written (`tx`, `mut tx`).
    pub pat: Box<Pat>,
    /// The type as written (`&mut Transaction<'_>`).
    pub ty: Type,
    /// The type it points to, which names the driver (`Transaction<'_>`).
    pub elem: Type,
}

/// The emitter of a streaming tool: a parameter `out: idem::Emitter<T>`, which the runtime fills
/// in (callers never pass it).
pub struct Emitter {
    /// Its position in the signature's inputs.
    pub index: usize,
    /// The binding as written (`out`).
    pub pat: Box<Pat>,
    /// The type as written (`idem::Emitter<Section>`).
    pub ty: Type,
    /// The type of its chunks (`Section`).
    pub chunk: Type,
}

/// The chunk type of `ty` if it is an emitter: a path ending in `Emitter` with one type
/// argument.
fn emitter_chunk(ty: &Type) -> Option<Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if path.qself.is_some() || last.ident != "Emitter" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(chunk)] => Some(chunk.clone()),
        _ => None,
    }
}

pub struct Tool {
    pub item: ItemFn,
    /// The parameters callers pass: the arguments, fingerprinted and keyed.
    pub params: Vec<Param>,
    /// A transactional tool's transaction, not among `params`.
    pub transaction: Option<Transaction>,
    /// A streaming tool's emitter, not among `params`.
    pub emitter: Option<Emitter>,
    pub has_receiver: bool,
    /// `self` taken by value (not `&self` / `&mut self`).
    pub receiver_by_value: bool,
    pub ret: Ret,
}

impl Tool {
    /// The model of `item`; with `transactional`, its first parameter (after `self`) is its
    /// transaction.
    pub fn from_item(item: ItemFn, transactional: bool) -> syn::Result<Self> {
        let mut params = Vec::new();
        let mut transaction = None;
        let mut emitter: Option<Emitter> = None;
        let mut has_receiver = false;
        let mut receiver_by_value = false;
        for (index, input) in item.sig.inputs.iter().enumerate() {
            match input {
                FnArg::Receiver(r) => {
                    has_receiver = true;
                    receiver_by_value = !matches!(r.kind, syn::ReceiverKind::Reference(..));
                }
                FnArg::Typed(pat_type) if transactional && transaction.is_none() => {
                    let Type::Reference(reference) = &*pat_type.ty else {
                        return Err(syn::Error::new(
                            pat_type.ty.span(),
                            "a `transactional` tool takes its transaction first, as a \
                             reference: `tx: &mut Transaction<'_>` (tokio-postgres); callers \
                             do not pass it, idem does",
                        ));
                    };
                    transaction = Some(Transaction {
                        index,
                        pat: pat_type.pat.clone(),
                        ty: (*pat_type.ty).clone(),
                        elem: (*reference.elem).clone(),
                    });
                }
                FnArg::Typed(pat_type) if emitter_chunk(&pat_type.ty).is_some() => {
                    if emitter.is_some() {
                        return Err(syn::Error::new(
                            pat_type.ty.span(),
                            "a streaming tool takes one `Emitter`: send every chunk through it",
                        ));
                    }
                    emitter = Some(Emitter {
                        index,
                        pat: pat_type.pat.clone(),
                        ty: (*pat_type.ty).clone(),
                        chunk: emitter_chunk(&pat_type.ty).expect("an emitter"),
                    });
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
            ReturnType::Type(_, ty) => explicit_result(ty)
                .or_else(|| batch_result(ty))
                .unwrap_or(Ret::Alias(ty.clone())),
        };
        if transactional && transaction.is_none() {
            return Err(syn::Error::new(
                item.sig.paren_token.span.join(),
                "a `transactional` tool takes its transaction first: add \
                 `tx: &mut Transaction<'_>` (tokio-postgres) before the arguments",
            ));
        }
        Ok(Tool {
            item,
            params,
            transaction,
            emitter,
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

/// `Vec<Result<T, E>>` (a path ending in `Vec` of an explicit `Result`).
fn batch_result(ty: &Type) -> Option<Ret> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if path.qself.is_some() || last.ident != "Vec" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(item)] => match explicit_result(item)? {
            Ret::Explicit { ok, err } => Some(Ret::Batch { ok, err }),
            _ => None,
        },
        _ => None,
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
