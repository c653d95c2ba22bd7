#![allow(unused_variables)]
// The transaction's type names the driver: a type idem cannot open a transaction of is one
// error, at that type.
use idem::idempotent;

#[idempotent(key = "run_id", mutating, transactional)]
async fn create_order(tx: &mut String, run_id: String) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
