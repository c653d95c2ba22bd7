#![allow(unused_variables)]
// `[]` keys each item of a list: the parameter must be a `Vec`.
use idem::idempotent;

#[idempotent(key = "run_id, ids[]", mutating)]
async fn send_all(run_id: String, ids: std::collections::BTreeSet<String>) -> Vec<Result<u64, String>> {
    Vec::new()
}

fn main() {}
