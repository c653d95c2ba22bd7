//! The contract (README "The contract"; the decision table of `idem::store::decide`), proven by
//! counting effects: how many times each body really ran. One test binary, one file per concern:
//!
//! | file | what |
//! |---|---|
//! | `contract.rs` | replay, mismatch (first, even in flight), concurrency, restarts, error policies, tenants, lapsed leases and zombies, TTL, purge |
//! | `refusals.rs` | what fails closed before the body: an unreachable store, invalid keys, arguments too large; and what says the body ran: a failed completion, a result too large |
//! | `options.rs` | the attribute's options at work: field paths and `skip`, optional and required keys, stable names, methods, natural tools, what the model sees, the registry |
//!
//! The tools and helpers below are shared by the three.

#[path = "../common/mod.rs"]
mod common;
mod contract;
mod options;
mod refusals;

use std::time::Duration;

use common::effect;
use idem::{Error, Idem, Outcome, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Payment {
    id: String,
    customer: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub(crate) enum PaymentError {
    #[error("card declined")]
    Declined,
    #[error("amount must be positive")]
    ZeroAmount,
}

/// The seeds' tool: charges once per (run_id, step_id).
#[idempotent(key = "run_id, step_id", mutating, name = "payments.register")]
pub(crate) async fn register_payment(
    run_id: String,
    step_id: String,
    customer: String,
    amount_cents: u64,
) -> Result<Payment, PaymentError> {
    if amount_cents == 0 {
        return Err(PaymentError::ZeroAmount);
    }
    effect(&run_id);
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Payment {
        id: format!("pay_{}", uuid::Uuid::new_v4().simple()),
        customer,
        amount_cents,
    })
}

/// Declines are stored and replayed, as Stripe does for requests that started.
#[idempotent(key = "run_id", mutating, name = "payments.strict", on_error = "store")]
pub(crate) async fn strict_payment(
    run_id: String,
    amount_cents: u64,
) -> Result<Payment, PaymentError> {
    effect(&run_id);
    if amount_cents > 1_000 {
        return Err(PaymentError::Declined);
    }
    Ok(Payment {
        id: "pay_strict".into(),
        customer: "c".into(),
        amount_cents,
    })
}

pub(crate) fn call(
    run: &str,
    amount: u64,
) -> impl Future<Output = Result<Outcome<Payment>, Error<PaymentError>>> {
    register_payment(run.to_owned(), "step-1".into(), "cus_42".into(), amount)
}

pub(crate) async fn sqlite(dir: &tempfile::TempDir) -> Idem {
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    Idem::open(&url).await.expect("open sqlite")
}
