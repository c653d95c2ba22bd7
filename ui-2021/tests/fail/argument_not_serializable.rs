#![allow(unused_variables)]
use idem::idempotent;

struct Connection;

#[idempotent(key = "run_id", mutating)]
async fn charge(run_id: String, conn: Connection) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
