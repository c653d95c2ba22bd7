#![allow(unused_variables)]
// A batch keys the items of one list.
use idem::idempotent;

#[idempotent(key = "mails[].id, invoices[].id", mutating)]
async fn send_all(mails: Vec<u64>, invoices: Vec<u64>) -> Vec<Result<u64, String>> {
    Vec::new()
}

fn main() {}
