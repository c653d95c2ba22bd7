#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating)]
async fn charge((run_id, amount): (String, u64)) -> Result<u64, String> {
    Ok(amount)
}

fn main() {}
