#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating)]
async fn charge(run_id: String) {}

fn main() {}
