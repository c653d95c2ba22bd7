#![allow(unused_variables)]
use idem::idempotent;

async fn already_set(entity: &str, status: &str) -> Result<Option<()>, String> {
    Ok(None)
}

#[idempotent(natural, check = already_set)]
async fn set_status(entity: String, status: String) -> Result<(), String> {
    Ok(())
}

fn main() {}
