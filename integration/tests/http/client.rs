//! The retrying client: what it retries and what it does not, `Retry-After`, keys derived from
//! the running tool, and network faults.

use super::*;

#[tokio::test]
async fn the_client_never_retries_422_and_reports_replays() {
    let server = Server::start(Duration::ZERO).await;
    let client = IdemClient::new(authed());
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
        let answer = IdemClient::new(authed())
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
    let client = IdemClient::new(authed()).retry_policy(RetryPolicy {
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
    let answer = IdemClient::new(authed())
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
    let answer = IdemClient::new(authed())
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
    let error = IdemClient::new(authed())
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
    let http = authed_builder()
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
        authed_builder()
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
