//! A rig tool made safe to retry: `#[idempotent]` stacks above rig's `#[rig_tool]`.
//!
//! ```text
//! cargo run -p idem-integration --example rig_tool
//! ```
//!
//! The agent loop knows the run and the step it is at, and puts them in rig's `ToolContext`
//! (`idem::rig::RunStep`); the tool names its context as its key. The model only chooses the
//! customer and the amount: it never sees, invents or reuses the key. A retry of the same step
//! (the model calling again after a timeout) is answered from the store; the model reads
//! `{"status": "ok", "replayed": …, "value": …}`, and the tool's description (from its doc
//! comment) states the contract.

use std::sync::atomic::{AtomicU32, Ordering};

use idem::rig::RunStep;
use idem::{Idem, idempotent};
use rig_core::tool::{Tool, ToolContext};

static CHARGES: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, thiserror::Error)]
#[error("the card was declined")]
struct Declined;

// rig recognises its context by the qualified path `rig_core::tool::ToolContext` (or an imported
// name marked `#[rig(context)]`) and keeps it out of the model's arguments.
/// Charges a customer for this step of the run.
#[idempotent(key = "ctx", mutating, required, name = "rig.charge")]
#[rig_core::rig_tool]
async fn charge(
    ctx: &mut rig_core::tool::ToolContext,
    customer: String,
    amount_cents: u64,
) -> Result<u64, Declined> {
    let _ = (ctx, customer);
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(amount_cents)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = Idem::open("memory://").await?;
    idem.install("agent-7");
    println!("tool `{}`: {}", Charge::NAME, CHARGE.description());
    println!("arguments the model fills: {}", CHARGE.parameters());
    for attempt in 1..=3 {
        // What the model chose, and where the loop is: run 9, step 3, on every attempt.
        let args = serde_json::from_value(serde_json::json!({
            "customer": "cus_42", "amount_cents": 500
        }))?;
        let mut ctx = ToolContext::new();
        ctx.insert(RunStep::new("run-9", "3"))?;
        let out = CHARGE.call(&mut ctx, args).await?;
        println!("attempt {attempt}: {}", serde_json::to_string(&out)?);
    }
    let charges = CHARGES.load(Ordering::SeqCst);
    println!("{charges} charge(s)");
    if charges != 1 {
        return Err("charged more than once".into());
    }
    Ok(())
}
