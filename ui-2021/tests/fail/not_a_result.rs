// One error, at the return type: the signature's projection and the body's conversion report
// the same thing, which rustc prints once (edition 2021 used to print it twice).
#![allow(unused_variables)]
use idem::idempotent;

#[idempotent(key = "run_id", mutating)]
async fn charge(run_id: String) -> u8 {
    1
}

fn main() {}
