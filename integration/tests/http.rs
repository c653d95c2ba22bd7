//! The `Idempotency-Key` layer, end to end: the payments example served on a loopback port,
//! driven with reqwest, raw TCP and the idem client. Every test counts charges in the example's
//! ledger.

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/payments_server.rs"]
mod payments_server;
#[path = "common/proxy.rs"]
mod proxy;

use std::net::SocketAddr;
use std::time::Duration;

use idem::Idem;
use idem::http::client::{IdemClient, RetryPolicy};
use idem::http::server::ErrorBody;
use payments_server::{PaymentIntent, Payments, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Server {
    addr: SocketAddr,
    payments: Payments,
    _store: tempfile::TempDir,
}

impl Server {
    /// The payments example behind a layer that answers its errors in problem+json (the
    /// layer's default).
    async fn start(latency: Duration) -> Server {
        Server::start_with(latency, ErrorBody::Problem).await
    }

    /// The payments example as its `main` serves it: errors in Stripe's envelope.
    async fn start_stripe(latency: Duration) -> Server {
        Server::start_with(latency, ErrorBody::Stripe).await
    }

    async fn start_with(latency: Duration, errors: ErrorBody) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("idem.db").display());
        let idem = Idem::builder()
            .lease(Duration::from_secs(10))
            .open(&url)
            .await
            .unwrap();
        let payments = Payments::new(latency);
        let (addr, _) = serve(
            idem,
            payments.clone(),
            "127.0.0.1:0".parse().unwrap(),
            errors,
        )
        .await
        .unwrap();
        Server {
            addr,
            payments,
            _store: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn charges(&self) -> Vec<PaymentIntent> {
        self.payments.charges()
    }

    /// A create request with `key` and `amount`, as `user`.
    fn create(&self, key: Option<&str>, amount: u64, user: &str) -> reqwest::RequestBuilder {
        let mut req = reqwest::Client::new()
            .post(self.url("/v1/payment_intents"))
            .bearer_auth(user)
            .form(&[
                ("amount", amount.to_string()),
                ("currency", "eur".into()),
                ("customer", "cus_42".into()),
                ("metadata[order]", "o-7".into()),
            ]);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        req
    }
}

fn key() -> String {
    format!("key-{}", uuid::Uuid::new_v4())
}

async fn problem(response: reqwest::Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(response.status().as_u16(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(
        response.headers()["link"],
        "</idempotency-policy>; rel=\"describedby\""
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        body["type"],
        format!("/idempotency-policy#{code}"),
        "{body}"
    );
    assert_eq!(body["status"], status);
    body
}

#[tokio::test]
async fn a_retry_is_replayed_byte_for_byte_and_charges_once() {
    let server = Server::start(Duration::ZERO).await;
    let key = key();
    let first = server.create(Some(&key), 500, "sk_a").send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_type = first.headers()["content-type"].clone();
    let first_body = first.bytes().await.unwrap();
    for _ in 0..3 {
        let again = server.create(Some(&key), 500, "sk_a").send().await.unwrap();
        assert_eq!(again.status(), 200);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()["content-type"], first_type);
        assert_eq!(again.bytes().await.unwrap(), first_body, "byte for byte");
    }
    // The same key as a structured-field String is the same key.
    let quoted = server
        .create(Some(&format!("\"{key}\"")), 500, "sk_a")
        .send()
        .await
        .unwrap();
    assert_eq!(quoted.headers()["idempotent-replayed"], "true");
    assert_eq!(server.charges().len(), 1);
    let intent: PaymentIntent = serde_json::from_slice(&first_body).unwrap();
    assert_eq!(intent.object, "payment_intent");
    assert!(intent.id.starts_with("pi_"));
    assert_eq!(intent.metadata["order"], "o-7");
}

#[tokio::test]
async fn another_payload_with_the_same_key_is_422_every_time() {
    let server = Server::start(Duration::ZERO).await;
    let key = key();
    assert_eq!(
        server
            .create(Some(&key), 500, "sk_a")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for _ in 0..2 {
        let other = server.create(Some(&key), 900, "sk_a").send().await.unwrap();
        let body = problem(other, 422, "key-reused").await;
        assert!(!body.to_string().contains(&key), "no key in {body}");
    }
    // The body's field order does not matter, only its content.
    let reordered = reqwest::Client::new()
        .post(server.url("/v1/payment_intents"))
        .bearer_auth("sk_a")
        .header("Idempotency-Key", &key)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("metadata%5Border%5D=o-7&customer=cus_42&currency=eur&amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(reordered.headers()["idempotent-replayed"], "true");
    assert_eq!(server.charges().len(), 1);
}

#[tokio::test]
async fn keys_are_required_and_checked_before_anything_runs() {
    let server = Server::start(Duration::ZERO).await;
    problem(
        server.create(None, 500, "sk_a").send().await.unwrap(),
        400,
        "missing-key",
    )
    .await;
    for bad in ["has space", &"k".repeat(256), "\"unterminated", "\"a\\nb\""] {
        problem(
            server.create(Some(bad), 500, "sk_a").send().await.unwrap(),
            400,
            "malformed-key",
        )
        .await;
    }
    // Raw TCP: an empty key, and the header twice.
    for headers in [
        "Idempotency-Key: \r\n",
        "Idempotency-Key: a\r\nIdempotency-Key: b\r\n",
    ] {
        let response = raw(
            server.addr,
            "POST",
            "/v1/payment_intents",
            headers,
            b"amount=5&currency=eur",
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 400"), "{response}");
        assert!(response.contains("malformed-key"), "{response}");
    }
    assert_eq!(server.charges().len(), 0);
    // GET needs no key.
    let list = reqwest::get(server.url("/v1/payment_intents"))
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    // The policy is published where the problems link.
    let policy = reqwest::get(server.url("/idempotency-policy"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(policy.contains("1 to 255 visible ASCII"), "{policy}");
    assert!(policy.contains("422"), "{policy}");
}

#[tokio::test]
async fn oversized_bodies_are_413_before_anything_is_stored() {
    let server = Server::start(Duration::ZERO).await;
    let key = key();
    let big = format!("amount=5&currency=eur&metadata[pad]={}", "x".repeat(70_000));
    let response = reqwest::Client::new()
        .post(server.url("/v1/payment_intents"))
        .header("Idempotency-Key", &key)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    problem(response, 413, "body-too-large").await;
    // Chunked, with no length announced: cut off while reading.
    let chunked = raw_chunked(server.addr, &key, big.as_bytes()).await;
    assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
    // Nothing was stored: the same key with a small body runs.
    let ok = server.create(Some(&key), 5, "anonymous").send().await;
    assert_eq!(ok.unwrap().status(), 200);
    assert_eq!(server.charges().len(), 1);
}

#[tokio::test]
async fn thirty_two_simultaneous_requests_make_one_charge() {
    let server = Server::start(Duration::from_millis(200)).await;
    let key = key();
    let calls = (0..32).map(|_| {
        let req = server.create(Some(&key), 500, "sk_a");
        tokio::spawn(async move { req.send().await.unwrap() })
    });
    let mut statuses = Vec::new();
    for call in calls {
        let response = call.await.unwrap();
        let replayed = response.headers().get("idempotent-replayed").is_some();
        if response.status() == 409 {
            assert!(response.headers().get("retry-after").is_some());
        }
        statuses.push((response.status().as_u16(), replayed));
    }
    assert_eq!(server.charges().len(), 1, "{statuses:?}");
    let fresh = statuses.iter().filter(|s| **s == (200, false)).count();
    assert_eq!(fresh, 1, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| matches!(s, (200, _) | (409, false))),
        "{statuses:?}"
    );
}

#[tokio::test]
async fn a_connection_dropped_mid_request_still_records_the_charge() {
    let server = Server::start(Duration::from_millis(300)).await;
    let key = key();
    // Send the request and hang up before the handler answers.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let body = "amount=500&currency=eur&customer=cus_42&metadata%5Border%5D=o-7";
    let request = format!(
        "POST /v1/payment_intents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_a\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(stream);
    // The retry (with the idem client, which waits out 409) gets the stored response.
    let answer = IdemClient::new(reqwest::Client::new())
        .post(server.url("/v1/payment_intents"))
        .key(&key)
        .header("authorization", "Bearer sk_a")
        .form(&[
            ("amount", "500"),
            ("currency", "eur"),
            ("customer", "cus_42"),
            ("metadata[order]", "o-7"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(
        answer.replayed(),
        "the dropped request's charge is replayed"
    );
    assert_eq!(server.charges().len(), 1);
}

#[tokio::test]
async fn a_handler_slower_than_the_client_timeout_charges_once() {
    let server = Server::start(Duration::from_millis(400)).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let client = IdemClient::new(http).retry_policy(RetryPolicy {
        max_attempts: 20,
        base_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(200),
        budget: Duration::from_secs(10),
    });
    let answer = client
        .post(server.url("/v1/payment_intents"))
        .form(&[("amount", "500"), ("currency", "eur")])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.replayed());
    assert!(answer.attempts() > 1, "{}", answer.attempts());
    let key = answer.key().unwrap().to_owned();
    assert_eq!(server.charges().len(), 1);
    let intent: PaymentIntent = answer.into_response().json().await.unwrap();
    assert_eq!(intent.amount, 500);
    assert!(!key.is_empty());
}

#[tokio::test]
async fn principals_never_see_each_other() {
    let server = Server::start(Duration::ZERO).await;
    let key = key();
    let a = server
        .create(Some(&key), 500, "sk_alice")
        .send()
        .await
        .unwrap();
    let b = server
        .create(Some(&key), 900, "sk_bob")
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(b.status(), 200, "another principal's key is another key");
    assert!(b.headers().get("idempotent-replayed").is_none());
    let b: PaymentIntent = b.json().await.unwrap();
    assert_eq!(b.amount, 900);
    let a_again = server
        .create(Some(&key), 500, "sk_alice")
        .send()
        .await
        .unwrap();
    let a_again: PaymentIntent = a_again.json().await.unwrap();
    assert_eq!(a_again.amount, 500);
    assert_eq!(server.charges().len(), 2);
}

#[tokio::test]
async fn a_500_that_ran_is_replayed_and_a_400_is_not_kept() {
    let server = Server::start(Duration::ZERO).await;
    let key = key();
    let failing = || {
        reqwest::Client::new()
            .post(server.url("/v1/payment_intents"))
            .header("Idempotency-Key", &key)
            .form(&[
                ("amount", "500"),
                ("currency", "eur"),
                ("customer", "cus_fail"),
            ])
    };
    let first = failing().send().await.unwrap();
    assert_eq!(first.status(), 500);
    let first_body = first.bytes().await.unwrap();
    let again = failing().send().await.unwrap();
    assert_eq!(again.status(), 500);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.unwrap(), first_body);
    assert_eq!(server.charges().len(), 1, "the failed charge happened once");

    // A validation error had no effect: not kept, so the corrected retry runs.
    let key = self::key();
    let invalid = reqwest::Client::new()
        .post(server.url("/v1/payment_intents"))
        .header("Idempotency-Key", &key)
        .form(&[("currency", "eur")])
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 400);
    let envelope: serde_json::Value = invalid.json().await.unwrap();
    assert_eq!(envelope["error"]["code"], "parameter_missing");
    let fixed = reqwest::Client::new()
        .post(server.url("/v1/payment_intents"))
        .header("Idempotency-Key", &key)
        .form(&[("amount", "5"), ("currency", "eur")])
        .send()
        .await
        .unwrap();
    assert_eq!(fixed.status(), 200);
    assert!(fixed.headers().get("idempotent-replayed").is_none());
    assert_eq!(server.charges().len(), 2);
}

#[tokio::test]
async fn the_client_never_retries_422_and_reports_replays() {
    let server = Server::start(Duration::ZERO).await;
    let client = IdemClient::new(reqwest::Client::new());
    let key = key();
    let first = client
        .post(server.url("/v1/payment_intents"))
        .key(&key)
        .form(&[("amount", "500"), ("currency", "eur")])
        .send()
        .await
        .unwrap();
    assert_eq!((first.status().as_u16(), first.replayed()), (200, false));
    let reused = client
        .post(server.url("/v1/payment_intents"))
        .key(&key)
        .form(&[("amount", "600"), ("currency", "eur")])
        .send()
        .await
        .unwrap();
    assert_eq!(reused.status(), 422);
    assert_eq!(reused.attempts(), 1, "a 422 is never retried");
    let list = client
        .get(server.url("/v1/payment_intents"))
        .send()
        .await
        .unwrap();
    assert!(list.key().is_none(), "GET carries no key");
    assert_eq!(server.charges().len(), 1);
}

/// Sends one raw HTTP/1.1 request and reads the whole answer.
async fn raw(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends a chunked body and reads the answer (the server may answer before reading it all).
async fn raw_chunked(addr: SocketAddr, key: &str, body: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/payment_intents HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(8192) {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
        if stream.write_all(&framed).await.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the Stripe Python SDK can run here; without it the SDK test is skipped (with
/// `IDEM_REQUIRE_BACKENDS=1`, as in CI, a missing SDK is a failure).
fn stripe_sdk() -> bool {
    let found = std::process::Command::new("python3")
        .args(["-c", "import stripe"])
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert_ne!(
            std::env::var("IDEM_REQUIRE_BACKENDS").as_deref(),
            Ok("1"),
            "the Stripe SDK is required: pip install stripe"
        );
        eprintln!("skipped: `pip install stripe` to drive the server with Stripe's own SDK");
    }
    found
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

/// A router of its own for the rules the payments example does not exercise: how many times
/// each route's handler ran, and what it answers.
mod custom {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::{patch, post};

    pub struct Counted {
        pub addr: std::net::SocketAddr,
        pub runs: Arc<AtomicUsize>,
    }

    impl Counted {
        pub fn runs(&self) -> usize {
            self.runs.load(Ordering::SeqCst)
        }
    }

    /// `/flaky` answers 429, then 503, then 201; `/thing` (PATCH, PUT, DELETE) answers 200;
    /// `/json` answers 201. Every run is counted.
    pub async fn start(layer: idem::http::server::IdempotencyLayer) -> Counted {
        let runs = Arc::new(AtomicUsize::new(0));
        let (r1, r2, r3) = (runs.clone(), runs.clone(), runs.clone());
        let app = Router::new()
            .route(
                "/flaky",
                post(move || {
                    let n = r1.fetch_add(1, Ordering::SeqCst);
                    async move {
                        match n {
                            0 => (StatusCode::TOO_MANY_REQUESTS, "slow down"),
                            1 => (StatusCode::SERVICE_UNAVAILABLE, "try later"),
                            _ => (StatusCode::CREATED, "made"),
                        }
                    }
                }),
            )
            .route(
                "/thing",
                patch(move || {
                    r2.fetch_add(1, Ordering::SeqCst);
                    async { "patched" }
                })
                .put(|| async { "put" })
                .delete(|| async { "deleted" }),
            )
            .route(
                "/json",
                post(move || {
                    r3.fetch_add(1, Ordering::SeqCst);
                    async { (StatusCode::CREATED, "made") }
                }),
            )
            .layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Counted { addr, runs }
    }
}

async fn memory_layer() -> idem::http::server::IdempotencyLayer {
    idem::http::server::IdempotencyLayer::new(Idem::open("memory://").await.unwrap())
}

#[tokio::test]
async fn patch_is_guarded_and_put_delete_pass_through() {
    let server = custom::start(memory_layer().await).await;
    let url = format!("http://{}/thing", server.addr);
    let http = reqwest::Client::new();
    let no_key = http.patch(&url).body("x").send().await.unwrap();
    assert_eq!(no_key.status(), 400);
    assert_eq!(server.runs(), 0);
    for _ in 0..2 {
        let keyed = http
            .patch(&url)
            .header("Idempotency-Key", "patch-1")
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(keyed.status(), 200);
    }
    assert_eq!(server.runs(), 1, "the second PATCH was replayed");
    assert_eq!(http.put(&url).send().await.unwrap().status(), 200);
    assert_eq!(http.delete(&url).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn answers_that_say_nothing_happened_are_not_kept_and_the_client_retries_them() {
    let server = custom::start(memory_layer().await).await;
    let client = IdemClient::new(reqwest::Client::new()).retry_policy(RetryPolicy {
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(50),
        ..RetryPolicy::default()
    });
    // 1: 429, not kept, retried. 2: a 503 that ran, kept, and retried as a 5xx. 3: the replay
    // of that 503, which the client does not retry: a stored answer will not change.
    let answer = client
        .post(format!("http://{}/flaky", server.addr))
        .key("flaky-1")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 503);
    assert!(answer.replayed());
    assert_eq!(answer.attempts(), 3);
    assert_eq!(
        server.runs(),
        2,
        "the handler ran for the 429 and the 503, not again"
    );
}

#[tokio::test]
async fn skipped_fields_do_not_change_the_fingerprint() {
    let layer = memory_layer().await.skip(["meta.trace_id"]);
    let server = custom::start(layer).await;
    let send = |body: serde_json::Value| {
        reqwest::Client::new()
            .post(format!("http://{}/json", server.addr))
            .header("Idempotency-Key", "json-1")
            .json(&body)
            .send()
    };
    let first = send(serde_json::json!({"amount": 5, "meta": {"trace_id": "t1"}}));
    assert_eq!(first.await.unwrap().status(), 201);
    let retried = send(serde_json::json!({"meta": {"trace_id": "t2"}, "amount": 5}))
        .await
        .unwrap();
    assert_eq!(retried.headers()["idempotent-replayed"], "true");
    let changed = send(serde_json::json!({"amount": 6, "meta": {"trace_id": "t1"}}))
        .await
        .unwrap();
    assert_eq!(changed.status(), 422);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn the_client_derives_its_key_from_the_running_tool() {
    use idem::idempotent;

    #[idempotent(key = "run_id", mutating, name = "http.derived", skip = "url")]
    async fn tool(run_id: String, url: String) -> Result<(String, String), String> {
        let expected = idem::current()
            .unwrap()
            .derive("payments")
            .as_str()
            .to_owned();
        let answer = IdemClient::new(reqwest::Client::new())
            .post(url)
            .derive("payments")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        Ok((answer.key().unwrap().to_owned(), expected))
    }

    let server = custom::start(memory_layer().await).await;
    let idem = Idem::open("memory://").await.unwrap();
    let out = idem
        .scope("t")
        .run(tool("run-1".into(), format!("http://{}/json", server.addr)))
        .await
        .unwrap();
    let (sent, expected) = out.into_value().unwrap();
    assert_eq!(sent, expected, "the tool's derived key went on the wire");
    assert_eq!(sent.len(), 64);
}

#[tokio::test]
async fn the_client_gives_up_on_an_unreachable_server_after_its_attempts() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = IdemClient::new(reqwest::Client::new()).retry_policy(RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        budget: Duration::from_secs(10),
    });
    let err = client
        .post(format!("http://{addr}/v1/payment_intents"))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            idem::http::client::ClientError::Transport { attempts: 3, .. }
        ),
        "{err:?}"
    );
}

/// A server (no idem layer) whose first answer is 429 with a chosen `Retry-After`, then 201;
/// it notes when each request arrived.
mod throttled {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use axum::Router;
    use axum::http::{StatusCode, header};
    use axum::routing::post;

    pub struct Throttled {
        pub url: String,
        pub arrivals: Arc<Mutex<Vec<Instant>>>,
    }

    pub async fn start(retry_after: impl Fn() -> String + Send + Sync + 'static) -> Throttled {
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let seen = arrivals.clone();
        let retry_after = Arc::new(retry_after);
        let app = Router::new().route(
            "/charge",
            post(move || {
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(Instant::now());
                    seen.len()
                };
                let value = retry_after();
                async move {
                    if n == 1 {
                        (
                            StatusCode::TOO_MANY_REQUESTS,
                            [(header::RETRY_AFTER, value)],
                            "slow down",
                        )
                            .into_response()
                    } else {
                        (StatusCode::CREATED, "made").into_response()
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Throttled {
            url: format!("http://{addr}/charge"),
            arrivals,
        }
    }

    use axum::response::IntoResponse;
}

/// A policy whose own waits are tiny: any longer wait is the server's.
fn quick_policy(budget: Duration) -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        budget,
    }
}

#[tokio::test]
async fn a_retry_after_above_max_delay_is_waited_out_in_full() {
    let server = throttled::start(|| "2".to_owned()).await;
    let answer = IdemClient::new(reqwest::Client::new())
        .retry_policy(quick_policy(Duration::from_secs(30)))
        .post(&server.url)
        .key("throttled-seconds")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    assert_eq!(answer.attempts(), 2);
    let arrivals = server.arrivals.lock().unwrap().clone();
    let gap = arrivals[1] - arrivals[0];
    assert!(
        gap >= Duration::from_secs(2),
        "the server's 2 s are a floor, not cut to max_delay (20 ms): {gap:?}"
    );
}

#[tokio::test]
async fn a_retry_after_as_an_http_date_is_honoured() {
    // Three seconds ahead at the server's second: at least two seconds of wait, whatever the
    // sub-second clock.
    let server = throttled::start(|| {
        httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3))
    })
    .await;
    let answer = IdemClient::new(reqwest::Client::new())
        .retry_policy(quick_policy(Duration::from_secs(30)))
        .post(&server.url)
        .key("throttled-date")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    let arrivals = server.arrivals.lock().unwrap().clone();
    let gap = arrivals[1] - arrivals[0];
    assert!(gap >= Duration::from_secs(2), "{gap:?}");
}

#[tokio::test]
async fn a_retry_after_beyond_the_budget_gives_up_at_once_with_a_clear_error() {
    let server = throttled::start(|| "30".to_owned()).await;
    let started = std::time::Instant::now();
    let error = IdemClient::new(reqwest::Client::new())
        .retry_policy(quick_policy(Duration::from_secs(5)))
        .post(&server.url)
        .key("throttled-long")
        .send()
        .await
        .unwrap_err();
    match &error {
        idem::http::client::ClientError::RetryAfterBeyondBudget {
            attempts,
            status,
            retry_after,
            ..
        } => {
            assert_eq!((*attempts, status.as_u16()), (1, 429));
            assert_eq!(*retry_after, Duration::from_secs(30));
        }
        other => panic!("{other:?}"),
    }
    assert!(error.to_string().contains("asked to wait 30s"), "{error}");
    assert_eq!(
        server.arrivals.lock().unwrap().len(),
        1,
        "never retried early"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "it did not wait for nothing"
    );
}

/// The idem client through a fault proxy in front of the server: each fault strikes while a
/// request is on its way, then the network heals. Every intent is charged once and its answer
/// comes back (a swallowed or cut reply is a timeout; the retry, same key, is a replay); when
/// the faults outlast the budget, the client gives up with a transport error, and the same key
/// sent later charges once.
#[tokio::test]
async fn the_client_through_network_faults_charges_each_intent_once() {
    use proxy::{Fault, FaultProxy};
    let server = Server::start(Duration::ZERO).await;
    let proxy = FaultProxy::start(server.addr).await;
    let url = format!("http://127.0.0.1:{}/v1/payment_intents", proxy.port);
    // No idle connections kept: every attempt opens one, as refused connections need.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let client = IdemClient::new(http).retry_policy(RetryPolicy {
        max_attempts: 20,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(100),
        budget: Duration::from_secs(10),
    });
    let charged = |amount: u64| {
        server
            .charges()
            .iter()
            .filter(|c| c.amount == amount)
            .count()
    };
    let faults = [
        Fault::SwallowReplies,
        Fault::CutReplies { after: 20 },
        Fault::BlackHole,
        Fault::Reset,
        Fault::Refuse,
        Fault::Latency { ms: 100 },
    ];
    for (amount, fault) in (1000..).zip(faults) {
        proxy.set(fault);
        let send = tokio::spawn(
            client
                .post(&url)
                .with(|b| b.bearer_auth("user-faults"))
                .key(key())
                .form(&[("amount", amount.to_string()), ("currency", "eur".into())])
                .send(),
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        proxy.set(Fault::None);
        let answer = send
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{fault:?}: {e}"));
        assert_eq!(answer.status(), 200, "{fault:?}");
        if fault != (Fault::Latency { ms: 100 }) {
            assert!(answer.attempts() >= 2, "{fault:?}: retried");
        }
        assert_eq!(charged(amount), 1, "{fault:?}: one charge");
    }

    // Faults that outlast the budget: the client gives up, and the request never reached the
    // server; the same key later charges once.
    proxy.set(Fault::BlackHole);
    let intent = key();
    let send = |client: &IdemClient| {
        client
            .post(&url)
            .with(|b| b.bearer_auth("user-faults"))
            .key(intent.clone())
            .form(&[("amount", "2000"), ("currency", "eur")])
            .send()
    };
    let short = IdemClient::new(
        reqwest::Client::builder()
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    )
    .retry_policy(quick_policy(Duration::from_secs(1)));
    let err = send(&short).await.unwrap_err();
    assert!(
        matches!(
            err,
            idem::http::client::ClientError::Transport { attempts, .. } if attempts >= 2
        ),
        "{err:?}"
    );
    assert_eq!(charged(2000), 0);
    proxy.set(Fault::None);
    let answer = send(&client).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(charged(2000), 1);
}
