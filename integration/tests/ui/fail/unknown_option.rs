#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating, retries = "3")]
async fn charge(run_id: String) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
