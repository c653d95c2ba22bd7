#![allow(unused_variables)]
// `[]` marks the list in `key` only.
use idem::idempotent;

#[idempotent(key = "run_id, ids[]", mutating, skip = "ids[].sent_at")]
async fn send_all(run_id: String, ids: Vec<String>) -> Vec<Result<u64, String>> {
    Vec::new()
}

fn main() {}
