use idem::{Idem, Outcome, idempotent};
use serde::Serialize;

#[derive(Serialize)]
struct Charge {
    run_id: String,
    amount: u64,
}

/// A wrapper like rmcp's `Parameters<T>`.
#[derive(Serialize)]
#[serde(transparent)]
struct Parameters<T>(T);

#[idempotent(key = "params.0.run_id", mutating, name = "tuple.charge")]
async fn charge(params: Parameters<Charge>) -> Result<u64, String> {
    Ok(params.0.amount)
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let call = || charge(Parameters(Charge { run_id: "r-1".into(), amount: 5 }));
    assert_eq!(idem.scope("t").run(call()).await.unwrap(), Outcome::Fresh(5));
    assert_eq!(idem.scope("t").run(call()).await.unwrap(), Outcome::Replayed(5));
}
