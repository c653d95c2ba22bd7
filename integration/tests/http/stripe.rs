//! Stripe's own (unmodified) Python SDK against the payments example, and Stripe's error
//! envelope.

use super::*;

/// Whether the Stripe Python SDK can run here (else the SDK test is skipped, or fails in CI).
fn stripe_sdk() -> bool {
    python::can_import("stripe", None, "pip install stripe==16.1.0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripes_own_sdk_retrying_on_its_own_creates_one_intent_per_call() {
    if !stripe_sdk() {
        return;
    }
    // Each charge takes 1.2 s; the SDK gives up on a request after 0.15 s and retries it with
    // its own key: timeouts, then 409 while the first request runs, then the replay.
    let server = Server::start_stripe(Duration::from_millis(1200)).await;
    let calls = stripe_sdk_run(&["create", &server.url(""), "3", "0.15"]).await;
    assert_eq!(calls.len(), 3);
    let charges = server.charges();
    assert_eq!(charges.len(), 3, "one intent per create call: {calls:?}");
    for (call, charge) in calls.iter().zip(&charges) {
        assert_eq!(
            call["id"],
            charge.id.as_str(),
            "the SDK got the intent that was made"
        );
        assert_eq!(call["amount"], charge.amount);
        assert!(
            call["requests"].as_u64().unwrap() >= 2,
            "the SDK retried: {call}"
        );
    }
}

/// Runs the Stripe SDK script with `args` and reads its JSON lines.
async fn stripe_sdk_run(args: &[&str]) -> Vec<serde_json::Value> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/stripe_sdk/create_intents.py"
    );
    let output = tokio::process::Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// In Stripe's error envelope, a reused key is what Stripe's SDK calls an `IdempotencyError`
/// (not a generic "invalid response" `APIError`), and nothing is charged for it.
#[tokio::test]
async fn stripes_own_sdk_raises_its_idempotency_error_for_a_reused_key() {
    if !stripe_sdk() {
        return;
    }
    let server = Server::start_stripe(Duration::ZERO).await;
    let lines = stripe_sdk_run(&["reuse", &server.url("")]).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1]["raised"], "IdempotencyError", "{lines:?}");
    assert_eq!(lines[1]["status"], 400, "{lines:?}");
    assert_eq!(server.charges().len(), 1);
    assert_eq!(lines[0]["id"], server.charges()[0].id.as_str());
}

/// The same request again while the first still runs: the SDK gets 409 in Stripe's envelope,
/// retries it as Stripe's SDKs retry conflicts, and gets the first request's intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripes_own_sdk_retries_a_409_in_flight_and_gets_the_replay() {
    if !stripe_sdk() {
        return;
    }
    let server = Server::start_stripe(Duration::from_millis(1500)).await;
    let lines = stripe_sdk_run(&["concurrent", &server.url("")]).await;
    let answer = &lines[0];
    assert_eq!(answer["first"], answer["second"], "{answer}");
    let statuses: Vec<u64> = answer["second_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(statuses.first(), Some(&409), "{answer}");
    assert_eq!(statuses.last(), Some(&200), "{answer}");
    assert_eq!(server.charges().len(), 1);
}

/// Stripe's envelope for the layer's own errors: the type, the status and the content type a
/// Stripe client expects.
#[tokio::test]
async fn the_stripe_error_body_has_stripes_shape_and_statuses() {
    let server = Server::start_stripe(Duration::ZERO).await;
    let key = key();
    assert_eq!(
        server
            .create(Some(&key), 500, "u")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let reused = server.create(Some(&key), 600, "u").send().await.unwrap();
    assert_eq!(reused.status(), 400);
    assert_eq!(reused.headers()["content-type"], "application/json");
    let body: serde_json::Value = reused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "idempotency_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("another"),
        "{body}"
    );
    let missing = server.create(None, 500, "u").send().await.unwrap();
    assert_eq!(missing.status(), 400);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(server.charges().len(), 1);
}
