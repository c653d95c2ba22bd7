#![allow(unused_variables)]
// One stream per call: one emitter.
use idem::{Emitter, idempotent};

#[idempotent(key = "run_id", mutating)]
async fn draft(run_id: String, out: Emitter<String>, log: Emitter<String>) -> Result<u32, String> {
    Ok(0)
}

fn main() {}
