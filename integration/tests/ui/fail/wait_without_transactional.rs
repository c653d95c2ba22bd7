#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating, wait = "1s")]
async fn create_order(run_id: String) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
