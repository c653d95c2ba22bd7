//! An agent's payment tool calling the payments service over HTTP, safe to retry at both ends.
//!
//! ```text
//! cargo run -p idem-integration --example payments_agent -- [--server http://127.0.0.1:4242]
//! ```
//!
//! Without `--server` it starts the `payments_server` example in-process, with a provider
//! slower than the client's timeout, so the retries are visible. The tool is keyed by the
//! agent's run and step; inside it, the idem client sends the provider a key derived from the
//! tool's own key: a retry of the HTTP request, and a re-execution of the tool after a crash,
//! both reach the provider with the same `Idempotency-Key`.

#[allow(dead_code)]
#[path = "payments_server.rs"]
mod payments_server;

use std::time::Duration;

use idem::http::client::{IdemClient, RetryPolicy};
use idem::{Idem, idempotent};
use serde::{Deserialize, Serialize};

/// What the tool answers the model.
#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    intent: String,
    amount_cents: u64,
    http_attempts: u32,
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the payments service refused the charge ({0})")]
    Refused(u16),
    #[error("the payments service could not be reached")]
    Unreachable(#[from] idem::http::client::ClientError),
    #[error("the payments service answered something unreadable")]
    Unreadable(#[from] reqwest::Error),
}

fn client() -> IdemClient {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("a client");
    IdemClient::new(http).retry_policy(RetryPolicy {
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(500),
        ..RetryPolicy::default()
    })
}

#[idempotent(
    key = "run_id, step_id",
    mutating,
    name = "agent.charge",
    skip = "server"
)]
async fn charge(
    run_id: String,
    step_id: String,
    server: String,
    customer: String,
    amount_cents: u64,
) -> Result<Charge, ChargeError> {
    let answer = client()
        .post(format!("{server}/v1/payment_intents"))
        .derive("payments")
        .header("authorization", "Bearer sk_test_agent")
        .form(&[
            ("amount", amount_cents.to_string()),
            ("currency", "eur".to_owned()),
            ("customer", customer),
        ])
        .send()
        .await?;
    let attempts = answer.attempts();
    if !answer.status().is_success() {
        return Err(ChargeError::Refused(answer.status().as_u16()));
    }
    let intent: payments_server::PaymentIntent = answer.into_response().json().await?;
    Ok(Charge {
        intent: intent.id,
        amount_cents: intent.amount,
        http_attempts: attempts,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let server = match (args.next().as_deref(), args.next()) {
        (Some("--server"), Some(url)) => url,
        (None, _) => {
            let idem = Idem::open("memory://").await?;
            let payments = payments_server::Payments::new(Duration::from_millis(500));
            let errors = idem::http::server::ErrorBody::Stripe;
            let (addr, _) =
                payments_server::serve(idem, payments, "127.0.0.1:0".parse()?, errors).await?;
            println!("started the payments service on http://{addr} (each charge takes 500 ms)");
            format!("http://{addr}")
        }
        _ => return Err("usage: payments_agent [--server URL]".into()),
    };

    let idem = Idem::open("memory://").await?;
    let agent = idem.scope("agent-7");
    for attempt in 1..=3 {
        let call = charge(
            "run-9".into(),
            "step-3".into(),
            server.clone(),
            "cus_42".into(),
            1250,
        );
        let out = agent.run(call).await?;
        println!("tool call {attempt}: {}", serde_json::to_string(&out)?);
    }
    let ledger: serde_json::Value = reqwest::get(format!("{server}/v1/payment_intents"))
        .await?
        .json()
        .await?;
    let charges = ledger["data"].as_array().map_or(0, Vec::len);
    println!("the payments service made {charges} charge(s)");
    if charges != 1 {
        return Err("the intent was charged more than once".into());
    }
    println!("Retrying is a fact; charging twice is not.");
    Ok(())
}
