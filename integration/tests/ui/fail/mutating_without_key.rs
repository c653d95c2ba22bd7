#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(mutating)]
async fn charge(run_id: String) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
