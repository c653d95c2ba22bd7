#![allow(unused_variables)]
use idem::idempotent;

#[derive(serde::Serialize)]
struct Request {
    run_id: String,
}

#[idempotent(key = "req.run", mutating)]
async fn charge(req: Request) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
