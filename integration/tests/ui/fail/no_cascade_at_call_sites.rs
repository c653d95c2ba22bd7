#![allow(unused_variables)]
// A broken attribute is one error: the function still exists with the rewritten signature, so
// the call site below type-checks and adds nothing.
use idem::{Idem, Outcome, idempotent};

#[idempotent(key = "run", mutating)]
async fn charge(run_id: String) -> Result<u64, String> {
    Ok(1)
}

async fn agent(idem: Idem) {
    let out: Outcome<u64> = idem.scope("t").run(charge("r".into())).await.unwrap();
    let _ = out.is_replayed();
}

fn main() {}
