//! The `Idempotency-Key` layer, end to end: the payments example served on a loopback port,
//! driven with reqwest, raw TCP and the idem client. Every test counts charges in the example's
//! ledger. One test binary, one file per side:
//!
//! | file | what |
//! |---|---|
//! | `layer.rs` | the layer: replays, mismatches, keys, bodies, concurrency, dropped connections, principals, what is kept, methods, skipped fields |
//! | `stripe.rs` | Stripe's own Python SDK against the layer, and Stripe's error envelope |
//! | `client.rs` | the retrying client: what it retries, `Retry-After`, derived keys, network faults |
//! | `standards.rs` | the draft read to the letter: the published policy from the configuration, unknown outcomes (423), the query in the fingerprint, callers without credentials |
//! | `streamed.rs` | streamed responses (events, chunked bodies) recorded, replayed and followed, on SQLite, Postgres and Redis |
//!
//! The server and the helpers below are shared by the first three.

#[path = "../common/mod.rs"]
mod common;
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/payments_server.rs"]
mod payments_server;
#[path = "../common/proxy.rs"]
mod proxy;
#[path = "../common/python.rs"]
mod python;

mod client;
mod layer;
mod standards;
mod streamed;
mod stripe;

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
        Server::start_on(idem, latency, errors, dir).await
    }

    /// The payments example on a runtime of the test's (`dir` lives as long as the server).
    async fn start_on(
        idem: Idem,
        latency: Duration,
        errors: ErrorBody,
        dir: tempfile::TempDir,
    ) -> Server {
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
        let mut req = authed()
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

/// A reqwest client that sends credentials with every request, as an agent calling an API does
/// (the layer refuses a keyed request whose caller it cannot tell apart); a request's own
/// `Authorization` wins.
fn authed() -> reqwest::Client {
    authed_builder().build().unwrap()
}

/// The builder of [`authed`], for a client with settings of its own.
fn authed_builder() -> reqwest::ClientBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_static("Bearer sk_test_agent"),
    );
    reqwest::Client::builder().default_headers(headers)
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
