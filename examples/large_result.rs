//! A tool with a large result: an agent exports an account's ledger as CSV (2 MiB) to attach it
//! to a ticket. Three agent runs export the same month, and the host's retry handler sends the
//! first run's call again after a restart.
//!
//! Each export is recorded under its own key, and the retry replays the first run's file from
//! the SQLite store, byte for byte, without exporting again. The CSV is stored once: a result
//! longer than the store's blob threshold (64 KiB by default) lives apart from its record,
//! content-addressed by its SHA-256, and the three records that return the same bytes share it.
//!
//! Run it with `cargo run --example large_result`. It exits non-zero if an export ran twice
//! for one run, a retry got other bytes, or the file was stored more than once.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem::{Idem, idempotent};

/// How many times the ledger was exported.
static EXPORTS: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, thiserror::Error)]
#[error("the ledger service is down")]
struct LedgerDown;

/// The ledger of `account` for `month`, as CSV: one line per entry.
fn ledger_csv(account: &str, month: &str) -> String {
    let mut csv = String::from("date,account,entry,amount_cents,balance_cents\n");
    let mut balance: i64 = 0;
    for entry in 0..50_000i64 {
        let amount = (entry * 7919) % 100_000 - 40_000;
        balance += amount;
        let day = 1 + entry % 28;
        writeln!(
            csv,
            "{month}-{day:02},{account},e{entry:06},{amount},{balance}"
        )
        .expect("writing to a String");
    }
    csv
}

/// Exports the ledger (the slow, metered call of a real agent).
#[idempotent(key = "run_id, step_id", mutating, name = "ledger.export")]
async fn export_ledger(
    run_id: String,
    step_id: u32,
    account: String,
    month: String,
) -> Result<String, LedgerDown> {
    EXPORTS.fetch_add(1, Ordering::SeqCst);
    Ok(ledger_csv(&account, &month))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("idem-large-{}.db", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", path.display());
    let idem = Idem::open(&url).await?;
    let tenant = idem.scope("tenant-a");
    let export = |run: &str| export_ledger(run.into(), 1, "acct-42".into(), "2026-11".into());

    let mut files = Vec::new();
    for run in ["run-1", "run-2", "run-3"] {
        let out = tenant.run(export(run)).await?;
        let csv = out.value().ok_or("the export was refused")?;
        println!(
            "{run}: exported {:.1} MiB ({})",
            csv.len() as f64 / (1 << 20) as f64,
            if out.is_fresh() { "fresh" } else { "replayed" }
        );
        files.push(csv.clone());
    }

    // The process restarts; the retry handler sends run-1's call again.
    drop(idem);
    let idem = Idem::open(&url).await?;
    let retry = idem.scope("tenant-a").run(export("run-1")).await?;
    let replayed = retry.value().ok_or("the retry was refused")?;
    println!(
        "run-1 again, after a restart: {} ({} bytes, {})",
        if retry.is_replayed() {
            "replayed"
        } else {
            "fresh"
        },
        replayed.len(),
        if *replayed == files[0] {
            "byte-identical"
        } else {
            "DIFFERENT"
        }
    );

    let admin = idem::store::admin::open(&url).await?;
    let usage = admin.blob_usage(Some("tenant-a")).await?;
    let exports = EXPORTS.load(Ordering::SeqCst);
    println!(
        "{exports} export(s); the store keeps {} blob(s) of {:.1} MiB for the three records",
        usage.blobs,
        usage.bytes as f64 / (1 << 20) as f64
    );
    drop((admin, idem));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    if exports != 3 || !retry.is_replayed() || *replayed != files[0] || usage.blobs != 1 {
        return Err("expected three exports, a byte-identical replay, and one blob".into());
    }
    Ok(())
}
