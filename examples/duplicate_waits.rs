//! A duplicate that waits for the result: the host times out on a slow tool call and sends it
//! again while the first still runs.
//!
//! Without `wait`, the retry answers `InFlight` and the agent must try again later. With
//! `wait = "10s"`, it waits for the first call, receives its result as `Replayed`, and the
//! mail goes out once. The same holds across processes: on Postgres and Redis the waiting call
//! is woken by the store's notification (`LISTEN`/`NOTIFY`, pub/sub) when the first one
//! completes.
//!
//! Run it with `cargo run --example duplicate_waits`. It exits non-zero if a mail went twice or
//! a call did not get the result.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::{Idem, Outcome, idempotent};

/// The mails the provider sent.
static SENT: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, thiserror::Error)]
#[error("the provider refused the mail: {0}")]
struct MailRefused(String);

/// Sends an invoice by mail: slow (800 ms at the provider), and never twice for one step.
#[idempotent(
    key = "run_id, step_id",
    mutating,
    name = "mail.send_invoice",
    wait = "10s"
)]
async fn send_invoice(run_id: String, step_id: u32, to: String) -> Result<String, MailRefused> {
    tokio::time::sleep(Duration::from_millis(800)).await;
    let n = SENT.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("msg-{n} to {to}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("idem-waits-{}.db", uuid::Uuid::new_v4()));
    let idem = Idem::open(&format!("sqlite://{}", path.display())).await?;
    let tenant = idem.scope("tenant-a");
    let started = Instant::now();

    // The model's call, and the host's retry 200 ms later (its timeout fired).
    let first = tokio::spawn(tenant.run(send_invoice("run-7".into(), 3, "ana@example.com".into())));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let retry = tenant
        .run(send_invoice("run-7".into(), 3, "ana@example.com".into()))
        .await?;
    let first = first.await??;

    println!("first call: {first:?}");
    println!(
        "retry, sent while the first ran: {retry:?} after {} ms",
        started.elapsed().as_millis()
    );
    println!("mails sent: {}", SENT.load(Ordering::SeqCst));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    match (first, retry) {
        (Outcome::Fresh(a), Outcome::Replayed(b)) if a == b && SENT.load(Ordering::SeqCst) == 1 => {
            Ok(())
        }
        other => Err(format!("expected one mail and its replay, got {other:?}").into()),
    }
}
