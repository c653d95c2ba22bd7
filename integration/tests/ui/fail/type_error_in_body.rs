#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating)]
async fn charge(run_id: String) -> Result<u64, String> {
    let amount: u64 = "five";
    Ok(amount)
}

fn main() {}
