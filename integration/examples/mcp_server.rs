//! An MCP server (rmcp, over stdio) whose three tools show the three forms side by side:
//!
//! - `register_payment` (keyed by the optional `idempotency_key`): charges once per key; a retry
//!   answers the first charge with `replayed: true`;
//! - `assign_shift` (state check): asks the roster first and answers `already_assigned`;
//! - `set_status` (natural): safe to repeat as it is;
//!
//! plus `charge_run_step`, keyed by the run and step ids the host sends in the request's `_meta`
//! (the model never sees the key), `refund`, keyed by the idempotency key the host sends in
//! `_meta` (`idempotencyKey` or `idempotency_key`), `export_ledger`, a streaming tool that reports its progress
//! (`notifications/progress`, one a row, paced by `--latency`; a retried export receives the
//! same notifications again, then the first export's result), and a read-only `list_charges`,
//! the ledger. Every answer is structured content with `status` (`ok`, `in_flight`,
//! `mismatch`, …) and `replayed`.
//!
//! A call that comes again while the first still runs (the host timed out and retried, two
//! sessions sent the same step) waits for the first, up to 10 s (`IdemBuilder::wait`), and
//! answers its result with `replayed: true` instead of `in_flight`.
//!
//! ```text
//! cargo run -p idem-integration --example mcp_server -- [--store URL] [--http ADDR] [--metrics ADDR] [--latency MS]
//! ```
//!
//! - `--store URL`: the idem store (default `sqlite://mcp-idem.db`);
//! - `--latency MS`: how long the payment provider takes to charge (default 0);
//! - `--http ADDR`: serve MCP over streamable HTTP at `http://ADDR/mcp` instead of stdio;
//! - `--metrics ADDR`: serve idem's metrics (`idem_calls_total{tool, outcome}`, …) for Prometheus
//!   at `http://ADDR/metrics`.
//!
//! With a port 0 the system picks one; the addresses are printed on stderr.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::mcp::{MetaKeys, Progress, ProgressNote};
use idem::{Emitter, Idem, Outcome, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments of `register_payment`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct PaymentRequest {
    /// The customer to charge.
    customer: String,
    /// The amount, in the currency's smallest unit.
    amount_cents: u64,
    /// Three lowercase letters.
    currency: String,
    /// Names this payment: the same key on every retry of it, a new key for a new payment.
    idempotency_key: Option<String>,
}

/// A charge.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    id: String,
    customer: String,
    amount_cents: u64,
    currency: String,
}

/// Arguments of `charge_run_step`: no key among them, the host sends it in `_meta`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct StepCharge {
    /// The customer to charge.
    customer: String,
    /// The amount, in the currency's smallest unit.
    amount_cents: u64,
    /// Three lowercase letters.
    currency: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct ShiftRequest {
    /// Who.
    crewmate: String,
    /// Which shift.
    shift: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Assignment {
    ok: bool,
    already_assigned: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct StatusRequest {
    /// The entity.
    entity: String,
    /// Its new status.
    status: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ToolError(String);

/// Arguments of `refund`: no key among them, the host sends it in `_meta`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct RefundRequest {
    /// The charge to refund.
    charge: String,
    /// How much of it, in the currency's smallest unit.
    amount_cents: u64,
}

/// A refund.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Refund {
    id: String,
    charge: String,
    amount_cents: u64,
}

/// Arguments of `export_ledger`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct ExportRequest {
    /// How many rows to export (1 to 10,000).
    rows: u32,
    /// Names this export: the same key on every retry of it.
    idempotency_key: String,
}

/// What an export answers.
#[derive(Debug, Serialize, Deserialize)]
struct Export {
    /// The rows exported.
    rows: u32,
    /// Which export of this server's life it was (1, 2, …): a replay answers the first's.
    export: usize,
}

/// The exports this server ran.
static EXPORTS: AtomicUsize = AtomicUsize::new(0);

/// Exports `rows` rows, one progress note a row, `pace_ms` apart: each note is recorded under
/// the key before the client gets it, and a retry replays them.
#[idempotent(
    key = "idempotency_key",
    mutating,
    skip = "pace_ms",
    name = "mcp.export_ledger"
)]
async fn export(
    idempotency_key: String,
    rows: u32,
    pace_ms: u64,
    out: Emitter<ProgressNote>,
) -> Result<Export, ToolError> {
    if !(1..=10_000).contains(&rows) {
        return Err(ToolError(format!("rows must be 1 to 10,000, not {rows}")));
    }
    let export = EXPORTS.fetch_add(1, Ordering::SeqCst) + 1;
    for row in 1..=rows {
        tokio::time::sleep(Duration::from_millis(pace_ms)).await;
        let note = ProgressNote::new(f64::from(row))
            .total(f64::from(rows))
            .message(format!("exported row {row} of {rows}"));
        out.emit(note).await;
    }
    Ok(Export { rows, export })
}

/// The server: its ledger, its roster and its statuses.
#[derive(Clone)]
struct Crew {
    /// How long the provider takes to charge.
    latency: Duration,
    ledger: Arc<Mutex<Vec<Payment>>>,
    roster: Arc<Mutex<BTreeSet<(String, String)>>>,
    statuses: Arc<Mutex<BTreeMap<String, String>>>,
    refunds: Arc<Mutex<Vec<Refund>>>,
}

impl Crew {
    /// The state check of `assign_shift`: is the crewmate already on the shift?
    async fn already_assigned(
        &self,
        params: &Parameters<ShiftRequest>,
    ) -> Result<Option<Assignment>, ToolError> {
        let key = (params.0.crewmate.clone(), params.0.shift.clone());
        Ok(self
            .roster
            .lock()
            .unwrap()
            .contains(&key)
            .then_some(Assignment {
                ok: true,
                already_assigned: true,
            }))
    }
}

impl Crew {
    /// The provider's side effect: one line in the ledger, after its latency.
    async fn charge(&self, customer: String, amount_cents: u64, currency: String) -> Payment {
        tokio::time::sleep(self.latency).await;
        let mut ledger = self.ledger.lock().unwrap();
        let payment = Payment {
            id: format!("pay_{}", ledger.len() + 1),
            customer,
            amount_cents,
            currency,
        };
        ledger.push(payment.clone());
        payment
    }
}

#[tool_router]
impl Crew {
    fn new(latency: Duration) -> Self {
        Crew {
            latency,
            ledger: Arc::default(),
            roster: Arc::default(),
            statuses: Arc::default(),
            refunds: Arc::default(),
        }
    }

    /// Charges a customer.
    #[idempotent(
        key = "params.0.idempotency_key",
        mutating,
        name = "mcp.register_payment"
    )]
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn register_payment(
        &self,
        params: Parameters<PaymentRequest>,
    ) -> Result<Payment, ToolError> {
        let p = params.0;
        if p.amount_cents == 0 {
            return Err(ToolError("the amount must be positive".into()));
        }
        Ok(self.charge(p.customer, p.amount_cents, p.currency).await)
    }

    /// Charges a customer for one step of an agent run.
    #[idempotent(
        key = "meta.run_id, meta.step_id",
        mutating,
        required,
        name = "mcp.charge_run_step"
    )]
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn charge_run_step(
        &self,
        params: Parameters<StepCharge>,
        meta: MetaKeys,
    ) -> Result<Payment, ToolError> {
        // The run and step only name the call; the charge is the arguments'.
        let _ = meta;
        let p = params.0;
        Ok(self.charge(p.customer, p.amount_cents, p.currency).await)
    }

    /// Refunds part of a charge, once per idempotency key the host sends in `_meta`
    /// (`idempotencyKey` or `idempotency_key`).
    #[idempotent(key = "meta.idempotency_key", mutating, required, name = "mcp.refund")]
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn refund(
        &self,
        params: Parameters<RefundRequest>,
        meta: MetaKeys,
    ) -> Result<Refund, ToolError> {
        let _ = meta;
        let p = params.0;
        let mut refunds = self.refunds.lock().unwrap();
        let refund = Refund {
            id: format!("re_{}", refunds.len() + 1),
            charge: p.charge,
            amount_cents: p.amount_cents,
        };
        refunds.push(refund.clone());
        Ok(refund)
    }

    /// Puts a crewmate on a shift.
    #[idempotent(mutating, check = Self::already_assigned, name = "mcp.assign_shift")]
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn assign_shift(
        &self,
        params: Parameters<ShiftRequest>,
    ) -> Result<Assignment, ToolError> {
        let key = (params.0.crewmate, params.0.shift);
        self.roster.lock().unwrap().insert(key);
        Ok(Assignment {
            ok: true,
            already_assigned: false,
        })
    }

    /// Sets the status of an entity.
    #[idempotent(natural, name = "mcp.set_status")]
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn set_status(&self, params: Parameters<StatusRequest>) -> Result<String, ToolError> {
        let p = params.0;
        self.statuses
            .lock()
            .unwrap()
            .insert(p.entity.clone(), p.status.clone());
        Ok(format!("{} is {}", p.entity, p.status))
    }

    /// Exports the ledger row by row, reporting progress (send a `progressToken` in `_meta`).
    /// Retrying with the same idempotency_key replays the export's progress and its result;
    /// nothing is exported twice.
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn export_ledger(
        &self,
        params: Parameters<ExportRequest>,
        progress: Progress,
    ) -> Result<Outcome<Export>, idem::Error<ToolError>> {
        let p = params.0;
        let pace_ms = self.latency.as_millis() as u64;
        progress
            .relay(export(p.idempotency_key, p.rows, pace_ms).await)
            .await
    }

    /// Every charge made, oldest first.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_charges(&self) -> String {
        serde_json::to_string(&*self.ledger.lock().unwrap()).unwrap_or_default()
    }
}

#[tool_handler]
impl ServerHandler for Crew {
    /// The tools, and idem's idempotency advertised in the experimental capabilities.
    fn get_info(&self) -> rmcp::model::ServerConfig {
        let capabilities = rmcp::model::ServerCapabilities::builder()
            .enable_tools()
            .build();
        rmcp::model::ServerConfig::new(idem::mcp::advertise(capabilities))
            .with_server_info(rmcp::model::Implementation::from_build_env())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut store, mut http, mut metrics) = ("sqlite://mcp-idem.db".to_owned(), None, None);
    let mut latency = Duration::ZERO;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--store", Some(url)) => store = url,
            ("--http", Some(addr)) => http = Some(addr),
            ("--metrics", Some(addr)) => metrics = Some(addr),
            ("--latency", Some(ms)) if ms.parse::<u64>().is_ok() => {
                latency = Duration::from_millis(ms.parse()?);
            }
            _ => {
                eprintln!(
                    "usage: mcp_server [--store URL] [--http ADDR] [--metrics ADDR] [--latency MS]"
                );
                std::process::exit(2);
            }
        }
    }
    if let Some(addr) = metrics {
        serve_metrics(&addr).await?;
    }
    // A call whose key is in flight waits for the first call's result (a host that retried
    // after a timeout gets the charge, not `in_flight`).
    let idem = Idem::builder()
        .wait(Duration::from_secs(10))
        .open(&store)
        .await?;
    // The startup audit (and, with IDEM_REPORT set, the tool report), on stderr: stdout is MCP's.
    let audit = idem::audit(&idem).await;
    eprintln!("mcp_server: {audit}");
    if !audit.is_ok() {
        return Err(audit.to_string().into());
    }
    // Every call of this server runs as the one tenant of its operator.
    idem.install("mcp-server");
    let crew = Crew::new(latency);
    if let Some(addr) = http {
        return serve_http(crew, &addr).await;
    }
    // Over stdio a key sent beside the arguments (`params.idempotencyKey`) is moved into
    // `_meta` before rmcp reads the request, which would drop it.
    let stdio = (
        idem::mcp::lift_keys(tokio::io::stdin()),
        tokio::io::stdout(),
    );
    match crew.serve(stdio).await {
        Ok(server) => {
            server.waiting().await?;
        }
        // Started with no client on its stdin: nothing to serve.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            eprintln!("mcp_server: no MCP client on stdin; run it from an MCP host");
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// MCP over streamable HTTP at `/mcp`: every session shares the one ledger, roster and store.
async fn serve_http(crew: Crew, addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let mcp = StreamableHttpService::new(
        move || Ok(crew.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    // A key sent beside the arguments (`params.idempotencyKey`) is moved into `_meta` before
    // rmcp reads the request, which would drop it.
    let mcp = tower_layer::Layer::layer(&idem::mcp::LiftKeysLayer, mcp);
    let app = axum::Router::new().nest_service("/mcp", mcp);
    eprintln!("mcp_server: streamable HTTP on http://{local}/mcp");
    axum::serve(listener, app).await?;
    Ok(())
}

/// The metrics idem keeps (`idem_calls_total{tool, outcome}`, `idem_body_runs_total{tool}`,
/// `idem_call_duration_seconds{tool, outcome}`),
/// in Prometheus's text format at `/metrics`, from a task of their own.
async fn serve_metrics(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!(
        "mcp_server: Prometheus metrics on http://{}/metrics",
        listener.local_addr()?
    );
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(handle.render())),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(())
}
