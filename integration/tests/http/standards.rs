//! The layer read against the Idempotency-Key draft and tried as a new user would: real
//! requests through a router of the test's own, each route counting its runs.
//!
//! - The published policy is generated from the layer's settings (a 30-minute TTL reads
//!   `30 min`; routes, kept statuses, error format, scope and orphans as configured).
//! - A handler that ran but whose response failed leaves its key `unknown`, answered 423
//!   `outcome-unknown` before its lease lapses and after, never run again; idem's client stops
//!   on it with `ClientError::OutcomeUnknown`. So does a handler that panicked, once its lease
//!   lapses (unless the layer reruns orphans).
//! - The query is fingerprinted: the same key with another query is 422; the same pairs in
//!   another order are the same request.
//! - A keyed request without credentials is refused (400 `unidentified-caller`), unless the
//!   layer opts in to one shared anonymous scope.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem::http::client::ClientError;
use idem::http::server::IdempotencyLayer;

use super::*;

/// How many times each route ran, by name.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<String, usize>>>);

impl Runs {
    fn ran(&self, name: &str) {
        *self.0.lock().unwrap().entry(name.to_owned()).or_default() += 1;
    }

    fn of(&self, name: &str) -> usize {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

/// A body of a known length that fails after its first bytes.
struct FailsMidway(bool);

impl http_body::Body for FailsMidway {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        if self.0 {
            return Poll::Ready(Some(Err(std::io::Error::other("the disk went away"))));
        }
        self.0 = true;
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            b"{\"id\": \"ch_1\", ",
        )))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(64)
    }
}

/// `POST /ok/{name}`: 201; `POST /broken/{name}`: a response whose body fails midway;
/// `POST /panics/{name}`: a handler that panics. Each counts its runs under its name.
async fn serve(layer: IdempotencyLayer) -> (std::net::SocketAddr, Runs) {
    let runs = Runs::default();
    let app = Router::new()
        .route(
            "/ok/{name}",
            post(
                |State(runs): State<Runs>, Path(name): Path<String>| async move {
                    runs.ran(&name);
                    (StatusCode::CREATED, format!("made {name}"))
                },
            ),
        )
        .route(
            "/broken/{name}",
            post(
                |State(runs): State<Runs>, Path(name): Path<String>| async move {
                    runs.ran(&name);
                    Response::new(Body::new(FailsMidway(false)))
                },
            ),
        )
        .route(
            "/panics/{name}",
            post(
                |State(runs): State<Runs>, Path(name): Path<String>| async move {
                    runs.ran(&name);
                    // A name is never empty: the handler always panics (the branch gives it a
                    // response type).
                    if !name.is_empty() {
                        panic!("the handler of {name} crashed");
                    }
                    StatusCode::OK.into_response()
                },
            ),
        )
        .with_state(runs.clone())
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, runs)
}

async fn layer_on_memory(lease: Duration) -> IdempotencyLayer {
    let idem = Idem::builder()
        .lease(lease)
        .open("memory://")
        .await
        .unwrap();
    IdempotencyLayer::new(idem)
}

async fn policy_of(addr: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{addr}/idempotency-policy"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_policy_is_the_layers_configuration() {
    // The defaults, with a 30-minute TTL.
    let idem = Idem::open("memory://").await.unwrap();
    let plain = IdempotencyLayer::new(idem.clone()).ttl(Duration::from_secs(30 * 60));
    let (addr, _) = serve(plain.clone()).await;
    let policy = policy_of(addr).await;
    assert_eq!(policy, plain.policy(), "served as the layer writes it");
    for said in [
        "for 30 min",
        "Responses 400, 401, 403-405, 409, 413, 415, 422, 429 are not kept",
        "`application/problem+json`",
        "told apart by its `Authorization` credentials; two callers never share a key",
        "(`unidentified-caller`)",
        "method, path, query",
        "it is never run twice",
        "### outcome-unknown\n\n423: ",
        "### key-reused\n\n422: ",
        "### in-flight\n\n409: ",
    ] {
        assert!(policy.contains(said), "{said:?} in\n{policy}");
    }
    assert!(!policy.contains("0 h"), "{policy}");
    assert!(!policy.contains("routes this service guards"), "{policy}");

    // Every setting the policy speaks of, changed.
    let configured = IdempotencyLayer::new(idem)
        .ttl(Duration::from_secs(2 * 3600))
        .lease(Duration::from_secs(90))
        .routes(|_, path| path.starts_with("/ok"))
        .store_responses(|status| status.is_success())
        .error_body(ErrorBody::Stripe)
        .shared_anonymous_scope()
        .rerun_orphans();
    let (addr, _) = serve(configured).await;
    let policy = policy_of(addr).await;
    for said in [
        "for 2 h",
        "for up to 90 s",
        "on the routes this service guards",
        "Responses 100-199, 300-599 are not kept",
        "Stripe's error envelope",
        "callers without credentials share one scope",
        "runs again with the next retry",
        "### key-reused\n\n400: ",
        "### outcome-unknown\n\n423: ",
    ] {
        assert!(policy.contains(said), "{said:?} in\n{policy}");
    }
    assert!(!policy.contains("problem+json"), "{policy}");
}

#[tokio::test]
async fn a_response_that_fails_midway_leaves_its_key_unknown_never_run_twice() {
    let lease = Duration::from_millis(300);
    let (addr, runs) = serve(layer_on_memory(lease).await).await;
    let url = format!("http://{addr}/broken/export");
    let key = key();
    let first = authed()
        .post(&url)
        .header("Idempotency-Key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        first.status(),
        500,
        "the service failed: the first caller is told"
    );
    for wait in [Duration::ZERO, lease + Duration::from_millis(100)] {
        tokio::time::sleep(wait).await;
        let retry = authed()
            .post(&url)
            .header("Idempotency-Key", &key)
            .send()
            .await
            .unwrap();
        problem(retry, 423, "outcome-unknown").await;
    }
    assert_eq!(runs.of("export"), 1, "the handler ran once");
    // idem's own client stops at once, with a typed error.
    let client = IdemClient::new(authed());
    let err = client.post(&url).key(&key).send().await.unwrap_err();
    match err {
        ClientError::OutcomeUnknown { attempts, detail } => {
            assert_eq!(attempts, 1, "not retried");
            assert!(detail.contains("outcome-unknown"), "{detail}");
        }
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    assert_eq!(runs.of("export"), 1);
}

#[tokio::test]
async fn a_handler_that_crashed_is_never_run_again_unless_the_layer_says_so() {
    let lease = Duration::from_secs(2);
    for rerun in [false, true] {
        let layer = layer_on_memory(lease).await;
        let layer = if rerun { layer.rerun_orphans() } else { layer };
        let (addr, runs) = serve(layer).await;
        let url = format!("http://{addr}/panics/refund");
        let key = key();
        let send = || authed().post(&url).header("Idempotency-Key", &key).send();
        assert_eq!(send().await.unwrap().status(), 500, "the panic");
        problem(send().await.unwrap(), 409, "in-flight").await;
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        let after = send().await.unwrap();
        if rerun {
            assert_eq!(after.status(), 500, "run again (and crashed again)");
            assert_eq!(runs.of("refund"), 2);
        } else {
            problem(after, 423, "outcome-unknown").await;
            assert_eq!(runs.of("refund"), 1, "never run twice");
        }
    }
}

#[tokio::test]
async fn the_query_is_part_of_the_fingerprint() {
    let (addr, runs) = serve(layer_on_memory(Duration::from_secs(10)).await).await;
    let key = key();
    let send = |query: &str| {
        authed()
            .post(format!("http://{addr}/ok/charge?{query}"))
            .header("Idempotency-Key", &key)
            .send()
    };
    assert_eq!(send("amount=1&currency=eur").await.unwrap().status(), 201);
    problem(
        send("amount=999&currency=eur").await.unwrap(),
        422,
        "key-reused",
    )
    .await;
    let same = send("currency=eur&amount=%31").await.unwrap();
    assert_eq!(
        same.headers()["idempotent-replayed"],
        "true",
        "the same pairs"
    );
    problem(send("").await.unwrap(), 422, "key-reused").await;
    assert_eq!(runs.of("charge"), 1);
}

#[tokio::test]
async fn strangers_never_share_a_key_unless_the_layer_opts_in() {
    let (addr, runs) = serve(layer_on_memory(Duration::from_secs(10)).await).await;
    let key = key();
    let anonymous = || {
        reqwest::Client::new()
            .post(format!("http://{addr}/ok/anon"))
            .header("Idempotency-Key", &key)
            .send()
    };
    for _ in 0..2 {
        let body = problem(anonymous().await.unwrap(), 400, "unidentified-caller").await;
        assert!(
            body["detail"].as_str().unwrap().contains("Authorization"),
            "{body}"
        );
    }
    assert_eq!(runs.of("anon"), 0, "refused before anything ran");
    let layer = layer_on_memory(Duration::from_secs(10))
        .await
        .shared_anonymous_scope();
    let (addr, runs) = serve(layer).await;
    let anonymous = || {
        reqwest::Client::new()
            .post(format!("http://{addr}/ok/anon"))
            .header("Idempotency-Key", &key)
            .send()
    };
    assert_eq!(anonymous().await.unwrap().status(), 201);
    let second = anonymous().await.unwrap();
    assert_eq!(
        second.headers()["idempotent-replayed"],
        "true",
        "one shared scope, as opted in"
    );
    assert_eq!(runs.of("anon"), 1);
}
