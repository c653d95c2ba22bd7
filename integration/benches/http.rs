//! The cost of the `Idempotency-Key` layer: the same axum handler called with and without it,
//! in process (no sockets), on the memory store, in the same run.
//!
//! - `http/plain`: the handler alone (a form body parsed, a JSON answer), sent the very request
//!   the replay sends, `Idempotency-Key` header included (the handler ignores it): the two sides
//!   differ by the layer alone, not by what the client builds.
//! - `http/fresh`: through the layer with a new key each time (read the body, fingerprint it,
//!   claim, run the handler in its own task, store the response).
//! - `http/replay`: through the layer with a key already answered (the stored response).
//! - the replay's time over the handler's again, timed in alternation ([`support::alternating`]),
//!   written to `alternating-http.json` beside criterion's output.
//!
//! `cargo bench --bench http` prints the ratios at the end.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::body::Body;
use axum::routing::post;
use axum::{Form, Json, Router};
use criterion::{Criterion, Throughput};
use http_body_util::BodyExt;
use idem::Idem;
use idem::http::server::IdempotencyLayer;
use support::{alternated_summary, alternating, criterion_dir, median_ns, runtime, wanted};
use tower_service::Service;

mod support;

async fn create(Form(fields): Form<Vec<(String, String)>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "object": "payment_intent", "id": "pi_1", "fields": fields.len() }))
}

/// The key of the replayed request.
const REPLAYED: u64 = u64::MAX;

fn request(key: u64) -> axum::http::Request<Body> {
    axum::http::Request::post("/v1/payment_intents")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("authorization", "Bearer sk_bench")
        .header("idempotency-key", format!("bench-{key}"))
        .body(Body::from("amount=500&currency=eur&customer=cus_42"))
        .expect("request")
}

/// Calls `service` once and reads the whole answer.
async fn call<S, B>(service: &mut S, req: axum::http::Request<Body>)
where
    S: Service<axum::http::Request<Body>, Response = axum::http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .expect("ready");
    let response = service.call(req).await.expect("answer");
    assert!(response.status().is_success(), "{}", response.status());
    response.into_body().collect().await.expect("body");
}

fn bench(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let router = Router::new().route("/v1/payment_intents", post(create));
    let idem = rt.block_on(Idem::open("memory://")).expect("open");
    let layered = tower_layer::Layer::layer(&IdempotencyLayer::new(idem), router.clone());

    let mut group = c.benchmark_group("http");
    group.throughput(Throughput::Elements(1));
    // Each measurement runs in a task on a worker thread, as a server's requests do.
    group.bench_function("plain", |b| {
        b.to_async(rt).iter_custom(|iters| {
            let mut router = router.clone();
            async move {
                tokio::spawn(async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        call(&mut router, request(REPLAYED)).await;
                    }
                    start.elapsed()
                })
                .await
                .expect("bench task")
            }
        })
    });
    let next = Arc::new(AtomicU64::new(0));
    group.bench_function("fresh", |b| {
        b.to_async(rt).iter_custom(|iters| {
            let (mut layered, next) = (layered.clone(), next.clone());
            async move {
                tokio::spawn(async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let key = next.fetch_add(1, Ordering::Relaxed);
                        call(&mut layered, request(key)).await;
                    }
                    start.elapsed()
                })
                .await
                .expect("bench task")
            }
        })
    });
    rt.block_on(call(&mut layered.clone(), request(REPLAYED)));
    group.bench_function("replay", |b| {
        b.to_async(rt).iter_custom(|iters| {
            let mut layered = layered.clone();
            async move {
                tokio::spawn(async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        call(&mut layered, request(REPLAYED)).await;
                    }
                    start.elapsed()
                })
                .await
                .expect("bench task")
            }
        })
    });
    group.finish();
    // The replay's time over the bare handler's, timed in alternation: the plain handler's rate
    // over the replay's. One call at a time, so a borrow held across its await meets no other.
    if !wanted("http/replay") {
        return;
    }
    let (plain, layered) = (RefCell::new(router), RefCell::new(layered));
    #[allow(clippy::await_holding_refcell_ref)]
    let bare = || async { call(&mut *plain.borrow_mut(), request(REPLAYED)).await };
    #[allow(clippy::await_holding_refcell_ref)]
    let replay = || async { call(&mut *layered.borrow_mut(), request(REPLAYED)).await };
    let spread = alternating(rt, bare, replay);
    alternated_summary(
        "http",
        "The layer's replay, time over the bare handler's",
        &[("replay, time over the bare handler's", spread)],
    );
}

fn summary() {
    let plain = median_ns("http", "plain");
    println!("\nThe Idempotency-Key layer, per request, against the handler alone (memory store):");
    for path in ["fresh", "replay"] {
        if let (Some(ours), Some(base)) = (median_ns("http", path), plain) {
            println!(
                "  {path:<8} {:>8.1} µs vs {:>6.1} µs without the layer: {:.2}× the time, +{:.1} µs",
                ours / 1e3,
                base / 1e3,
                ours / base,
                (ours - base) / 1e3
            );
        }
    }
}

fn main() {
    let rt = runtime();
    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .configure_from_args();
    bench(&mut c, &rt);
    c.final_summary();
    summary();
}
