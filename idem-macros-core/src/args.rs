//! Parses the attribute's arguments into [`Args`]. Syntax only; the meaning is checked in
//! `valid.rs`.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitStr, Token};

use crate::duration::parse_millis;

const OPTIONS: &str = "`key`, `mutating`, `natural`, `required`, `name`, `ttl`, `lease`, `skip`, \
                       `on_error`, `on_orphan`, `check`, `transactional`, `wait`";

/// A dotted path written in a string option: `run_id`, `req.run_id`, or, in a batch tool's
/// key, a path into each item of a list parameter: `items[].id`, `ids[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    pub segments: Vec<String>,
    /// The root is a list (`items[]`) and the rest of the path applies to each of its items.
    pub each: bool,
}

impl FieldPath {
    pub fn root(&self) -> &str {
        &self.segments[0]
    }

    /// The path as written: `req.run_id`, `items[].id`.
    pub fn dotted(&self) -> String {
        if self.each {
            let mut out = format!("{}[]", self.segments[0]);
            for segment in &self.segments[1..] {
                out.push('.');
                out.push_str(segment);
            }
            return out;
        }
        self.segments.join(".")
    }
}

/// A string option that holds a list of paths (`key`, `skip`), with the literal for spans.
pub struct PathList {
    pub lit: LitStr,
    pub paths: Vec<FieldPath>,
}

/// A duration option, with the literal for spans.
pub struct DurationArg {
    pub lit: LitStr,
    pub millis: u64,
}

/// What a tool does on an error of its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    Release,
    Store,
    Unknown,
    Classify,
}

impl OnError {
    /// The runtime's policy type and registry variant, by name.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            OnError::Release => ("ReleaseErrors", "Release"),
            OnError::Store => ("StoreErrors", "Store"),
            OnError::Unknown => ("UnknownErrors", "Unknown"),
            OnError::Classify => ("ClassifiedErrors", "Classify"),
        }
    }
}

/// What a later call does with an orphan of a tool without a state check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnOrphan {
    TakeOver,
    Unknown,
}

/// The attribute, parsed. Each option keeps the span of its keyword for diagnostics.
#[derive(Default)]
pub struct Args {
    pub key: Option<(Ident, PathList)>,
    pub mutating: Option<Ident>,
    pub natural: Option<Ident>,
    pub required: Option<Ident>,
    pub name: Option<(Ident, LitStr)>,
    pub ttl: Option<(Ident, DurationArg)>,
    pub lease: Option<(Ident, DurationArg)>,
    pub skip: Option<(Ident, PathList)>,
    pub on_error: Option<(Ident, LitStr, OnError)>,
    pub on_orphan: Option<(Ident, LitStr, OnOrphan)>,
    /// `check = path::to_fn`: the state check.
    pub check: Option<(Ident, syn::Path)>,
    /// `transactional`: the claim, the body's writes and the record in one transaction.
    pub transactional: Option<Ident>,
    /// `wait = "…"`: how long a call waits for a concurrent one of its key to finish.
    pub wait: Option<(Ident, DurationArg)>,
    /// The keywords in the order they were written.
    pub order: Vec<String>,
}

impl Args {
    /// The keywords given, in the order they matter for "only with" diagnostics.
    pub fn keyed_only_options(&self) -> Vec<&Ident> {
        [
            self.key.as_ref().map(|o| &o.0),
            self.required.as_ref(),
            self.ttl.as_ref().map(|o| &o.0),
            self.lease.as_ref().map(|o| &o.0),
            self.skip.as_ref().map(|o| &o.0),
            self.on_error.as_ref().map(|o| &o.0),
            self.on_orphan.as_ref().map(|o| &o.0),
            self.transactional.as_ref(),
            self.wait.as_ref().map(|o| &o.0),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The one place a repeated option is reported: at its second use.
fn set_once<T>(slot: &mut Option<T>, keyword: &Ident, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            keyword.span(),
            format!("`{keyword}` is given twice; keep one"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn parse_paths(lit: &LitStr, option: &str) -> syn::Result<Vec<FieldPath>> {
    let text = lit.value();
    let mut paths = Vec::new();
    for raw in text.split(',') {
        let raw = raw.trim();
        if raw.is_empty() {
            let msg = if text.trim().is_empty() {
                format!(
                    "`{option}` is empty; name at least one parameter, e.g. `{option} = \"run_id, step_id\"`"
                )
            } else {
                format!(
                    "`{option}` has an empty entry; separate parameter names with single commas"
                )
            };
            return Err(syn::Error::new(lit.span(), msg));
        }
        let mut segments: Vec<String> = raw.split('.').map(|s| s.trim().to_owned()).collect();
        // `items[].id`: the key of each item of the list `items` (a batch tool).
        let each = match segments[0].strip_suffix("[]") {
            Some(root) if option == "key" => {
                segments[0] = root.trim_end().to_owned();
                true
            }
            Some(_) => {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`{raw}`: `[]` marks the list of a batch tool, in `key` only (`key = \
                         \"run_id, items[].id\"`); in `{option}`, name the parameter: `{}`",
                        raw.replacen("[]", "", 1)
                    ),
                ));
            }
            None => false,
        };
        if segments[1..].iter().any(|s| s.contains("[]")) {
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`{raw}`: `[]` goes after the parameter that holds the items, as in \
                     `items[].id`; a list inside an item cannot be keyed"
                ),
            ));
        }
        for (i, segment) in segments.iter().enumerate() {
            // A tuple field (`params.0.run_id`, as in rmcp's `Parameters(T)`) past the root.
            let tuple_field =
                i > 0 && !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit());
            // The whole segment must be one plain identifier: `parse_str` alone would also take
            // `id // comment` (the lexer drops comments) or a raw `r#id`.
            let ident = syn::parse_str::<Ident>(segment)
                .is_ok_and(|id| id == segment.as_str() && !segment.starts_with("r#"));
            if !ident && segment != "self" && !tuple_field {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`{raw}` in `{option}` is not a parameter name or a field path like `req.run_id`"
                    ),
                ));
            }
        }
        paths.push(FieldPath { segments, each });
    }
    Ok(paths)
}

fn parse_duration(lit: LitStr, option: &str) -> syn::Result<DurationArg> {
    match parse_millis(&lit.value()) {
        Ok(millis) => Ok(DurationArg { lit, millis }),
        Err(msg) => Err(syn::Error::new(
            lit.span(),
            format!("invalid `{option}`: {msg}"),
        )),
    }
}

fn value(input: ParseStream<'_>, keyword: &Ident) -> syn::Result<LitStr> {
    if !input.peek(Token![=]) {
        return Err(syn::Error::new(
            keyword.span(),
            format!("`{keyword}` takes a value: `{keyword} = \"…\"`"),
        ));
    }
    input.parse::<Token![=]>()?;
    input.parse::<LitStr>().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("`{keyword}` takes a string literal: `{keyword} = \"…\"`"),
        )
    })
}

fn flag(input: ParseStream<'_>, keyword: &Ident) -> syn::Result<()> {
    if input.peek(Token![=]) {
        return Err(syn::Error::new(
            keyword.span(),
            format!("`{keyword}` is a flag and takes no value; write just `{keyword}`"),
        ));
    }
    Ok(())
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let keyword: Ident = input.call(syn::ext::IdentExt::parse_any).map_err(|e| {
                syn::Error::new(e.span(), format!("expected an option: one of {OPTIONS}"))
            })?;
            args.order.push(keyword.to_string());
            match keyword.to_string().as_str() {
                option @ ("key" | "skip") => {
                    let lit = value(input, &keyword)?;
                    let paths = parse_paths(&lit, option)?;
                    let slot = match option {
                        "key" => &mut args.key,
                        _ => &mut args.skip,
                    };
                    set_once(slot, &keyword, (keyword.clone(), PathList { lit, paths }))?;
                }
                "check" => {
                    if !input.peek(Token![=]) {
                        return Err(syn::Error::new(
                            keyword.span(),
                            "`check` takes the path of an async fn: `check = already_done`",
                        ));
                    }
                    input.parse::<Token![=]>()?;
                    let path: syn::Path = input.parse().map_err(|e| {
                        syn::Error::new(
                            e.span(),
                            "`check` takes the path of an async fn, not a string: \
                             `check = already_done`",
                        )
                    })?;
                    set_once(&mut args.check, &keyword, (keyword.clone(), path))?;
                }
                "name" => {
                    let lit = value(input, &keyword)?;
                    set_once(&mut args.name, &keyword, (keyword.clone(), lit))?;
                }
                "ttl" => {
                    let lit = parse_duration(value(input, &keyword)?, "ttl")?;
                    set_once(&mut args.ttl, &keyword, (keyword.clone(), lit))?;
                }
                "lease" => {
                    let lit = parse_duration(value(input, &keyword)?, "lease")?;
                    set_once(&mut args.lease, &keyword, (keyword.clone(), lit))?;
                }
                "wait" => {
                    let lit = parse_duration(value(input, &keyword)?, "wait")?;
                    set_once(&mut args.wait, &keyword, (keyword.clone(), lit))?;
                }
                "transactional" => {
                    flag(input, &keyword)?;
                    set_once(&mut args.transactional, &keyword, keyword.clone())?;
                }
                "on_error" => {
                    let lit = value(input, &keyword)?;
                    let policy = match lit.value().as_str() {
                        "release" => OnError::Release,
                        "store" => OnError::Store,
                        "unknown" => OnError::Unknown,
                        "classify" => OnError::Classify,
                        other => {
                            return Err(syn::Error::new(
                                lit.span(),
                                format!(
                                    "`on_error` is `\"release\"` (delete the claim so a corrected retry runs), \
                                     `\"store\"` (keep the error and replay it), `\"unknown\"` (the effect \
                                     may have happened: block the key) or `\"classify\"` (the error type \
                                     implements `idem::ClassifyError`), not `\"{other}\"`"
                                ),
                            ));
                        }
                    };
                    set_once(&mut args.on_error, &keyword, (keyword.clone(), lit, policy))?;
                }
                "on_orphan" => {
                    let lit = value(input, &keyword)?;
                    let policy = match lit.value().as_str() {
                        "takeover" => OnOrphan::TakeOver,
                        "unknown" => OnOrphan::Unknown,
                        other => {
                            return Err(syn::Error::new(
                                lit.span(),
                                format!(
                                    "`on_orphan` is `\"takeover\"` (run the body again after its \
                                     owner crashed) or `\"unknown\"` (block the key until an operator \
                                     decides), not `\"{other}\"`"
                                ),
                            ));
                        }
                    };
                    set_once(
                        &mut args.on_orphan,
                        &keyword,
                        (keyword.clone(), lit, policy),
                    )?;
                }
                "mutating" => {
                    flag(input, &keyword)?;
                    set_once(&mut args.mutating, &keyword, keyword.clone())?;
                }
                "natural" => {
                    flag(input, &keyword)?;
                    set_once(&mut args.natural, &keyword, keyword.clone())?;
                }
                "required" => {
                    flag(input, &keyword)?;
                    set_once(&mut args.required, &keyword, keyword.clone())?;
                }
                other => {
                    return Err(syn::Error::new(
                        keyword.span(),
                        format!("unknown option `{other}`; expected one of {OPTIONS}"),
                    ));
                }
            }
            if input.is_empty() {
                break;
            }
            input
                .parse::<Token![,]>()
                .map_err(|e| syn::Error::new(e.span(), "expected `,` between options"))?;
        }
        Ok(args)
    }
}

/// The span to blame for the attribute as a whole.
pub fn attribute_span() -> Span {
    Span::call_site()
}
