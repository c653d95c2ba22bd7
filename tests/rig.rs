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
