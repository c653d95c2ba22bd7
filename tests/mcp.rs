//! The MCP example, driven by rmcp's own client over stdio: the example binary is spawned, its
//! tools listed and called as a model's host would.

use std::path::{Path, PathBuf};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

/// `target/debug/examples/mcp_server`: `cargo test` builds the examples beside the tests.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .join("examples/mcp_server");
    assert!(
        binary.exists(),
        "{} is missing: `cargo test` builds the examples",
        binary.display()
    );
    binary
}

fn arguments(value: Value) -> serde_json::Map<String, Value> {
    value.as_object().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_over_stdio_sees_replays_mismatches_and_honest_tools() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let mut command = tokio::process::Command::new(example());
    command.args(["--store", &store]);
    let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();

    let tools = client.list_all_tools().await.unwrap();
    let tool = |name: &str| tools.iter().find(|t| t.name == name).unwrap().clone();
    let pay = tool("register_payment");
    let description = pay.description.clone().unwrap_or_default();
    assert!(description.contains("Charges a customer"), "{description}");
    assert!(description.contains("idempotency_key"), "{description}");
    assert!(description.contains("replayed: true"), "{description}");
    assert!(description.contains("may be omitted"), "{description}");
    let annotations = pay.annotations.clone().unwrap();
    assert_eq!(annotations.idempotent_hint, Some(true));
    assert_eq!(annotations.destructive_hint, Some(false));
    assert_eq!(annotations.read_only_hint, Some(false));
    let schema = serde_json::to_string(&pay.input_schema).unwrap();
    assert!(
        schema.contains("idempotency_key") && schema.contains("amount_cents"),
        "{schema}"
    );
    assert!(
        tool("assign_shift")
            .description
            .unwrap_or_default()
            .contains("already done")
    );
    assert!(
        tool("set_status")
            .description
            .unwrap_or_default()
            .contains("Safe to retry")
    );
    assert_eq!(
        tool("list_charges").annotations.unwrap().read_only_hint,
        Some(true)
    );

    let call = |name: &'static str, args: Value| {
        let client = &client;
        async move {
            client
                .call_tool(CallToolRequestParams::new(name).with_arguments(arguments(args)))
                .await
                .unwrap()
        }
    };
    let charge = json!({
        "customer": "cus_42", "amount_cents": 500, "currency": "eur", "idempotency_key": "pay-r9-s3"
    });
    let first = call("register_payment", charge.clone()).await;
    let first = first.structured_content.unwrap();
    assert_eq!(first["status"], "ok");
    assert_eq!(first["replayed"], false);
    let second = call("register_payment", charge.clone()).await;
    assert_eq!(second.is_error, Some(false));
    let second = second.structured_content.unwrap();
    assert_eq!(second["replayed"], true, "{second}");
    assert_eq!(
        second["value"], first["value"],
        "the first charge, replayed"
    );

    let mut other = charge.clone();
    other["amount_cents"] = json!(900);
    let mismatch = call("register_payment", other).await;
    assert_eq!(mismatch.is_error, Some(true));
    let mismatch = mismatch.structured_content.unwrap();
    assert_eq!(mismatch["status"], "mismatch");
    assert!(
        !mismatch.to_string().contains("pay-r9-s3"),
        "no key in {mismatch}"
    );

    let charges = call("list_charges", json!({})).await;
    let text = serde_json::to_value(&charges.content).unwrap().to_string();
    assert_eq!(text.matches("pay_").count(), 1, "one charge: {text}");

    let shift = json!({"crewmate": "ana", "shift": "night"});
    let assigned = call("assign_shift", shift.clone())
        .await
        .structured_content
        .unwrap();
    assert_eq!(assigned["value"]["already_assigned"], false);
    let again = call("assign_shift", shift)
        .await
        .structured_content
        .unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(again["value"]["already_assigned"], true);

    let status = json!({"entity": "order-7", "status": "shipped"});
    for _ in 0..2 {
        let out = call("set_status", status.clone())
            .await
            .structured_content
            .unwrap();
        assert_eq!(out["status"], "ok");
    }
    client.cancel().await.unwrap();
}
