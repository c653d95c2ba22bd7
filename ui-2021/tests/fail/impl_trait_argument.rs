#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating)]
async fn charge(run_id: String, amount: impl Into<u64>) -> Result<u64, String> {
    Ok(amount.into())
}

fn main() {}
