use idem::{Idem, idempotent};
use serde::Serialize;

#[derive(Serialize)]
struct Step {
    run_id: String,
    index: u32,
}

#[derive(Serialize)]
struct Request {
    step: Step,
    amount_cents: u64,
    sent_at: u64,
}

/// Tools whose arguments are one struct (rmcp `Parameters<T>`, rig) key on field paths.
#[idempotent(key = "req.step.run_id, req.step.index", mutating, skip = "req.sent_at")]
async fn charge(req: Request) -> Result<u64, String> {
    Ok(req.amount_cents)
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let t = idem.scope("t");
    let req = |sent_at| Request { step: Step { run_id: "r".into(), index: 1 }, amount_cents: 5, sent_at };
    assert!(t.run(charge(req(1))).await.unwrap().is_fresh());
    assert!(t.run(charge(req(2))).await.unwrap().is_replayed());
}
