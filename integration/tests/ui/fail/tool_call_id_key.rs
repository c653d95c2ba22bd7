#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "tool_call_id", mutating)]
async fn charge(tool_call_id: String, amount_cents: u64) -> Result<u64, String> {
    Ok(amount_cents)
}

fn main() {}
