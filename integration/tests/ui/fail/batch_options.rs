#![allow(unused_variables)]
// A batch tool claims and settles each item on its own: no transaction, no state check, no wait.
use idem::idempotent;

async fn already_sent(run_id: &String, ids: &Vec<String>) -> Result<Option<Vec<u64>>, String> {
    Ok(None)
}

#[idempotent(key = "run_id, ids[]", mutating, check = already_sent, wait = "5s")]
async fn send_all(run_id: String, ids: Vec<String>) -> Vec<Result<u64, String>> {
    Vec::new()
}

fn main() {}
