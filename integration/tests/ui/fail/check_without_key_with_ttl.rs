#![allow(unused_variables)]
use idem::idempotent;

async fn already_assigned(crewmate: &str, shift: &str) -> Result<Option<()>, String> {
    Ok(None)
}

#[idempotent(mutating, check = already_assigned, ttl = "1h")]
async fn assign_shift(crewmate: String, shift: String) -> Result<(), String> {
    Ok(())
}

fn main() {}
