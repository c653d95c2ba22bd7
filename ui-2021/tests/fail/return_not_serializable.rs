#![allow(unused_variables)]
use idem::idempotent;

struct Receipt;

#[idempotent(key = "run_id", mutating)]
async fn charge(run_id: String) -> Result<Receipt, String> {
    Ok(Receipt)
}

fn main() {}
