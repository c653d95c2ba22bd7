//! rig: `#[idempotent]` stacked above `#[rig_tool]`. The tool is called through rig's own trait,
//! as rig's agent calls it with the arguments the model chose.

mod common;

use common::{effect, effects, unique};
use idem::{Idem, idempotent};
use rig_core::tool::PortableTool;

#[derive(Debug, thiserror::Error)]
#[error("the card was declined")]
struct Declined;

/// Charges the customer of this run step.
#[idempotent(key = "run_id, step", mutating, name = "rig.test_charge")]
#[rig_core::rig_tool]
async fn charge(run_id: String, step: u32, amount_cents: u64) -> Result<u64, Declined> {
    effect(&run_id);
    if amount_cents == 0 {
        return Err(Declined);
    }
    Ok(amount_cents)
}

fn args(run: &str, amount: u64) -> ChargeParameters {
    serde_json::from_value(serde_json::json!({"run_id": run, "step": 3, "amount_cents": amount}))
        .unwrap()
}

#[tokio::test]
async fn a_rig_tool_runs_once_and_tells_the_model() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("agent-7");
    let run = unique("run");
    let first = tenant.run(CHARGE.call(args(&run, 500))).await.unwrap();
    let second = tenant.run(CHARGE.call(args(&run, 500))).await.unwrap();
    assert!(first.is_fresh() && second.is_replayed());
    assert_eq!(
        serde_json::to_value(&second).unwrap(),
        serde_json::json!({"status": "ok", "replayed": true, "value": 500}),
        "what the model reads"
    );
    let other = tenant.run(CHARGE.call(args(&run, 700))).await.unwrap();
    assert!(other.is_mismatch());
    assert_eq!(effects(&run), 1);

    let declined = unique("run");
    let err = tenant
        .run(CHARGE.call(args(&declined, 0)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("declined"), "{err}");

    let description = CHARGE.description();
    assert!(
        description.starts_with("Charges the customer"),
        "{description}"
    );
    assert!(description.contains("replayed: true"), "{description}");
    let schema = CHARGE.parameters().to_string();
    assert!(
        schema.contains("run_id") && schema.contains("step"),
        "{schema}"
    );
}

/// Charges the customer of the step the agent loop is at.
#[idempotent(key = "ctx", mutating, required, name = "rig.test_charge_step")]
#[rig_core::rig_tool]
async fn charge_step(
    ctx: &mut rig_core::tool::ToolContext,
    customer: String,
    amount_cents: u64,
) -> Result<u64, Declined> {
    let _ = ctx;
    effect(&customer);
    Ok(amount_cents)
}

/// Something else the host keeps in the context, which changes from call to call.
#[derive(serde::Serialize, serde::Deserialize)]
struct Session(u32);

impl rig_core::tool::ContextValue for Session {
    const KEY: &'static str = "test.session";
}

#[tokio::test]
async fn run_and_step_ids_come_from_rigs_tool_context() {
    use idem::rig::RunStep;
    use rig_core::tool::{Tool, ToolContext};

    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("agent-7");
    let (customer, run) = (unique("cus"), unique("run"));
    let args = |amount: u64| -> ChargeStepParameters {
        serde_json::from_value(serde_json::json!({"customer": customer, "amount_cents": amount}))
            .unwrap()
    };
    let context = |step: &str, session: u32| {
        let mut ctx = ToolContext::new();
        ctx.insert(RunStep::new(run.clone(), step)).unwrap();
        ctx.insert(Session(session)).unwrap();
        ctx
    };
    let call = |mut ctx: ToolContext, args| async move { CHARGE_STEP.call(&mut ctx, args).await };

    let first = tenant.run(call(context("3", 1), args(500))).await.unwrap();
    // The model calls again; the host's session data moved on, the step did not.
    let again = tenant.run(call(context("3", 2), args(500))).await.unwrap();
    assert!(first.is_fresh() && again.is_replayed(), "{again:?}");
    assert!(
        tenant
            .run(call(context("3", 3), args(900)))
            .await
            .unwrap()
            .is_mismatch()
    );
    assert!(
        tenant
            .run(call(context("4", 1), args(500)))
            .await
            .unwrap()
            .is_fresh()
    );
    assert_eq!(effects(&customer), 2, "steps 3 and 4, once each");

    // A host that put no run step in the context: refused, not run.
    let err = tenant
        .run(call(ToolContext::new(), args(500)))
        .await
        .unwrap_err();
    assert!(matches!(err, idem::Error::MissingKey { .. }), "{err:?}");
    assert_eq!(effects(&customer), 2);

    let description = CHARGE_STEP.description();
    assert!(description.contains("tool context"), "{description}");
    assert!(description.contains("never pass a key"), "{description}");
    let schema = CHARGE_STEP.parameters().to_string();
    assert!(
        !schema.contains("ctx") && !schema.contains("run_id"),
        "the key is not the model's: {schema}"
    );
}
