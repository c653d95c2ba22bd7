//! A batch tool: the agent charges twelve invoices in one call, each invoice with its own key
//! and its own outcome, the claims of all twelve in one store round trip and their results in
//! one more.
//!
//! The agent's first call reached the provider for five invoices before the host gave up on
//! it; the model then asks for all twelve. idem runs the body on the seven that were not done,
//! replays the five (the declined card's error too, as it was stored), and an invoice whose
//! amount changed between the calls answers `Mismatch` without holding back the others.
//!
//! Run it with `cargo run --example charge_invoices`. It exits non-zero if an invoice was
//! charged twice or an answer is not the one expected.

use std::sync::Mutex;

use idem::{Idem, Outcome, idempotent};
use serde::{Deserialize, Serialize};

/// An invoice to charge; `id` is its key within the step.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Invoice {
    id: String,
    customer: String,
    amount_cents: u64,
}

/// What the provider answered for one invoice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    charge_id: String,
    amount_cents: u64,
}

/// A charge the provider refused: stored (`on_error = "store"`), so a retry gets the same answer
/// and never charges again.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("card declined for {0}")]
struct Declined(String);

/// Every charge the provider made, by invoice id.
static CHARGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Charges each invoice once per run and step, whatever the agent retries.
#[idempotent(
    key = "run_id, step_id, invoices[].id",
    mutating,
    name = "billing.charge_invoices",
    on_error = "store"
)]
async fn charge_invoices(
    run_id: String,
    step_id: u32,
    invoices: Vec<Invoice>,
) -> Vec<Result<Charge, Declined>> {
    // The body gets only the invoices to charge now, in order; it answers one result each.
    let mut charged = CHARGED.lock().unwrap();
    invoices
        .into_iter()
        .map(|invoice| {
            if invoice.customer == "cus_blocked" {
                return Err(Declined(invoice.customer));
            }
            charged.push(invoice.id.clone());
            Ok(Charge {
                charge_id: format!("ch_{}", charged.len()),
                amount_cents: invoice.amount_cents,
            })
        })
        .collect()
}

fn invoices(n: usize) -> Vec<Invoice> {
    (1..=n)
        .map(|i| Invoice {
            id: format!("inv-{i:02}"),
            customer: if i == 4 { "cus_blocked" } else { "cus_ana" }.to_owned(),
            amount_cents: 1_000 + i as u64,
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("idem-batch-{}.db", uuid::Uuid::new_v4()));
    let idem = Idem::open(&format!("sqlite://{}", path.display())).await?;
    let tenant = idem.scope("tenant-a");

    // The first call: five invoices (the fourth declined).
    let first = tenant
        .run(charge_invoices("run-7".into(), 2, invoices(5)))
        .await?;
    println!(
        "first call: {} invoices, the body ran on {}",
        first.len(),
        first.ran()
    );

    // The retry: all twelve, and the model changed the amount of the second invoice.
    let mut all = invoices(12);
    all[1].amount_cents += 1;
    let retry = tenant.run(charge_invoices("run-7".into(), 2, all)).await?;
    println!(
        "retry: {} invoices, the body ran on {}",
        retry.len(),
        retry.ran()
    );
    let mut summary = Vec::new();
    for (i, answer) in retry.iter().enumerate() {
        let what = match answer {
            Ok(Outcome::Fresh(c)) => format!("charged now ({})", c.charge_id),
            Ok(Outcome::Replayed(c)) => format!("replayed ({})", c.charge_id),
            Ok(Outcome::Mismatch(_)) => "mismatch: other arguments than its first call".into(),
            Err(idem::Error::Tool {
                error,
                replayed: true,
                ..
            }) => format!("replayed error: {error}"),
            other => format!("unexpected: {other:?}"),
        };
        println!("  inv-{:02}: {what}", i + 1);
        summary.push(what);
    }
    let charged = CHARGED.lock().unwrap().clone();
    println!("charges made: {}", charged.len());
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }

    let mut unique = charged.clone();
    unique.sort();
    unique.dedup();
    let fresh = summary
        .iter()
        .filter(|s| s.starts_with("charged now"))
        .count();
    let replayed = summary.iter().filter(|s| s.starts_with("replayed")).count();
    // 11 charges: invoices 1-3 and 5 in the first call, 6-12 in the retry; the 4th declined once.
    if charged.len() == 11
        && unique.len() == 11
        && first.ran() == 5
        && retry.ran() == 7
        && fresh == 7
        && replayed == 4
        && summary[1].starts_with("mismatch")
    {
        Ok(())
    } else {
        Err(format!("expected 11 charges, each once, got {charged:?}").into())
    }
}
