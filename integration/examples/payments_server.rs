//! A small payments service, Stripe-compatible enough that Stripe's own client libraries can be
//! pointed at it, made safe to retry by `idem`'s `Idempotency-Key` layer.
//!
//! ```text
//! cargo run -p idem-integration --example payments_server -- [--store URL] [--addr HOST:PORT] [--latency-ms N]
//! ```
//!
//! - `POST /v1/payment_intents` (form: `amount`, `currency`, `customer`, `metadata[…]`) creates
//!   one payment intent, that is one charge; it needs an `Idempotency-Key`.
//! - `GET /v1/payment_intents/{id}` and `GET /v1/payment_intents?limit=N` (newest first): the
//!   list is the ledger of every charge made.
//! - Stripe's JSON shapes (`"object": "payment_intent"`, `pi_…` ids) and error envelope
//!   (`{"error": {"type", "code", "message", "param"}}`) for the service's own errors; the
//!   layer's errors are `application/problem+json`, and its policy is served at
//!   `GET /idempotency-policy`.
//! - The customer `cus_fail` makes the provider fail after charging: a 500 that ran, which the
//!   layer stores and replays. `--latency-ms` makes each charge slow, as a real provider can be.
//!
//! The store defaults to a SQLite file, `payments-idem.db`. The ledger lives in memory.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Form, Json, Router};
use idem::Idem;
use idem::http::server::{ErrorBody, IdempotencyLayer};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One payment intent, as Stripe shapes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PaymentIntent {
    /// `pi_…`.
    pub id: String,
    /// Always `payment_intent`.
    pub object: String,
    /// In the currency's smallest unit.
    pub amount: u64,
    /// Three lowercase letters.
    pub currency: String,
    /// The customer charged, if given.
    pub customer: Option<String>,
    /// The `metadata[…]` fields of the request.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// `succeeded`.
    pub status: String,
    /// Unix seconds.
    pub created: u64,
    /// Always false here.
    pub livemode: bool,
}

/// The service: the charges made (the ledger) and how slow the provider is.
#[derive(Clone, Default)]
pub struct Payments {
    ledger: Arc<Mutex<Vec<PaymentIntent>>>,
    latency: Duration,
}

impl Payments {
    /// A service whose every charge takes `latency`.
    pub fn new(latency: Duration) -> Self {
        Payments {
            ledger: Arc::default(),
            latency,
        }
    }

    /// Every charge made, oldest first.
    pub fn charges(&self) -> Vec<PaymentIntent> {
        self.ledger.lock().unwrap().clone()
    }
}

/// Stripe's error envelope.
fn stripe_error(
    status: StatusCode,
    kind: &str,
    code: &str,
    message: &str,
    param: Option<&str>,
) -> Response {
    let mut error = json!({ "type": kind, "code": code, "message": message });
    if let Some(param) = param {
        error["param"] = json!(param);
    }
    (status, Json(json!({ "error": error }))).into_response()
}

fn missing(param: &str) -> Response {
    stripe_error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "parameter_missing",
        &format!("Missing required param: {param}."),
        Some(param),
    )
}

async fn create(
    State(payments): State<Payments>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let Some(amount) = field("amount") else {
        return missing("amount");
    };
    let Ok(amount) = amount.parse::<u64>() else {
        return stripe_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "parameter_invalid_integer",
            "Invalid integer: amount.",
            Some("amount"),
        );
    };
    let Some(currency) = field("currency") else {
        return missing("currency");
    };
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_lowercase()) {
        return stripe_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "parameter_invalid",
            "Invalid currency: use a three-letter ISO code in lowercase.",
            Some("currency"),
        );
    }
    let metadata = fields
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("metadata[")?.strip_suffix(']')?;
            Some((name.to_owned(), json!(v)))
        })
        .collect();
    let customer = field("customer").map(str::to_owned);

    // The charge itself: slow, as providers are, then written to the ledger.
    tokio::time::sleep(payments.latency).await;
    let intent = PaymentIntent {
        id: format!("pi_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]),
        object: "payment_intent".into(),
        amount,
        currency: currency.to_owned(),
        customer: customer.clone(),
        metadata,
        status: "succeeded".into(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        livemode: false,
    };
    payments.ledger.lock().unwrap().push(intent.clone());
    if customer.as_deref() == Some("cus_fail") {
        // The provider charged, then failed to answer: a 500 that ran.
        return stripe_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "provider_unavailable",
            "The payment provider failed after accepting the charge.",
            None,
        );
    }
    Json(intent).into_response()
}

async fn retrieve(State(payments): State<Payments>, Path(id): Path<String>) -> Response {
    match payments.charges().into_iter().find(|i| i.id == id) {
        Some(intent) => Json(intent).into_response(),
        None => stripe_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "resource_missing",
            &format!("No such payment_intent: '{id}'"),
            Some("id"),
        ),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

async fn list(State(payments): State<Payments>, Query(query): Query<ListQuery>) -> Response {
    let limit = query.limit.unwrap_or(10).clamp(1, 100);
    let all = payments.charges();
    let data: Vec<_> = all.iter().rev().take(limit).cloned().collect();
    Json(json!({
        "object": "list",
        "url": "/v1/payment_intents",
        "has_more": all.len() > limit,
        "data": data,
    }))
    .into_response()
}

/// The service's routes behind the idempotency layer, whose own errors are written as `errors`
/// says (the example's `main` answers in Stripe's envelope, as Stripe's SDKs expect).
pub fn app(idem: Idem, payments: Payments, errors: ErrorBody) -> Router {
    Router::new()
        .route("/v1/payment_intents", get(list).post(create))
        .route("/v1/payment_intents/{id}", get(retrieve))
        .with_state(payments)
        .layer(
            IdempotencyLayer::new(idem)
                .max_body(64 * 1024)
                .error_body(errors),
        )
}

/// Serves `app` on `addr` until the process ends; returns the address bound.
pub async fn serve(
    idem: Idem,
    payments: Payments,
    addr: SocketAddr,
    errors: ErrorBody,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let server = tokio::spawn(async move {
        axum::serve(listener, app(idem, payments, errors))
            .await
            .expect("serve");
    });
    Ok((bound, server))
}

struct Args {
    store: String,
    addr: SocketAddr,
    latency: Duration,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        store: "sqlite://payments-idem.db".into(),
        addr: "127.0.0.1:4242".parse().expect("a valid address"),
        latency: Duration::ZERO,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => args.store = value()?,
            "--addr" => {
                args.addr = value()?
                    .parse()
                    .map_err(|e| format!("--addr: {e} (expected HOST:PORT)"))?
            }
            "--latency-ms" => {
                let ms: u64 = value()?.parse().map_err(|e| format!("--latency-ms: {e}"))?;
                args.latency = Duration::from_millis(ms);
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}`; expected --store, --addr, --latency-ms"
                ));
            }
        }
    }
    Ok(args)
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args().map_err(|e| {
        eprintln!("payments_server: {e}");
        std::process::exit(2)
    })?;
    let idem = Idem::open(&args.store).await?;
    let payments = Payments::new(args.latency);
    let (addr, server) = serve(idem, payments, args.addr, ErrorBody::Stripe).await?;
    println!("payments server on http://{addr} (store: {})", args.store);
    println!("policy: http://{addr}/idempotency-policy");
    server.await?;
    Ok(())
}
