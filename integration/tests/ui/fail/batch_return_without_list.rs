#![allow(unused_variables)]
// `Vec<Result<T, E>>` is a batch tool's return: this key names no list.
use idem::idempotent;

#[idempotent(key = "run_id", mutating)]
async fn send_all(run_id: String, ids: Vec<String>) -> Vec<Result<u64, String>> {
    Vec::new()
}

fn main() {}
