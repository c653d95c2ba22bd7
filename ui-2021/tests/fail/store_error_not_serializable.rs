#![allow(unused_variables)]
use idem::idempotent;

#[derive(Debug)]
struct Declined;

#[idempotent(key = "run_id", mutating, on_error = "store")]
async fn charge(run_id: String) -> Result<u64, Declined> {
    Err(Declined)
}

fn main() {}
