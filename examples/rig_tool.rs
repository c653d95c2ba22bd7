//! A rig tool made safe to retry: `#[idempotent]` stacks above rig's `#[rig_tool]`.
//!
//! ```text
//! cargo run --example rig_tool
//! ```
//!
//! rig calls the tool with the arguments the model chose; here the agent loop gives the run and
//! step it is at, so a retry of the same step (the model calling again after a timeout) is
//! answered from the store. The model sees `{"status": "ok", "replayed": …, "value": …}`, and the
//! tool's description (from its doc comment) states the contract.

use std::sync::atomic::{AtomicU32, Ordering};

use idem::{Idem, idempotent};
use rig_core::tool::PortableTool;

static CHARGES: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, thiserror::Error)]
#[error("the card was declined")]
struct Declined;

/// Charges the customer of this run step.
#[idempotent(key = "run_id, step", mutating, name = "rig.charge")]
#[rig_core::rig_tool]
async fn charge(
    run_id: String,
    step: u32,
    customer: String,
    amount_cents: u64,
) -> Result<u64, Declined> {
    let _ = customer;
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(amount_cents)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = Idem::open("memory://").await?;
    idem.install("agent-7");
    println!("tool `{}`: {}", Charge::NAME, CHARGE.description());
    for attempt in 1..=3 {
        let args = serde_json::from_value(serde_json::json!({
            "run_id": "run-9", "step": 3, "customer": "cus_42", "amount_cents": 500
        }))?;
        let out = CHARGE.call(args).await?;
        println!("attempt {attempt}: {}", serde_json::to_string(&out)?);
    }
    let charges = CHARGES.load(Ordering::SeqCst);
    println!("{charges} charge(s)");
    if charges != 1 {
        return Err("charged more than once".into());
    }
    Ok(())
}
