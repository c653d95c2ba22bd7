#![allow(unused_variables)]
// A streaming tool records its chunks under its key and its retries follow the stream: no
// state check, no wait.
use idem::{Emitter, idempotent};

async fn already_drafted(run_id: &String) -> Result<Option<u32>, String> {
    Ok(None)
}

#[idempotent(key = "run_id", mutating, check = already_drafted, wait = "5s")]
async fn draft(run_id: String, out: Emitter<String>) -> Result<u32, String> {
    Ok(0)
}

fn main() {}
