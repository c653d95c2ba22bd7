#![allow(unused_variables)]
// A batch tool answers one result per item it runs.
use idem::idempotent;

#[idempotent(key = "run_id, ids[]", mutating)]
async fn send_all(run_id: String, ids: Vec<String>) -> Result<Vec<u64>, String> {
    Ok(Vec::new())
}

fn main() {}
