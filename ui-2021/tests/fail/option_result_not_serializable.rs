#![allow(unused_variables)]
use idem::idempotent;

struct Receipt;

#[idempotent(key = "run_id", mutating)]
async fn charge(run_id: String) -> Result<Option<Receipt>, String> {
    Ok(None)
}

fn main() {}
