use idem::{Idem, Outcome, idempotent};
use std::sync::atomic::{AtomicUsize, Ordering};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
struct Payment { id: String, amount_cents: u64 }

#[derive(Debug)]
struct PaymentError;

#[idempotent(key = "run_id, step_id", mutating)]
async fn register_payment(run_id: String, step_id: String, customer: String, amount_cents: u64)
    -> Result<Payment, PaymentError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Payment { id: format!("pay-{customer}"), amount_cents })
}

#[tokio::test]
async fn smoke() {
    let idem = Idem::open("memory://").await.unwrap();
    let t = idem.scope("t");
    let a = t.run(register_payment("r".into(), "s".into(), "c".into(), 5)).await.unwrap();
    let b = t.run(register_payment("r".into(), "s".into(), "c".into(), 5)).await.unwrap();
    let c = t.run(register_payment("r".into(), "s".into(), "c".into(), 6)).await.unwrap();
    assert!(matches!(a, Outcome::Fresh(_)));
    assert!(matches!(b, Outcome::Replayed(_)));
    assert!(matches!(c, Outcome::Mismatch(_)));
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
