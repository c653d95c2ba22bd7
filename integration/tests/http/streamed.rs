//! Streamed responses through the layer, on SQLite, Postgres and Redis (each test scoped by a
//! principal of its own):
//!
//! - a `text/event-stream` of 1,000 events and a chunked `application/octet-stream` are
//!   answered as they are produced, and replayed byte for byte, their handler run once;
//! - a retry during the stream, through another server on the same store (as another process
//!   would be), gets the frames so far, then the rest, with no gap and no duplicate;
//! - a stream whose body fails is cut short for its client and for a follower, never ended as
//!   if complete, and its key is blocked as unknown (423), before its lease lapses and after:
//!   the handler never runs twice;
//! - a streamed answer whose status says nothing happened is passed on unrecorded, its key
//!   released.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem::Idem;
use idem::http::server::IdempotencyLayer;
use idem::store::conformance::test_server_url;

/// Event `n` of run `run`: 1 to 3,000 bytes of data, ASCII and not.
fn event(run: usize, n: usize) -> String {
    let len = 1 + (n * 97) % 3000;
    let data: String = (0..len)
        .map(|i| match (n + i) % 5 {
            0 => 'ñ',
            1 => '"',
            _ => char::from(b'a' + ((n * 31 + i) % 26) as u8),
        })
        .collect();
    format!("id: {n}\ndata: run-{run} {data}\n\n")
}

/// The events `0..count` of run `run`, as one body.
fn events(run: usize, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|n| event(run, n).into_bytes())
        .collect()
}

/// A body fed by a channel: its length unknown until it ends.
struct Fed(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl http_body::Body for Fed {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|frame| frame.map(|data| data.map(http_body::Frame::data)))
    }
}

/// What the handlers share: how many times each request ran, by its `id`, and the gates
/// streams wait at.
#[derive(Clone, Default)]
struct Drafts {
    runs: Arc<Mutex<HashMap<String, usize>>>,
    gates: Arc<Mutex<HashMap<String, Arc<tokio::sync::Notify>>>>,
}

impl Drafts {
    /// Counts a run of `id`; answers which it is (1, 2, …).
    fn ran(&self, id: &str) -> usize {
        let mut runs = self.runs.lock().unwrap();
        let n = runs.entry(id.to_owned()).or_default();
        *n += 1;
        *n
    }

    fn runs(&self, id: &str) -> usize {
        self.runs.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    fn gate(&self, id: &str) -> Arc<tokio::sync::Notify> {
        self.gates
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_default()
            .clone()
    }
}

#[derive(serde::Deserialize)]
struct Draft {
    id: String,
    events: usize,
    /// Waits for the gate before this event.
    pause: Option<usize>,
    /// On the first run, the body fails after this many events.
    fail_at: Option<usize>,
    /// The status to answer.
    status: Option<u16>,
    /// `octet`: a chunked `application/octet-stream` instead of events.
    kind: Option<String>,
}

/// `POST /v1/drafts?id=…&events=N`: an event stream of `events` events, produced one task
/// step at a time (its options in [`Draft`]).
async fn draft(State(drafts): State<Drafts>, Query(q): Query<Draft>) -> Response {
    let run = drafts.ran(&q.id);
    let gate = drafts.gate(&q.id);
    let (frames, body) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        for n in 0..q.events {
            if q.pause == Some(n) {
                gate.notified().await;
            }
            if run == 1 && q.fail_at == Some(n) {
                let _ = frames
                    .send(Err(std::io::Error::other("the model hung up")))
                    .await;
                return;
            }
            if frames.send(Ok(Bytes::from(event(run, n)))).await.is_err() {
                return;
            }
            if n % 50 == 0 {
                tokio::task::yield_now().await;
            }
        }
    });
    let status = StatusCode::from_u16(q.status.unwrap_or(200)).unwrap();
    let content_type = match q.kind.as_deref() {
        Some("octet") => "application/octet-stream",
        _ => "text/event-stream",
    };
    (
        status,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::new(Fed(body)),
    )
        .into_response()
}

/// A server of the drafts route behind a layer on a store opened from `url`.
async fn serve(url: &str, lease: Duration, drafts: Drafts) -> std::net::SocketAddr {
    let idem = Idem::builder().lease(lease).open(url).await.unwrap();
    let app = Router::new()
        .route("/v1/drafts", post(draft))
        .with_state(drafts)
        .layer(IdempotencyLayer::new(idem));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A request for a draft with `query`, as `user`, with `key`.
fn request(
    addr: std::net::SocketAddr,
    user: &str,
    key: &str,
    query: &str,
) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("http://{addr}/v1/drafts?{query}"))
        .bearer_auth(user)
        .header("Idempotency-Key", key)
}

/// Reads `response`'s body until it holds at least `bytes` bytes.
async fn read_at_least(response: &mut reqwest::Response, got: &mut Vec<u8>, bytes: usize) {
    while got.len() < bytes {
        let chunk = response.chunk().await.unwrap().expect("the body goes on");
        got.extend_from_slice(&chunk);
    }
}

/// Reads the rest of `response`'s body into `got`: `Err` if the body broke off.
async fn read_rest(response: &mut reqwest::Response, got: &mut Vec<u8>) -> Result<(), String> {
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => got.extend_from_slice(&chunk),
            Ok(None) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// A user (principal) of the test's own.
fn user() -> String {
    format!("sk_{}", uuid::Uuid::new_v4().simple())
}

async fn streams_replay_byte_for_byte(url: &str) {
    let drafts = Drafts::default();
    let addr = serve(url, Duration::from_secs(10), drafts.clone()).await;
    let user = user();
    for kind in ["events", "octet"] {
        let id = format!("{kind}-{}", uuid::Uuid::new_v4().simple());
        let query = format!("id={id}&events=1000&kind={kind}");
        let first = request(addr, &user, &id, &query).send().await.unwrap();
        assert_eq!(first.status(), 200);
        assert!(first.headers().get("idempotent-replayed").is_none());
        assert!(first.headers().get(header::CONTENT_LENGTH).is_none());
        let content_type = first.headers()[header::CONTENT_TYPE].clone();
        let body = first.bytes().await.unwrap();
        assert!(body[..] == events(1, 1000)[..], "{kind}: every event");
        for _ in 0..2 {
            let again = request(addr, &user, &id, &query).send().await.unwrap();
            assert_eq!(again.status(), 200);
            assert_eq!(again.headers()["idempotent-replayed"], "true");
            assert_eq!(again.headers()[header::CONTENT_TYPE], content_type);
            assert!(
                again.headers().get(header::CACHE_CONTROL).is_none(),
                "a header not selected for replay is not replayed"
            );
            let replayed = again.bytes().await.unwrap();
            assert!(replayed == body, "{kind}: byte for byte");
        }
        assert_eq!(drafts.runs(&id), 1, "{kind}: the handler ran once");
    }
}

async fn a_retry_during_the_stream_attaches(url: &str) {
    let drafts = Drafts::default();
    let producer = serve(url, Duration::from_secs(10), drafts.clone()).await;
    let follower = serve(url, Duration::from_secs(10), drafts.clone()).await;
    let user = user();
    let id = format!("attach-{}", uuid::Uuid::new_v4().simple());
    let query = format!("id={id}&events=1000&pause=500");
    let whole = events(1, 1000);
    let prefix = events(1, 500).len();
    let mut first = request(producer, &user, &id, &query).send().await.unwrap();
    let mut produced = Vec::new();
    read_at_least(&mut first, &mut produced, prefix).await;
    assert_eq!(produced.len(), prefix, "nothing past the gate");
    let mut second = request(follower, &user, &id, &query).send().await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(second.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut followed = Vec::new();
    read_at_least(&mut second, &mut followed, prefix).await;
    drafts.gate(&id).notify_one();
    read_rest(&mut first, &mut produced).await.unwrap();
    read_rest(&mut second, &mut followed).await.unwrap();
    assert!(produced == whole, "the first client got every event");
    assert!(
        followed == whole,
        "the follower got every event, no gap, no duplicate"
    );
    assert_eq!(drafts.runs(&id), 1, "the handler ran once");
}

async fn a_broken_stream_is_cut_short_and_its_key_blocked(url: &str) {
    let drafts = Drafts::default();
    let lease = Duration::from_millis(600);
    let addr = serve(url, lease, drafts.clone()).await;
    let user = user();
    let id = format!("broken-{}", uuid::Uuid::new_v4().simple());
    let query = format!("id={id}&events=100&pause=20&fail_at=40");
    let mut first = request(addr, &user, &id, &query).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let mut got = Vec::new();
    read_at_least(&mut first, &mut got, events(1, 20).len()).await;
    // A retry during the stream follows it.
    let mut follower = request(addr, &user, &id, &query).send().await.unwrap();
    assert_eq!(follower.headers()["idempotent-replayed"], "true");
    let mut followed = Vec::new();
    read_at_least(&mut follower, &mut followed, events(1, 20).len()).await;
    drafts.gate(&id).notify_one();
    // The body fails after 40 events: both bodies are cut short, each after a prefix of the
    // events sent (the server may drop what it had not flushed when it cut the connection).
    let sent = events(1, 40);
    assert!(read_rest(&mut first, &mut got).await.is_err(), "cut short");
    assert!(sent.starts_with(&got), "a prefix of the events sent");
    assert!(
        read_rest(&mut follower, &mut followed).await.is_err(),
        "the follower's too"
    );
    assert!(
        sent.starts_with(&followed),
        "a prefix of the recorded events"
    );
    // The handler ran and its outcome is unknown: its key is blocked, before the lease lapses
    // and after, and the handler never runs again.
    for wait in [Duration::ZERO, lease + Duration::from_millis(100)] {
        tokio::time::sleep(wait).await;
        let retry = request(addr, &user, &id, &query).send().await.unwrap();
        assert_eq!(retry.status(), 423, "outcome unknown");
        let problem: serde_json::Value = retry.json().await.unwrap();
        assert_eq!(problem["type"], "/idempotency-policy#outcome-unknown");
    }
    assert_eq!(drafts.runs(&id), 1, "the handler ran once");
}

async fn a_streamed_no_effect_status_is_not_kept(url: &str) {
    let drafts = Drafts::default();
    let addr = serve(url, Duration::from_secs(10), drafts.clone()).await;
    let user = user();
    let id = format!("refused-{}", uuid::Uuid::new_v4().simple());
    let query = format!("id={id}&events=30&status=422");
    for run in 1..=2 {
        let refused = request(addr, &user, &id, &query).send().await.unwrap();
        assert_eq!(refused.status(), 422);
        assert!(refused.headers().get("idempotent-replayed").is_none());
        assert!(refused.bytes().await.unwrap()[..] == events(run, 30)[..]);
    }
    assert_eq!(drafts.runs(&id), 2, "a released key runs again");
}

/// The store URLs the tests run on: a SQLite file (kept by the guard), and the servers the
/// environment names.
fn sqlite() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    (url, dir)
}

macro_rules! on_every_store {
    ($($test:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let (url, _dir) = super::sqlite();
                    super::$test(&url).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(url) = super::test_server_url("IDEM_TEST_POSTGRES_URL") else {
                        return;
                    };
                    super::$test(&url).await;
                }
            )*
        }
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(url) = super::test_server_url("IDEM_TEST_REDIS_URL") else {
                        return;
                    };
                    super::$test(&url).await;
                }
            )*
        }
    };
}

on_every_store!(
    streams_replay_byte_for_byte,
    a_retry_during_the_stream_attaches,
    a_broken_stream_is_cut_short_and_its_key_blocked,
    a_streamed_no_effect_status_is_not_kept,
);
