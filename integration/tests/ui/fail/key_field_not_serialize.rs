#![allow(unused_variables)]
use idem::idempotent;

struct Id;

#[derive(serde::Serialize)]
struct Request {
    #[serde(skip)]
    id: Id,
    amount: u64,
}

#[idempotent(key = "req.id", mutating)]
async fn charge(req: Request) -> Result<u64, String> {
    Ok(req.amount)
}

fn main() {}
