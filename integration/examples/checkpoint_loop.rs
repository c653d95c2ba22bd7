//! The durable engine you write yourself: a workflow loop that checkpoints each step's result in
//! your own Postgres table and resumes from the last checkpoint, with a key on every mutating
//! tool from the same run scope a real engine uses (`idem::run`).
//!
//! ```text
//! cargo run -p idem-integration --example checkpoint_loop
//! ```
//!
//! Run as above, it runs the workflow of three orders (reserve, charge, ship) in a worker it
//! starts as a child process, and kills that worker once (SIGKILL) after the first charge and
//! before its checkpoint; the next worker resumes from the checkpoints, the charge replays, and
//! each step's effect is in the ledger once. It uses `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), in a schema of its own (`idem_checkpoint_example`,
//! dropped at the end): the checkpoints, the ledger (the steps' external effects) and idem's
//! records side by side.
//!
//! `checkpoint_loop work ORDERS` is the worker alone (what `integration/tests/checkpoint_loop.rs`
//! kills): it runs the workflows of orders 0..ORDERS to the end, resuming each from its last
//! checkpoint, then exits 0. Its environment: `DATABASE_URL`, `SCHEMA`, `BARE=1` to call the
//! steps' effects without idem, and `CRASH_DIR`, `CRASH_PERCENT`: at each of three points of a
//! step (before the effect, inside it after the effect, after it before the checkpoint) the
//! worker kills itself with that chance, at most once per step and point.

use std::sync::OnceLock;
use std::time::Duration;

use idem::idempotent;
use idem::run::Run;
use idem::store::postgres::tokio_postgres::{self, NoTls};

#[path = "common/kills.rs"]
mod kills;

use kills::Kills;

/// The steps of every order's workflow, in order.
const STEPS: [&str; 3] = ["reserve", "charge", "ship"];

/// The worker's settings, read once from the environment.
struct Settings {
    database_url: String,
    schema: String,
    kills: Kills,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

fn settings() -> &'static Settings {
    SETTINGS.get_or_init(|| Settings {
        database_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
        schema: std::env::var("SCHEMA").unwrap_or_else(|_| "idem_checkpoint_example".to_owned()),
        kills: Kills::from_env(),
    })
}

/// The application's database: the checkpoints and the ledger.
static DB: OnceLock<tokio_postgres::Client> = OnceLock::new();

fn db() -> &'static tokio_postgres::Client {
    DB.get().expect("connected first")
}

/// The worker kills itself at `point` of a step, as `CRASH_DIR` and `CRASH_PERCENT` say.
fn maybe_crash(step: &str, point: &str) {
    settings().kills.maybe(&format!("{step}.{point}"));
}

/// A step's external effect failed.
#[derive(Debug, thiserror::Error)]
#[error("the ledger could not be written: {0}")]
struct LedgerError(#[from] tokio_postgres::Error);

/// The external effect of a step: a row in the ledger (not idem's store, not a checkpoint).
async fn write_ledger(order: &str, step: &str) -> Result<(), LedgerError> {
    let sql = format!(
        "INSERT INTO {}.ledger (order_id, step) VALUES ($1, $2)",
        settings().schema
    );
    db().execute(&sql, &[&order, &step]).await?;
    Ok(())
}

/// Whether the ledger already holds the step's effect: asked when a call takes over the key of
/// one that died inside the body, before the body could run again.
async fn already_done(order: &String, step: &String) -> Result<Option<String>, LedgerError> {
    let sql = format!(
        "SELECT 1 FROM {}.ledger WHERE order_id = $1 AND step = $2",
        settings().schema
    );
    let found = db().query_opt(&sql, &[order, step]).await?;
    Ok(found.map(|_| format!("{step} {order}")))
}

/// A step's mutating tool: keyed by the run (the order's workflow) and the step.
#[idempotent(
    key = "run_id, step_id",
    mutating,
    name = "checkpoint.step",
    ttl = "8d",
    lease = "1s",
    check = already_done
)]
async fn perform(order: String, step: String) -> Result<String, LedgerError> {
    write_ledger(&order, &step).await?;
    maybe_crash(&format!("{order}.{step}"), "inside");
    Ok(format!("{step} {order}"))
}

/// The same effect without idem.
async fn perform_bare(order: String, step: String) -> Result<String, LedgerError> {
    write_ledger(&order, &step).await?;
    maybe_crash(&format!("{order}.{step}"), "inside");
    Ok(format!("{step} {order}"))
}

/// The engine: each order's workflow from its last checkpoint to the end.
async fn run_workflow(order: &str, bare: bool) -> Result<(), String> {
    let schema = &settings().schema;
    let run = Run::new(format!("workflow-{order}")).map_err(|e| e.to_string())?;
    for step in STEPS {
        let done = db()
            .query_opt(
                &format!("SELECT result FROM {schema}.checkpoints WHERE run_id = $1 AND step = $2"),
                &[&run.id(), &step],
            )
            .await
            .map_err(|e| e.to_string())?;
        if done.is_some() {
            continue; // confirmed: skipped, as a durable engine does
        }
        let at = format!("{order}.{step}");
        maybe_crash(&at, "before");
        let result = if bare {
            perform_bare(order.to_owned(), step.to_owned())
                .await
                .map_err(|e| e.to_string())?
        } else {
            let call = run
                .step(step, perform(order.to_owned(), step.to_owned()))
                .map_err(|e| e.to_string())?;
            let outcome = call.await.map_err(|e| e.to_string())?;
            // In flight: the worker before this one died in the body and its lease is still
            // live; wait and run the step again, as an engine's retry would.
            if outcome.is_in_flight() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Box::pin(run_workflow(order, bare)).await;
            }
            outcome
                .into_value()
                .ok_or_else(|| format!("{at}: neither done nor in flight"))?
        };
        maybe_crash(&at, "after");
        db().execute(
            &format!("INSERT INTO {schema}.checkpoints (run_id, step, result) VALUES ($1, $2, $3)"),
            &[&run.id(), &step, &result],
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn connect() -> Result<(), String> {
    let (client, connection) = tokio_postgres::connect(&settings().database_url, NoTls)
        .await
        .map_err(|e| format!("cannot connect to DATABASE_URL: {e}"))?;
    tokio::spawn(connection);
    let schema = &settings().schema;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {schema}.checkpoints
                 (run_id TEXT, step TEXT, result TEXT, PRIMARY KEY (run_id, step));
             CREATE TABLE IF NOT EXISTS {schema}.ledger (order_id TEXT, step TEXT);"
        ))
        .await
        .map_err(|e| e.to_string())?;
    let _ = DB.set(client);
    Ok(())
}

/// The worker: every order's workflow to its end, then exit 0.
async fn work(orders: usize) -> Result<(), String> {
    connect().await?;
    let base = &settings().database_url;
    let join = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{join}schema={}_idem", settings().schema);
    let idem = idem::Idem::builder()
        .resume_window(Duration::from_secs(7 * 24 * 3600))
        .open(&url)
        .await
        .map_err(|e| e.to_string())?;
    let audit = idem::audit(&idem).await;
    if !audit.is_ok() {
        return Err(audit.to_string());
    }
    idem.install("checkpoint-example");
    let bare = std::env::var("BARE").as_deref() == Ok("1");
    for order in 0..orders {
        run_workflow(&format!("order-{order}"), bare).await?;
    }
    Ok(())
}

/// The demonstration: a worker killed once after the first charge, then resumed.
async fn demonstrate() -> Result<(), String> {
    connect().await?;
    let schema = settings().schema.clone();
    db().batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; DROP SCHEMA IF EXISTS {schema}_idem CASCADE;"
    ))
    .await
    .map_err(|e| e.to_string())?;
    let crashes = tempfile::tempdir().map_err(|e| e.to_string())?;
    // Only one kill: after order-0's charge, before its checkpoint.
    for order in 0..3 {
        for step in STEPS {
            for point in ["before", "inside", "after"] {
                if (order, step, point) != (0, "charge", "after") {
                    let marker = crashes.path().join(format!("order-{order}.{step}.{point}"));
                    std::fs::write(marker, "").map_err(|e| e.to_string())?;
                }
            }
        }
    }
    let program = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut workers = 0;
    loop {
        workers += 1;
        let status = std::process::Command::new(&program)
            .args(["work", "3"])
            .env("DATABASE_URL", &settings().database_url)
            .env("SCHEMA", &schema)
            .env("CRASH_DIR", crashes.path())
            .env("CRASH_PERCENT", "100")
            .status()
            .map_err(|e| e.to_string())?;
        if status.success() {
            break;
        }
        println!("worker {workers} died ({status}); starting the next from the checkpoints");
    }
    connect().await?;
    let rows = db()
        .query(
            &format!(
                "SELECT order_id, step, count(*) FROM {schema}.ledger GROUP BY 1, 2 ORDER BY 1, 2"
            ),
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    for row in &rows {
        let (order, step, n): (String, String, i64) = (row.get(0), row.get(1), row.get(2));
        println!("{order} {step:<8} in the ledger {n} time(s)");
    }
    db().batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; DROP SCHEMA IF EXISTS {schema}_idem CASCADE;"
    ))
    .await
    .map_err(|e| e.to_string())?;
    if rows.iter().any(|row| row.get::<_, i64>(2) != 1) {
        return Err("a step's effect is not in the ledger exactly once".into());
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("work") => {
            let orders = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(3);
            work(orders).await
        }
        _ => demonstrate().await,
    };
    if let Err(e) = result {
        eprintln!("checkpoint_loop: {e}");
        std::process::exit(1);
    }
}
