//! The semantic rules of the attribute. Every rule reports at the offending token, says what is
//! wrong and what to do, and all the rules broken at once are reported together.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Ident, LitStr, Type};

use crate::args::{Args, DurationArg, FieldPath, OnError, OnOrphan, attribute_span};
use crate::ast::{Ret, Tool};

/// One key part, ready to expand.
pub struct KeyPartPlan {
    pub path: FieldPath,
    pub span: Span,
    /// The part is `run_id` or `step_id` and no parameter has that name: the durable run the
    /// tool is called in gives it.
    pub from_run: bool,
}

/// The key parts a durable run can give, to a tool without a parameter of that name.
const RUN_PARTS: [&str; 2] = ["run_id", "step_id"];

pub struct Keyed {
    pub parts: Vec<KeyPartPlan>,
    pub required: bool,
    pub on_error: OnError,
    pub on_orphan: OnOrphan,
    pub ttl_ms: Option<u64>,
    pub lease_ms: Option<u64>,
    pub skip: Vec<FieldPath>,
    /// The state check that reconciles orphans.
    pub check: Option<syn::Path>,
    /// `transactional`.
    pub transactional: bool,
    /// The declared `wait`, in milliseconds.
    pub wait_ms: Option<u64>,
    /// A batch tool's list parameter (`items` of `items[].id`).
    pub batch: Option<Ident>,
}

pub enum Form {
    Keyed(Keyed),
    Natural,
    /// `check = …` without a key: the check decides.
    StateCheck(syn::Path),
}

/// A tool that passed every rule.
pub struct Checked {
    pub tool: Tool,
    pub name: String,
    pub stable_name: bool,
    pub form: Form,
}

/// Collects errors so that every broken rule is reported in one compilation.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, span: Span, message: impl std::fmt::Display) {
        let e = syn::Error::new(span, message);
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Names that change on every attempt: keying on them makes every retry a new intent.
fn volatile_reason(name: &str) -> Option<&'static str> {
    let n = name.to_ascii_lowercase();
    if n == "tool_call_id" || n == "call_id" || n.contains("tool_call") {
        return Some(
            "the LLM's tool call id names a chat message, not a business effect: a second turn \
             emits another id for the same charge. Key on the intent (`run_id`, `step_id`, or an \
             id the caller already has, like `invoice_id`)",
        );
    }
    let tokens: Vec<&str> = n.split('_').collect();
    let volatile_token = tokens.iter().any(|t| {
        matches!(
            *t,
            "attempt" | "attempts" | "retry" | "retries" | "timestamp" | "ts" | "now" | "nonce"
        )
    });
    let time_like = matches!(n.as_str(), "time" | "date" | "datetime" | "instant")
        || (n.ends_with("_at") && tokens.len() > 1)
        || n.ends_with("_time")
        || n.contains("timestamp");
    (volatile_token || time_like).then_some(
        "it changes between attempts (a time, an attempt counter, a nonce), so every retry would \
         look like a new intent and run again. Key on stable ids such as `run_id` and `step_id`",
    )
}

/// Names that look like personal data: keys reach stores and logs (hashed, but guessable).
fn pii_reason(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let tokens: Vec<&str> = n.split('_').collect();
    matches!(
        n.as_str(),
        "card" | "card_number" | "card_no" | "pan" | "cvv" | "cvc" | "iban"
    ) || tokens.iter().any(|t| {
        matches!(
            *t,
            "email" | "mail" | "phone" | "mobile" | "ssn" | "nit" | "password" | "passwd" | "dni"
        )
    }) || n.contains("email")
        || n.contains("password")
        || n.contains("card_number")
}

const VOLATILE_TYPES: &[&str] = &[
    "SystemTime",
    "Instant",
    "DateTime",
    "NaiveDateTime",
    "OffsetDateTime",
    "PrimitiveDateTime",
    "Timestamp",
];

/// The last path segment of a type, through references.
fn type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Reference(r) => type_name(&r.elem),
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        Type::Group(g) => type_name(&g.elem),
        Type::Paren(p) => type_name(&p.elem),
        _ => None,
    }
}

fn check_name(lit: &LitStr, errors: &mut Errors) -> String {
    let name = lit.value();
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-/".contains(&b));
    if !valid {
        errors.push(
            lit.span(),
            format!(
                "`name = \"{name}\"` is not a valid tool name; use 1 to 128 characters from \
                 `A-Z a-z 0-9 _ . : - /`, e.g. `name = \"payments.register\"`"
            ),
        );
    }
    name
}

fn check_key(
    tool: &Tool,
    lit: &LitStr,
    paths: &[FieldPath],
    errors: &mut Errors,
) -> Vec<KeyPartPlan> {
    let fn_name = &tool.item.sig.ident;
    let mut plans: Vec<KeyPartPlan> = Vec::new();
    for path in paths {
        let span = lit.span();
        if plans.iter().any(|p| p.path == *path) {
            errors.push(
                span,
                format!(
                    "key part `{}` is listed twice; list each part once",
                    path.dotted()
                ),
            );
            continue;
        }
        let root = path.root();
        let param = tool.param(root);
        if root == "self" && path.each {
            errors.push(
                span,
                "`self[]` cannot hold a batch's items; name a `Vec` parameter",
            );
            continue;
        }
        if root == "self" {
            if !tool.has_receiver {
                errors.push(
                    span,
                    format!(
                        "key part `{}` uses `self`, but `{fn_name}` has no `self` parameter",
                        path.dotted()
                    ),
                );
                continue;
            }
            if path.segments.len() == 1 {
                errors.push(
                    span,
                    "`self` cannot be a key part on its own; name a field, e.g. `self.account_id`",
                );
                continue;
            }
        } else if param.is_none()
            && path.segments.len() == 1
            && !path.each
            && RUN_PARTS.contains(&root)
        {
            plans.push(KeyPartPlan {
                path: path.clone(),
                span,
                from_run: true,
            });
            continue;
        } else if param.is_none() {
            errors.push(
                span,
                format!(
                    "key part `{root}` names no parameter of `{fn_name}`; parameters: {}",
                    tool.param_names()
                ),
            );
            continue;
        }
        if let Some(param) = param
            && param.source() == crate::ast::Source::ToolContext
            && path.segments.len() > 1
        {
            errors.push(
                span,
                format!(
                    "key part `{}` reaches into rig's `ToolContext`, which has no fields: name \
                     the context itself (`key = \"{root}\"`), and idem keys the call by the \
                     `idem::rig::RunStep` your agent loop put in it",
                    path.dotted()
                ),
            );
            continue;
        }
        if let Some(param) = param
            && path.each
            && type_name(&param.ty).as_deref() != Some("Vec")
        {
            errors.push(
                param.ty.span(),
                format!(
                    "key part `{}` keys each item of `{root}`, which must be a `Vec<…>`: the \
                     body gets the items to run as one `Vec`",
                    path.dotted()
                ),
            );
            continue;
        }
        let mut broken = false;
        for segment in &path.segments {
            if let Some(reason) = volatile_reason(segment) {
                errors.push(
                    span,
                    format!("key part `{}` cannot be a key: {reason}", path.dotted()),
                );
                broken = true;
                break;
            }
            if pii_reason(segment) {
                errors.push(
                    span,
                    format!(
                        "key part `{}` looks like personal data; keys reach stores and logs \
                         (hashed, but guessable from a short list): key on an opaque id instead \
                         (Stripe: avoid using sensitive data)",
                        path.dotted()
                    ),
                );
                broken = true;
                break;
            }
        }
        if let (Some(param), 1, false) = (param, path.segments.len(), path.each)
            && let Some(ty) = type_name(&param.ty).filter(|t| VOLATILE_TYPES.contains(&t.as_str()))
        {
            errors.push(
                param.ty.span(),
                format!(
                    "key part `{root}` is a `{ty}`, which changes between attempts; every \
                     retry would look like a new intent. Key on stable ids such as `run_id`"
                ),
            );
            broken = true;
        }
        if !broken {
            plans.push(KeyPartPlan {
                path: path.clone(),
                span,
                from_run: false,
            });
        }
    }
    let named = |name: &str| {
        paths
            .iter()
            .any(|p| p.segments.len() == 1 && p.root() == name)
    };
    if plans
        .iter()
        .any(|p| p.from_run && p.path.root() == "step_id")
        && !named("run_id")
    {
        errors.push(
            lit.span(),
            "key part `step_id` comes from the durable run (no parameter has that name), and \
             step ids repeat from run to run: key on the run too, `key = \"run_id, step_id\"`",
        );
    }
    plans
}

fn check_skip(tool: &Tool, lit: &LitStr, paths: &[FieldPath], errors: &mut Errors) {
    for path in paths {
        if tool.param(path.root()).is_none() {
            errors.push(
                lit.span(),
                format!(
                    "`skip` entry `{}` names no parameter of `{}`; parameters: {}",
                    path.dotted(),
                    tool.item.sig.ident,
                    tool.param_names()
                ),
            );
        }
    }
}

fn not_for_natural(keyword: &Ident, errors: &mut Errors) {
    errors.push(
        keyword.span(),
        format!(
            "`{keyword}` does not apply to `natural` tools: they are safe to repeat and use no \
             key or store; remove `{keyword}`, or use `mutating` with a `key`"
        ),
    );
}

pub fn check(args: Args, tool: Tool) -> syn::Result<Checked> {
    let mut errors = Errors::default();
    let sig = &tool.item.sig;

    if sig.asyncness.is_none() {
        // rmcp's `#[tool]`, expanded first, turns an `async fn` into one returning
        // `Pin<Box<dyn Future…>>`: say which order works.
        let boxed_future = match &sig.output {
            syn::ReturnType::Type(_, ty) => {
                let text = quote::quote!(#ty).to_string().replace(' ', "");
                text.contains("Pin<Box<dyn") && text.contains("Future")
            }
            syn::ReturnType::Default => false,
        };
        if boxed_future {
            errors.push(
                sig.fn_token.span,
                "`#[idempotent]` must come before `#[tool]`: rmcp's `#[tool]` turns the `async fn` \
                 into a boxed future, and `#[idempotent]` guards an `async fn`. Write \
                 `#[idempotent(…)]` on the line above `#[tool(…)]`",
            );
        } else {
            errors.push(
                sig.fn_token.span,
                "`#[idempotent]` tools must be `async fn`: the call awaits the store before the \
                 body runs; write `async fn`",
            );
        }
    }
    if let Some(constness) = &sig.constness {
        errors.push(constness.span, "`#[idempotent]` tools cannot be `const fn`");
    }

    let name = match &args.name {
        Some((_, lit)) => check_name(lit, &mut errors),
        None => sig.ident.to_string(),
    };

    let form = match (&args.mutating, &args.natural) {
        (Some(m), Some(n)) => {
            let position = |word: &str| args.order.iter().position(|o| o == word);
            let later = if position("mutating") > position("natural") {
                m
            } else {
                n
            };
            errors.push(
                later.span(),
                "`mutating` and `natural` exclude each other: a tool either has a side effect to \
                 guard with a key (`mutating`) or is safe to repeat as is (`natural`); keep one",
            );
            None
        }
        (None, Some(_)) => {
            for keyword in args.keyed_only_options() {
                not_for_natural(keyword, &mut errors);
            }
            if let Some((keyword, _)) = &args.check {
                not_for_natural(keyword, &mut errors);
            }
            Some(Form::Natural)
        }
        (Some(_), None) if args.key.is_none() && args.check.is_some() => {
            for keyword in args.keyed_only_options() {
                errors.push(
                    keyword.span(),
                    format!(
                        "`{keyword}` applies to tools with a `key`; a tool decided by its \
                         `check` alone keeps no claim. Add a `key`, or remove `{keyword}`"
                    ),
                );
            }
            let (keyword, path) = args.check.clone().expect("checked above");
            check_receiver(&tool, &keyword, &mut errors);
            Some(Form::StateCheck(path))
        }
        (Some(mutating), None) => {
            if let Some((keyword, _)) = &args.check {
                check_receiver(&tool, keyword, &mut errors);
                if let Some((on_orphan, _, _)) = &args.on_orphan {
                    errors.push(
                        on_orphan.span(),
                        "`on_orphan` applies to tools without a `check`; with one, the check \
                         decides whether an orphan's effect happened. Remove `on_orphan`",
                    );
                }
            }
            let parts = match &args.key {
                Some((_, list)) => check_key(&tool, &list.lit, &list.paths, &mut errors),
                None => {
                    errors.push(
                        mutating.span(),
                        "`mutating` tools must declare `key = \"…\"`; an agent retry would repeat \
                         the effect. Name the parameters that identify the intent, e.g. \
                         `key = \"run_id, step_id\"` (or, with no key, a `check = …` that \
                         finds an effect that already happened)",
                    );
                    Vec::new()
                }
            };
            if let Some((_, list)) = &args.skip {
                check_skip(&tool, &list.lit, &list.paths, &mut errors);
            }
            if let (Some((_, ttl)), Some((_, lease))) = (&args.ttl, &args.lease) {
                check_ttl_covers_lease(ttl, lease, &mut errors);
            }
            check_transactional(&args, &mut errors);
            let batch = check_batch(&tool, &args, &parts, &mut errors);
            Some(Form::Keyed(Keyed {
                parts,
                required: args.required.is_some(),
                on_error: args.on_error.as_ref().map_or(OnError::Release, |o| o.2),
                on_orphan: args.on_orphan.as_ref().map_or(OnOrphan::TakeOver, |o| o.2),
                ttl_ms: args.ttl.as_ref().map(|t| t.1.millis),
                lease_ms: args.lease.as_ref().map(|l| l.1.millis),
                skip: args
                    .skip
                    .as_ref()
                    .map(|s| s.1.paths.clone())
                    .unwrap_or_default(),
                check: args.check.as_ref().map(|c| c.1.clone()),
                transactional: args.transactional.is_some(),
                wait_ms: args.wait.as_ref().map(|w| w.1.millis),
                batch,
            }))
        }
        (None, None) => {
            let span = args
                .key
                .as_ref()
                .map_or_else(attribute_span, |k| k.0.span());
            errors.push(
                span,
                "say what the tool does: `mutating` (a side effect, guarded by `key = \"…\"`) or \
                 `natural` (safe to repeat as it is, like `set_status(\"active\")`)",
            );
            None
        }
    };

    check_stream(&tool, &args, form.as_ref(), &mut errors);

    // A list in the key, even one refused above, makes the tool a batch: its return is checked
    // with it (once).
    let batch = args
        .key
        .as_ref()
        .is_some_and(|(_, list)| list.paths.iter().any(|p| p.each));
    if let (Ret::Batch { .. }, false, syn::ReturnType::Type(_, ty)) =
        (&tool.ret, batch, &sig.output)
    {
        errors.push(
            ty.span(),
            "`Vec<Result<T, E>>` is what a batch tool returns, one result per item of the list its \
             key names (`key = \"run_id, items[].id\"`); any other tool returns `Result<T, E>`",
        );
    }
    errors.finish()?;
    Ok(Checked {
        stable_name: args.name.is_some(),
        name,
        form: form.expect("a form when there are no errors"),
        tool,
    })
}

/// A batch tool (`items[].id` in its key): the list its key parts name (one), returned as
/// one result per item; not transactional, without a state check or a wait.
fn check_batch(
    tool: &Tool,
    args: &Args,
    parts: &[KeyPartPlan],
    errors: &mut Errors,
) -> Option<Ident> {
    let each: Vec<&KeyPartPlan> = parts.iter().filter(|p| p.path.each).collect();
    let first = each.first()?;
    let root = first.path.root();
    if let Some(other) = each.iter().find(|p| p.path.root() != root) {
        errors.push(
            other.span,
            format!(
                "a batch tool keys the items of one list: `{}` and `{}` name two; key every \
                 item part on `{root}[]`",
                first.path.dotted(),
                other.path.dotted()
            ),
        );
    }
    if let Some(whole) = parts.iter().find(|p| !p.path.each && p.path.root() == root) {
        errors.push(
            whole.span,
            format!(
                "`{root}` is the batch's list: key its items (`{root}[].…`), not `{}`",
                whole.path.dotted()
            ),
        );
    }
    let refuse = |keyword: &Ident, why: &str, errors: &mut Errors| {
        errors.push(
            keyword.span(),
            format!("`{keyword}` does not apply to a batch tool (`{root}[]` in its key): {why}"),
        );
    };
    if let Some(keyword) = &args.transactional {
        refuse(
            keyword,
            "its items are claimed and settled each on its own. Remove `transactional`, or key \
             one item per call",
            errors,
        );
    }
    if let Some((keyword, _)) = &args.check {
        refuse(
            keyword,
            "a batch runs no state check; its orphans follow `on_orphan`. Remove `check`, or \
             key one item per call",
            errors,
        );
    }
    if let Some((keyword, _)) = &args.wait {
        refuse(
            keyword,
            "an item in flight answers `InFlight` in the batch's answers. Remove `wait`, or key \
             one item per call",
            errors,
        );
    }
    if !matches!(tool.ret, Ret::Batch { .. }) {
        let span = match &tool.item.sig.output {
            syn::ReturnType::Type(_, ty) => ty.span(),
            syn::ReturnType::Default => tool.item.sig.paren_token.span.close(),
        };
        errors.push(
            span,
            format!(
                "a batch tool (`{root}[]` in its key) answers one result per item it runs, in \
                 their order: return `Vec<Result<T, E>>`"
            ),
        );
    }
    tool.param(root).map(|p| p.ident.clone())
}

/// A streaming tool (an `Emitter` parameter): keyed, its chunks recorded under its key and its
/// retries following the stream; so no `natural` or check-only form, no transaction, batch,
/// state check or wait, and no `self` (the stream outlives the call that starts it).
fn check_stream(tool: &Tool, args: &Args, form: Option<&Form>, errors: &mut Errors) {
    let Some(emitter) = &tool.emitter else {
        return;
    };
    let span = emitter.ty.span();
    match form {
        Some(Form::Natural) => errors.push(
            span,
            "a `natural` tool records nothing, and an `Emitter` records its chunks for replay: \
             make the tool `mutating` with a `key`, or return the chunks as a value",
        ),
        Some(Form::StateCheck(_)) => errors.push(
            span,
            "a streaming tool records its chunks under its key: add a `key`",
        ),
        _ => {}
    }
    let refuse = |keyword: &Ident, why: &str, errors: &mut Errors| {
        errors.push(
            keyword.span(),
            format!(
                "`{keyword}` does not apply to a streaming tool (an `Emitter` parameter): {why}"
            ),
        );
    };
    if let Some(keyword) = &args.transactional {
        refuse(
            keyword,
            "its chunks are recorded as they come, not in one transaction. Remove \
             `transactional`",
            errors,
        );
    }
    if let Some((keyword, _)) = &args.check {
        refuse(
            keyword,
            "a stream cut off by a crash is produced again or blocked as `on_orphan` says. \
             Remove `check`",
            errors,
        );
    }
    if let Some((keyword, _)) = &args.wait {
        refuse(
            keyword,
            "a retry during the stream follows it, chunk by chunk, without waiting. Remove \
             `wait`",
            errors,
        );
    }
    if let Some((_, list)) = &args.key
        && let Some(each) = list.paths.iter().find(|p| p.each)
    {
        errors.push(
            list.lit.span(),
            format!(
                "a streaming tool has one key and one stream; `{}[]` keys a batch's items. Key \
                 one call per item",
                each.root()
            ),
        );
    }
    if tool.has_receiver {
        errors.push(
            span,
            "a streaming tool cannot take `self`: its stream is read after the call that starts \
             it returns. Make it a free function, or pass what it needs as owned arguments",
        );
    }
}

/// A transactional tool's claim commits with its writes: it holds no lease, leaves no orphan and
/// nothing unknown, so the options about those do not apply.
fn check_transactional(args: &Args, errors: &mut Errors) {
    if args.transactional.is_none() {
        return;
    }
    if let Some((check, _)) = &args.check {
        errors.push(
            check.span(),
            "a `transactional` tool leaves no orphan to reconcile: its claim commits together \
             with its writes, or not at all. Remove `check`",
        );
    }
    if let Some((lease, _)) = &args.lease {
        errors.push(
            lease.span(),
            "a `transactional` tool holds no lease: a concurrent call of its key waits for its \
             commit (`wait = \"…\"`, default 2s). Remove `lease`",
        );
    }
    if let Some((on_orphan, _, _)) = &args.on_orphan {
        errors.push(
            on_orphan.span(),
            "a `transactional` tool leaves no orphan: a crash rolls its claim back with its \
             writes. Remove `on_orphan`",
        );
    }
    if let Some((_, lit, OnError::Unknown)) = &args.on_error {
        errors.push(
            lit.span(),
            "`on_error = \"unknown\"` does not apply to a `transactional` tool: an error rolls \
             its writes back, so nothing is unknown. Use `\"release\"` (the default) or \
             `\"store\"`",
        );
    }
}

/// The check borrows the arguments before the body takes them: `self` by value cannot be lent.
fn check_receiver(tool: &Tool, keyword: &Ident, errors: &mut Errors) {
    if tool.receiver_by_value {
        errors.push(
            keyword.span(),
            format!(
                "`check` lends the arguments to the check before the body takes them, which \
                 `self` by value does not allow; take `&self` in `{}`",
                tool.item.sig.ident
            ),
        );
    }
}

fn check_ttl_covers_lease(ttl: &DurationArg, lease: &DurationArg, errors: &mut Errors) {
    if ttl.millis < lease.millis {
        errors.push(
            ttl.lit.span(),
            format!(
                "`ttl = \"{}\"` is shorter than `lease = \"{}\"`: the record would expire while \
                 the call still runs, and a retry would run it again; make the TTL at least the lease",
                ttl.lit.value(),
                lease.lit.value()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volatile_names() {
        for n in [
            "attempt",
            "retry_count",
            "now",
            "timestamp",
            "sent_at",
            "request_time",
            "tool_call_id",
            "nonce",
        ] {
            assert!(volatile_reason(n).is_some(), "{n}");
        }
        for n in [
            "run_id",
            "step_id",
            "idempotency_key",
            "invoice_id",
            "status",
            "format",
        ] {
            assert!(volatile_reason(n).is_none(), "{n}");
        }
    }

    #[test]
    fn pii_names() {
        for n in [
            "email",
            "customer_email",
            "card",
            "card_number",
            "phone",
            "ssn",
            "nit",
            "password",
        ] {
            assert!(pii_reason(n), "{n}");
        }
        for n in [
            "card_id",
            "customer",
            "run_id",
            "unit",
            "nitrogen",
            "payment_method",
        ] {
            assert!(!pii_reason(n), "{n}");
        }
    }
}
