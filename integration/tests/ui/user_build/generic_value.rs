//! A generic tool whose value type parameter is not bounded `Deserialize`.
#![allow(unused_variables)]

#[idem::idempotent(key = "run_id", mutating)]
async fn echo<T: serde::Serialize + Send>(run_id: String, value: T) -> Result<T, String> {
    Ok(value)
}

fn main() {}
