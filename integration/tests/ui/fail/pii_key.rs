#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "customer_email", mutating)]
async fn send_receipt(customer_email: String) -> Result<(), String> {
    Ok(())
}

fn main() {}
