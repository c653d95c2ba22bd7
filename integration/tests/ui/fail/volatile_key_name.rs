#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id, attempt", mutating)]
async fn charge(run_id: String, attempt: u32) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
