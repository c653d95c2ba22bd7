#![allow(unused_variables)]
use idem::idempotent;
use std::time::SystemTime;

#[idempotent(key = "run_id, requested", mutating)]
async fn charge(run_id: String, requested: SystemTime) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
