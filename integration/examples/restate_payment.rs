//! A payment under a real Restate server: the handler charges inside a journaled action
//! (`ctx.run`), through an `#[idempotent]` tool keyed by the invocation and the step.
//!
//! ```text
//! cargo run -p idem-integration --example restate_payment
//! ```
//!
//! Run as above, it starts a Restate server (`restate-server` on the `PATH`, in
//! `IDEM_RESTATE_SERVER`, or installed with npm under `~/.cache/idem-restate`), starts itself
//! as the service, registers it, and pays one order twice over: the first time the service is
//! killed (SIGKILL) after the charge, before Restate journals it. Restate runs the action again
//! in a new process; the tool finds its key and replays: one charge in the ledger. The same
//! order through the handler without idem charges twice.
//!
//! `restate_payment serve PORT` is the service alone (what the kill tests in
//! `integration/tests/restate.rs` run). Its environment: `IDEM_STORE_URL` (the idem store),
//! `LEDGER` (the file each charge appends a line to: the external effect), and, for tests,
//! `CRASH_DIR` and `CRASH_PERCENT`: at each of three points of an action (before the charge,
//! inside it after the effect, after it before the action returns) the process kills itself
//! with that chance, at most once per order and point (a marker file in `CRASH_DIR` says so).

// restate's `#[service]` generates public items without docs.
#![allow(missing_docs)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use idem::idempotent;
use idem::restate::{Steps, answer};
use restate_sdk::prelude::*;

#[path = "common/kills.rs"]
mod kills;
#[path = "../tests/common/restate.rs"]
mod restate;

use kills::Kills;

/// What the handler is asked to pay.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Order {
    pub order_id: String,
    pub amount_cents: u64,
}

/// What a charge returns (and idem stores for replays).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Charged {
    pub order_id: String,
    pub amount_cents: u64,
}

/// The ledger file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("the ledger could not be written: {0}")]
pub struct LedgerError(String);

/// The ledger file, from `LEDGER`.
fn ledger() -> &'static PathBuf {
    static LEDGER: OnceLock<PathBuf> = OnceLock::new();
    LEDGER.get_or_init(|| {
        std::env::var_os("LEDGER")
            .map(PathBuf::from)
            .expect("LEDGER names the ledger file")
    })
}

/// Kills at `point` of `order_id`'s action, as `CRASH_DIR` and `CRASH_PERCENT` say.
fn maybe_crash(order_id: &str, point: &str) {
    static KILLS: OnceLock<Kills> = OnceLock::new();
    KILLS
        .get_or_init(Kills::from_env)
        .maybe(&format!("{order_id}.{point}"));
}

/// The external effect: one line per charge, appended to the ledger (not idem's store).
fn append_to_ledger(order_id: &str) -> Result<(), LedgerError> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger())
        .map_err(|e| LedgerError(e.to_string()))?;
    file.write_all(format!("{order_id}\n").as_bytes())
        .map_err(|e| LedgerError(e.to_string()))
}

/// Whether the ledger already holds the order's charge: asked when a call takes over the key of
/// a call that died inside the body (after the effect or before it, nobody knows), before the
/// body could run again. A real provider answers this by the downstream key
/// (`idem::current().derive(…)`), or by a lookup of its own.
async fn already_charged(
    order_id: &String,
    amount_cents: &u64,
) -> Result<Option<Charged>, LedgerError> {
    let ledger = match std::fs::read_to_string(ledger()) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(LedgerError(e.to_string())),
    };
    Ok(ledger
        .lines()
        .any(|line| line == order_id)
        .then(|| Charged {
            order_id: order_id.clone(),
            amount_cents: *amount_cents,
        }))
}

/// The charge: keyed by the invocation and the step it runs in, kept 8 days; a call that died
/// inside it is reconciled against the ledger; its lease (renewed while it runs) lapses 2 s after
/// its process died.
#[idempotent(
    key = "run_id, step_id",
    mutating,
    name = "restate.charge",
    ttl = "8d",
    lease = "2s",
    check = already_charged
)]
async fn charge(order_id: String, amount_cents: u64) -> Result<Charged, LedgerError> {
    append_to_ledger(&order_id)?;
    maybe_crash(&order_id, "inside");
    Ok(Charged {
        order_id,
        amount_cents,
    })
}

struct Payments;

#[restate_sdk::service]
impl Payments {
    /// Charges the order once, however many times Restate runs the action.
    #[handler]
    async fn pay(&self, ctx: Context<'_>, order: Json<Order>) -> HandlerResult<Json<Charged>> {
        let Order {
            order_id,
            amount_cents,
        } = order.into_inner();
        let steps = Steps::new(&ctx)?;
        let action = steps.action("charge", move || async move {
            maybe_crash(&order_id, "before");
            let answer = answer(charge(order_id.clone(), amount_cents).await);
            maybe_crash(&order_id, "after");
            answer.map(Json)
        })?;
        Ok(ctx.run(action).name("charge").await?)
    }

    /// The same without idem: Restate alone, at least once.
    #[handler]
    async fn pay_bare(&self, ctx: Context<'_>, order: Json<Order>) -> HandlerResult<Json<Charged>> {
        let Order {
            order_id,
            amount_cents,
        } = order.into_inner();
        let charged = ctx
            .run(move || async move {
                maybe_crash(&order_id, "before");
                append_to_ledger(&order_id)?;
                maybe_crash(&order_id, "inside");
                maybe_crash(&order_id, "after");
                Ok(Json(Charged {
                    order_id,
                    amount_cents,
                }))
            })
            .name("charge")
            .await?;
        Ok(charged)
    }
}

async fn serve(port: u16) {
    let url = std::env::var("IDEM_STORE_URL").expect("IDEM_STORE_URL names the idem store");
    let idem = idem::Idem::builder()
        .resume_window(std::time::Duration::from_secs(7 * 24 * 3600))
        .open(&url)
        .await
        .expect("the idem store opens");
    let audit = idem::audit(&idem).await;
    assert!(audit.is_ok(), "{audit}");
    idem.install("restate-payments");
    HttpServer::new(Endpoint::builder().bind(Payments).build())
        .listen_and_serve(([127, 0, 0, 1], port).into())
        .await;
}

/// The demonstration: a server, this program as its service, one order each way.
async fn demonstrate() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let server = restate::Restate::start().map_err(|e| format!("no Restate server: {e}"))?;
    let ledger = dir.path().join("ledger.txt");
    let crash_dir = dir.path().join("crashes");
    std::fs::create_dir_all(&crash_dir).map_err(|e| e.to_string())?;
    let program = std::env::current_exe().map_err(|e| e.to_string())?;
    let env = vec![
        (
            "IDEM_STORE_URL".to_owned(),
            format!("sqlite://{}", dir.path().join("idem.db").display()),
        ),
        ("LEDGER".to_owned(), ledger.display().to_string()),
        ("CRASH_DIR".to_owned(), crash_dir.display().to_string()),
        // Killed at every point not marked as done: below, only after the charge.
        ("CRASH_PERCENT".to_owned(), "100".to_owned()),
    ];
    let service = restate::Service::start(&program, env);
    server.register(service.port()).await?;
    println!(
        "Restate at 127.0.0.1:{}, the service at 127.0.0.1:{}",
        server.ingress(),
        service.port()
    );
    for (handler, order) in [("pay", "order-idem"), ("pay_bare", "order-bare")] {
        std::fs::write(crash_dir.join(format!("{order}.before")), "")
            .and_then(|()| std::fs::write(crash_dir.join(format!("{order}.inside")), ""))
            .map_err(|e| e.to_string())?;
        let body = serde_json::json!({"order_id": order, "amount_cents": 500});
        let killed = service.restarts();
        let answer = server.call("Payments", handler, &body).await?;
        let charges = std::fs::read_to_string(&ledger)
            .unwrap_or_default()
            .lines()
            .filter(|line| *line == order)
            .count();
        println!(
            "{handler:<9} {order}: answered {answer}; the service was killed {} time(s); \
             the ledger charged it {charges} time(s)",
            service.restarts() - killed
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => {
            let port = args
                .get(2)
                .and_then(|p| p.parse().ok())
                .expect("usage: restate_payment serve PORT");
            serve(port).await;
        }
        _ => {
            if let Err(e) = demonstrate().await {
                eprintln!("restate_payment: {e}");
                std::process::exit(1);
            }
        }
    }
}
