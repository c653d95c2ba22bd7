#![allow(unused_variables)]
use idem::idempotent;

struct Id;

#[idempotent(key = "id", mutating)]
async fn charge(id: &Id) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
