#![allow(unused_variables)]
use idem::idempotent;

struct Id;

#[idempotent(key = "id", mutating)]
async fn charge(id: Id, amount: u64) -> Result<u64, String> {
    Ok(amount)
}

fn main() {}
