#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(natural, key = "entity")]
async fn set_status(entity: String, status: String) -> Result<(), String> {
    Ok(())
}

fn main() {}
