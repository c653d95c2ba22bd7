#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating)]
async fn echo<T: serde::Serialize + Send>(run_id: String, value: T) -> Result<T, String> {
    Ok(value)
}

fn main() {}
