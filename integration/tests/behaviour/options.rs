//! The attribute's options at work, and what the registry and the model see of them.

use std::sync::Arc;

use idem::{Error, Idem, Outcome, idempotent};
use serde::Serialize;

use crate::call;
use crate::common::{CountingStore, effect, effects, unique};

/// Arguments as one struct, keyed by field paths (rmcp `Parameters<T>`, rig).
#[derive(Debug, Clone, Serialize)]
struct TransferRequest {
    run_id: String,
    step: u32,
    to: String,
    amount_cents: u64,
    sent_at: u64,
    trace_id: String,
}

#[idempotent(
    key = "req.run_id, req.step",
    mutating,
    name = "bank.transfer",
    skip = "req.sent_at, req.trace_id"
)]

async fn transfer(req: TransferRequest) -> Result<u64, std::convert::Infallible> {
    effect(&req.run_id);
    Ok(req.amount_cents)
}

#[tokio::test]
async fn field_path_keys_and_skipped_fields() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let req = |amount, sent_at, trace: &str| TransferRequest {
        run_id: run.clone(),
        step: 1,
        to: "acct_9".into(),
        amount_cents: amount,
        sent_at,
        trace_id: trace.into(),
    };
    assert!(
        tenant
            .run(transfer(req(10, 1, "a")))
            .await
            .unwrap()
            .is_fresh()
    );
    let retry = tenant.run(transfer(req(10, 2, "b"))).await.unwrap();
    assert_eq!(
        retry,
        Outcome::Replayed(10),
        "volatile fields do not make a mismatch"
    );
    assert!(
        tenant
            .run(transfer(req(11, 1, "a")))
            .await
            .unwrap()
            .is_mismatch()
    );
    assert_eq!(effects(&run), 1);
}

/// A client-supplied key that the caller may omit (the seeds: optional, not required).
#[idempotent(key = "idempotency_key", mutating, name = "mail.send")]
async fn send_mail(
    idempotency_key: Option<String>,
    to: String,
) -> Result<(), std::convert::Infallible> {
    effect(&to);
    Ok(())
}

#[idempotent(key = "idempotency_key", mutating, name = "mail.send_strict", required)]
async fn send_mail_strict(
    idempotency_key: Option<String>,
    to: String,
) -> Result<(), std::convert::Infallible> {
    effect(&to);
    Ok(())
}

#[tokio::test]
async fn an_omitted_optional_key_runs_unprotected_and_says_so() {
    let store = Arc::new(CountingStore::default());
    let idem = Idem::with_store(store.clone());
    let tenant = idem.scope("tenant-a");
    let to = unique("to");
    for _ in 0..2 {
        let out = tenant.run(send_mail(None, to.clone())).await.unwrap();
        assert_eq!(out, Outcome::Unprotected(()));
        assert!(!out.is_protected());
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(json["protected"], false);
    }
    assert_eq!(
        effects(&to),
        2,
        "without a key every call runs: that is what unprotected means"
    );
    assert_eq!(store.count(), 0);
    let key = Some(unique("req"));
    assert!(
        tenant
            .run(send_mail(key.clone(), to.clone()))
            .await
            .unwrap()
            .is_fresh()
    );
    assert!(
        tenant
            .run(send_mail(key, to.clone()))
            .await
            .unwrap()
            .is_replayed()
    );
    assert_eq!(effects(&to), 3);
}

#[tokio::test]
async fn a_required_key_that_is_omitted_is_an_error() {
    let idem = Idem::open("memory://").await.unwrap();
    let to = unique("to");
    let err = idem
        .scope("t")
        .run(send_mail_strict(None, to.clone()))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::MissingKey {
            tool: "mail.send_strict",
            part: "idempotency_key"
        }
    ));
    assert_eq!(effects(&to), 0);
}

/// Renaming a tool's Rust function keeps its keys when `name` is set.
#[idempotent(key = "run_id", mutating, name = "payments.refund")]
async fn refund_v1(run_id: String, amount_cents: u64) -> Result<u64, std::convert::Infallible> {
    effect(&run_id);
    Ok(amount_cents)
}

#[idempotent(key = "run_id", mutating, name = "payments.refund")]
async fn refund_v2_renamed(
    run_id: String,
    amount_cents: u64,
) -> Result<u64, std::convert::Infallible> {
    effect(&run_id);
    Ok(amount_cents)
}

#[tokio::test]
async fn a_stable_name_survives_renaming_the_function() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("t");
    let run = unique("run");
    assert!(
        tenant
            .run(refund_v1(run.clone(), 70))
            .await
            .unwrap()
            .is_fresh()
    );
    assert_eq!(
        tenant
            .run(refund_v2_renamed(run.clone(), 70))
            .await
            .unwrap(),
        Outcome::Replayed(70)
    );
    assert_eq!(effects(&run), 1);
}

/// Methods with `&self`, keyed by a field of `self` and a parameter.
struct Crm {
    account: String,
}

impl Crm {
    #[idempotent(key = "self.account, ticket_ref", mutating, name = "crm.create_ticket")]
    async fn create_ticket(
        &self,
        ticket_ref: String,
        title: String,
    ) -> Result<String, std::convert::Infallible> {
        effect(&ticket_ref);
        Ok(format!("{}:{title}", self.account))
    }
}

#[tokio::test]
async fn methods_are_keyed_by_self_fields() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("t");
    let ticket = unique("ticket");
    let a = Crm {
        account: "acct-1".into(),
    };
    let b = Crm {
        account: "acct-2".into(),
    };
    assert!(
        tenant
            .run(a.create_ticket(ticket.clone(), "x".into()))
            .await
            .unwrap()
            .is_fresh()
    );
    assert!(
        tenant
            .run(a.create_ticket(ticket.clone(), "x".into()))
            .await
            .unwrap()
            .is_replayed()
    );
    assert!(
        tenant
            .run(b.create_ticket(ticket.clone(), "x".into()))
            .await
            .unwrap()
            .is_fresh()
    );
    assert_eq!(effects(&ticket), 2);
}

/// Naturally idempotent: registered, no store traffic, always runs.
#[idempotent(natural)]
async fn set_status(entity: String, status: String) -> Result<String, std::convert::Infallible> {
    effect(&entity);
    Ok(status)
}

#[tokio::test]
async fn natural_tools_touch_no_store() {
    let entity = unique("entity");
    // No runtime in scope at all: a natural tool needs none.
    assert_eq!(
        set_status(entity.clone(), "active".into()).await.unwrap(),
        Outcome::Fresh("active".into())
    );
    assert_eq!(
        set_status(entity.clone(), "active".into()).await.unwrap(),
        Outcome::Fresh("active".into())
    );
    assert_eq!(effects(&entity), 2);
}

#[tokio::test]
async fn the_model_sees_status_and_replayed_never_the_key() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("t");
    let run = unique("run-secret");
    let fresh = tenant.run(call(&run, 500)).await.unwrap();
    let replay = tenant.run(call(&run, 500)).await.unwrap();
    let mismatch = tenant.run(call(&run, 1)).await.unwrap();
    for (out, status, replayed) in [
        (&fresh, "ok", false),
        (&replay, "ok", true),
        (&mismatch, "mismatch", false),
    ] {
        let json = serde_json::to_string(out).unwrap();
        assert!(!json.contains(&run), "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (
                v["status"].as_str().unwrap(),
                v["replayed"].as_bool().unwrap()
            ),
            (status, replayed)
        );
    }
}

#[tokio::test]
async fn the_registry_lists_every_tool_and_the_report_is_sorted() {
    let tools = idem::registry::tools();
    let names: Vec<&str> = tools.iter().map(|t| t.name).collect();
    for expected in [
        "payments.register",
        "payments.strict",
        "bank.transfer",
        "mail.send",
        "crm.create_ticket",
        "set_status",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    let transfer = tools.iter().find(|t| t.name == "bank.transfer").unwrap();
    assert_eq!(transfer.key_parts, ["req.run_id", "req.step"]);
    assert_eq!(
        transfer.skip,
        [&["req", "sent_at"][..], &["req", "trace_id"][..]]
    );
    assert!(transfer.file.ends_with("behaviour/options.rs") && transfer.line > 0);
    let strict = tools.iter().find(|t| t.name == "payments.strict").unwrap();
    assert_eq!(strict.on_error, idem::registry::ErrorPolicy::Store);
    let md = idem::registry::report().to_markdown();
    assert!(md.contains("| `bank.transfer` | keyed (mutating) | `req.run_id`, `req.step` | 1d (default) | 30s (default) | — | release | takeover | `req.sent_at`, `req.trace_id` |"), "{md}");

    let idem = Idem::open("memory://").await.unwrap();
    let audit = idem::audit(&idem).await;
    let text = audit.to_string();
    assert!(
        text.contains("2 tools share the name `payments.refund`"),
        "{text}"
    );
    assert!(!text.contains("tool `set_status`"), "{text}");
}
