//! The seeds' lesson, replayed: "retrying is a fact; charging twice is not".
//!
//! A simulated payment provider keeps a ledger of charges in a file. An agent calls
//! `register_payment` the way agents do: the first call times out after the provider charged
//! (the response is lost on the way back), a generic retry handler tries again, and the model,
//! seeing an ambiguous error, calls the tool once more.
//!
//! 1. The starter tool (no idempotency) charges three times.
//! 2. The `#[idempotent]` tool, under the same retries, charges once: `Fresh`, then `InFlight`
//!    while the first call still runs, then `Replayed`.
//! 3. The same key with another amount is a `Mismatch`: no charge.
//! 4. The process restarts (a real new process): the call replays from the SQLite file, no charge.
//!
//! Run it with `cargo run --example register_payment`. It exits non-zero if any ledger is wrong.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use idem::{Idem, Outcome, idempotent};
use serde::{Deserialize, Serialize};

/// What the provider returns for a charge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    payment_id: String,
    customer: String,
    amount_cents: u64,
}

/// The provider's errors.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
enum PaymentError {
    #[error("the provider is unreachable")]
    Unreachable,
}

/// The simulated provider: every charge is a line in its ledger file, synced to disk.
struct Provider;

/// The ledger file the provider writes to (one per part of the story).
static LEDGER: Mutex<Option<PathBuf>> = Mutex::new(None);

impl Provider {
    fn use_ledger(path: PathBuf) {
        *LEDGER.lock().expect("ledger lock") = Some(path);
    }

    fn ledger_path() -> PathBuf {
        LEDGER
            .lock()
            .expect("ledger lock")
            .clone()
            .expect("a ledger is chosen first")
    }

    /// Charges the customer, then takes `reply_delay` to answer (the network on the way back).
    async fn charge(
        customer: &str,
        amount_cents: u64,
        reply_delay: Duration,
    ) -> Result<Payment, PaymentError> {
        let payment = Payment {
            payment_id: format!("pay_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            customer: customer.to_owned(),
            amount_cents,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(Self::ledger_path())
            .map_err(|_| PaymentError::Unreachable)?;
        writeln!(file, "{}", serde_json::to_string(&payment).expect("json"))
            .map_err(|_| PaymentError::Unreachable)?;
        file.sync_all().map_err(|_| PaymentError::Unreachable)?;
        tokio::time::sleep(reply_delay).await;
        Ok(payment)
    }

    fn ledger(path: &Path) -> Vec<Payment> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("ledger line"))
            .collect()
    }
}

/// How long the provider takes to answer this call: the first one is slow.
fn reply_delay(attempt: u32) -> Duration {
    if attempt == 1 {
        Duration::from_millis(600)
    } else {
        Duration::from_millis(10)
    }
}

/// The starter: charges every time it is called.
async fn register_payment_starter(
    customer: String,
    amount_cents: u64,
    attempt: u32,
) -> Result<Payment, PaymentError> {
    Provider::charge(&customer, amount_cents, reply_delay(attempt)).await
}

/// The same tool, made safe to retry. The key is the intent (run + step), never the attempt.
#[idempotent(
    key = "run_id, step_id",
    mutating,
    name = "payments.register",
    skip = "attempt"
)]
async fn register_payment(
    run_id: String,
    step_id: String,
    customer: String,
    amount_cents: u64,
    attempt: u32,
) -> Result<Payment, PaymentError> {
    Provider::charge(&customer, amount_cents, reply_delay(attempt)).await
}

/// What the agent's tool adapter does: it runs the call as a task and stops waiting after the
/// timeout. The call itself goes on (the provider already has the request).
async fn call_with_timeout<T: Send + 'static>(
    call: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let handle = tokio::spawn(call);
    tokio::time::timeout(Duration::from_millis(200), handle)
        .await
        .ok()
        .map(|r| r.expect("task"))
}

async fn starter_story(ledger: &Path) -> Vec<Payment> {
    println!("\n== 1. The starter tool, no idempotency ==");
    Provider::use_ledger(ledger.to_owned());
    let mut attempt = 1;
    let call = |attempt| register_payment_starter("cus_42".into(), 500, attempt);
    match call_with_timeout(call(attempt)).await {
        None => {
            println!("  attempt {attempt}: timed out (the provider charged; the reply was lost)")
        }
        Some(r) => println!("  attempt {attempt}: {r:?}"),
    }
    attempt += 1;
    let r = call_with_timeout(call(attempt)).await;
    println!(
        "  attempt {attempt} (generic retry handler): {}",
        describe_plain(&r)
    );
    attempt += 1;
    let r = call_with_timeout(call(attempt)).await;
    println!(
        "  attempt {attempt} (the model calls again): {}",
        describe_plain(&r)
    );
    tokio::time::sleep(Duration::from_millis(700)).await; // let the slow first call finish
    Provider::ledger(ledger)
}

fn describe_plain(r: &Option<Result<Payment, PaymentError>>) -> String {
    match r {
        Some(Ok(p)) => format!("charged {} ({})", p.amount_cents, p.payment_id),
        Some(Err(e)) => format!("error: {e}"),
        None => "timed out".into(),
    }
}

fn describe(r: &Option<Result<Outcome<Payment>, idem::Error<PaymentError>>>) -> String {
    match r {
        None => "timed out (the provider charged; the reply was lost)".into(),
        Some(Ok(Outcome::Fresh(p))) => {
            format!("Fresh: charged {} ({})", p.amount_cents, p.payment_id)
        }
        Some(Ok(Outcome::Replayed(p))) => format!(
            "Replayed: {} from the first call, no new charge",
            p.payment_id
        ),
        Some(Ok(Outcome::InFlight(i))) => format!(
            "InFlight: the first call is still running (key {}); back off, same key",
            i.key
        ),
        Some(Ok(Outcome::Mismatch(m))) => format!(
            "Mismatch: key {} was used with other arguments; no charge",
            m.key
        ),
        Some(Ok(other)) => format!("{other:?}"),
        Some(Err(e)) => format!("error: {e}"),
    }
}

async fn idempotent_story(idem: &Idem, ledger: &Path) -> Result<(), String> {
    println!("\n== 2. The #[idempotent] tool, same retries ==");
    Provider::use_ledger(ledger.to_owned());
    let tenant = idem.scope("acme");
    let call = |attempt, amount| {
        tenant.run(register_payment(
            "run-9".into(),
            "step-3".into(),
            "cus_42".into(),
            amount,
            attempt,
        ))
    };
    let r = call_with_timeout(call(1, 500)).await;
    println!("  attempt 1: {}", describe(&r));
    let mut attempt = 2;
    loop {
        let r = call_with_timeout(call(attempt, 500)).await;
        println!(
            "  attempt {attempt} (generic retry handler): {}",
            describe(&r)
        );
        match r {
            Some(Ok(Outcome::InFlight(_))) | None if attempt < 6 => {
                tokio::time::sleep(Duration::from_millis(250)).await;
                attempt += 1;
            }
            Some(Ok(Outcome::Replayed(_))) => break,
            other => return Err(format!("unexpected: {other:?}")),
        }
    }
    let r = call_with_timeout(call(attempt + 1, 500)).await;
    println!(
        "  attempt {} (the model calls again): {}",
        attempt + 1,
        describe(&r)
    );
    if !matches!(r, Some(Ok(Outcome::Replayed(_)))) {
        return Err("the model's call should replay".into());
    }

    println!("\n== 3. Same key, another amount ==");
    let r = call_with_timeout(call(1, 5_000)).await;
    println!("  amount 5000 with run-9/step-3: {}", describe(&r));
    if !matches!(r, Some(Ok(Outcome::Mismatch(_)))) {
        return Err("a changed amount must be a mismatch".into());
    }
    let json = serde_json::to_string(&r.unwrap().unwrap()).expect("json");
    println!("  what the model sees: {json}");
    Ok(())
}

/// Part 4 runs in a new process: `register_payment --after-restart DB LEDGER`.
async fn after_restart(db: &Path, ledger: &Path) -> Result<(), String> {
    Provider::use_ledger(ledger.to_owned());
    let idem = Idem::open(&format!("sqlite://{}", db.display()))
        .await
        .map_err(|e| e.to_string())?;
    let out = idem
        .scope("acme")
        .run(register_payment(
            "run-9".into(),
            "step-3".into(),
            "cus_42".into(),
            500,
            1,
        ))
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "  [pid {}] after the restart: {}",
        std::process::id(),
        describe(&Some(Ok(out.clone())))
    );
    if out.is_replayed() {
        Ok(())
    } else {
        Err("the call after the restart must replay".into())
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = if args.get(1).map(String::as_str) == Some("--after-restart") {
        after_restart(Path::new(&args[2]), Path::new(&args[3])).await
    } else {
        run().await
    };
    if let Err(e) = result {
        eprintln!("\nFAILED: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("idem-register-payment-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (starter_ledger, idem_ledger, db) = (
        dir.join("starter-ledger.jsonl"),
        dir.join("idem-ledger.jsonl"),
        dir.join("idem.db"),
    );
    println!(
        "register_payment: an agent retries a payment tool (state in {})",
        dir.display()
    );

    let starter = starter_story(&starter_ledger).await;

    let idem = Idem::open(&format!("sqlite://{}", db.display()))
        .await
        .map_err(|e| e.to_string())?;
    let audit = idem::audit(&idem).await;
    if !audit.is_ok() {
        return Err(audit.to_string());
    }
    idempotent_story(&idem, &idem_ledger).await?;
    drop(idem);

    println!("\n== 4. The process restarts ==");
    let status = std::process::Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg("--after-restart")
        .arg(&db)
        .arg(&idem_ledger)
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err("the restarted process failed".into());
    }

    let charged = Provider::ledger(&idem_ledger);
    println!("\n== The provider's ledgers ==");
    println!("  starter tool: {} charge(s)", starter.len());
    for p in &starter {
        println!(
            "    {} {} {} cents",
            p.payment_id, p.customer, p.amount_cents
        );
    }
    println!("  #[idempotent] tool: {} charge(s)", charged.len());
    for p in &charged {
        println!(
            "    {} {} {} cents",
            p.payment_id, p.customer, p.amount_cents
        );
    }

    let report = idem::registry::report();
    std::fs::write(dir.join("idem-tools.md"), report.to_markdown()).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("idem-tools.json"), report.to_json()).map_err(|e| e.to_string())?;
    println!("\n{audit}");
    println!(
        "Tool report written to {}",
        dir.join("idem-tools.md").display()
    );

    if starter.len() != 3 {
        return Err(format!(
            "the starter should have charged 3 times, not {}",
            starter.len()
        ));
    }
    if charged.len() != 1 {
        return Err(format!(
            "the idempotent tool charged {} times",
            charged.len()
        ));
    }
    println!("\nRetrying is a fact; charging twice is not: 3 charges without idem, 1 with it.");
    Ok(())
}
