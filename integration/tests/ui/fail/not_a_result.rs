#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating)]
async fn charge(run_id: String) -> u64 {
    1
}

fn main() {}
