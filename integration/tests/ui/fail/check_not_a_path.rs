#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(mutating, check = "already_assigned")]
async fn assign_shift(crewmate: String, shift: String) -> Result<(), String> {
    Ok(())
}

fn main() {}
