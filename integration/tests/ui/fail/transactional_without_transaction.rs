#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating, transactional)]
async fn create_order(run_id: String, item: String) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
