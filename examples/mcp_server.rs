//! An MCP server (rmcp, over stdio) whose three tools show the three forms side by side:
//!
//! - `register_payment` (keyed by the optional `idempotency_key`): charges once per key; a retry
//!   answers the first charge with `replayed: true`;
//! - `assign_shift` (state check): asks the roster first and answers `already_assigned`;
//! - `set_status` (natural): safe to repeat as it is;
//!
//! and a read-only `list_charges`, the ledger. Every answer is structured content with `status`
//! (`ok`, `in_flight`, `mismatch`, …) and `replayed`.
//!
//! ```text
//! cargo run --example mcp_server -- [--store URL]     # default: sqlite://mcp-idem.db
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use idem::{Idem, idempotent};
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

/// The server: its ledger, its roster and its statuses.
#[derive(Clone)]
struct Crew {
    ledger: Arc<Mutex<Vec<Payment>>>,
    roster: Arc<Mutex<BTreeSet<(String, String)>>>,
    statuses: Arc<Mutex<BTreeMap<String, String>>>,
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

#[tool_router]
impl Crew {
    fn new() -> Self {
        Crew {
            ledger: Arc::default(),
            roster: Arc::default(),
            statuses: Arc::default(),
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
        let mut ledger = self.ledger.lock().unwrap();
        let payment = Payment {
            id: format!("pay_{}", ledger.len() + 1),
            customer: p.customer,
            amount_cents: p.amount_cents,
            currency: p.currency,
        };
        ledger.push(payment.clone());
        Ok(payment)
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

    /// Every charge made, oldest first.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_charges(&self) -> String {
        serde_json::to_string(&*self.ledger.lock().unwrap()).unwrap_or_default()
    }
}

#[tool_handler]
impl ServerHandler for Crew {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut store = "sqlite://mcp-idem.db".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--store", Some(url)) => store = url,
            _ => {
                eprintln!("usage: mcp_server [--store URL]");
                std::process::exit(2);
            }
        }
    }
    let idem = Idem::open(&store).await?;
    // Every call of this server runs as the one tenant of its operator.
    idem.install("mcp-server");
    match Crew::new().serve(rmcp::transport::stdio()).await {
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
