#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating, on_error = "retry")]
async fn charge(run_id: String) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
