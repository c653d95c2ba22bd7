use idem::{Idem, Outcome, idempotent};
use serde::Serialize;

#[derive(Serialize)]
struct Params {
    idempotency_key: Option<String>,
    amount_cents: u64,
}

#[idempotent(key = "idempotency_key", mutating, name = "opt.param")]
async fn by_param(idempotency_key: Option<String>, amount_cents: u64) -> Result<u64, String> {
    Ok(amount_cents)
}

#[idempotent(key = "p.idempotency_key", mutating, name = "opt.field")]
async fn by_field(p: Params) -> Result<u64, String> {
    Ok(p.amount_cents)
}

#[idempotent(key = "idempotency_key", mutating, required, name = "opt.required")]
async fn required(idempotency_key: Option<String>) -> Result<(), String> {
    Ok(())
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let t = idem.scope("t");
    assert_eq!(t.run(by_param(None, 5)).await.unwrap(), Outcome::Unprotected(5));
    assert_eq!(t.run(by_param(Some("k-1".into()), 5)).await.unwrap(), Outcome::Fresh(5));
    let p = |k: Option<&str>| Params { idempotency_key: k.map(Into::into), amount_cents: 3 };
    assert_eq!(t.run(by_field(p(None))).await.unwrap(), Outcome::Unprotected(3));
    assert_eq!(t.run(by_field(p(Some("k-2")))).await.unwrap(), Outcome::Fresh(3));
    assert!(matches!(t.run(required(None)).await, Err(idem::Error::MissingKey { .. })));
}
