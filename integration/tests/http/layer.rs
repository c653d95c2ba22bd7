//! The layer, end to end: what it replays, refuses and keeps, counted in charges.

use super::*;

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
    let reordered = authed()
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
    let response = authed()
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

/// With a wait (here the runtime's default), the duplicates sent while the first request runs
/// get its response, not a 409.
#[tokio::test]
async fn with_a_wait_thirty_two_simultaneous_requests_all_get_the_one_charge() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let idem = Idem::builder()
        .lease(Duration::from_secs(10))
        .wait(Duration::from_secs(10))
        .open(&url)
        .await
        .unwrap();
    let server = Server::start_on(idem, Duration::from_millis(300), ErrorBody::Problem, dir).await;
    let key = key();
    let calls: Vec<_> = (0..32)
        .map(|_| {
            let req = server.create(Some(&key), 500, "sk_a");
            tokio::spawn(async move { req.send().await.unwrap() })
        })
        .collect();
    let mut bodies = Vec::new();
    let mut replayed = 0;
    for call in calls {
        let response = call.await.unwrap();
        assert_eq!(
            response.status(),
            200,
            "every duplicate waits for the response"
        );
        replayed += usize::from(response.headers().get("idempotent-replayed").is_some());
        bodies.push(response.bytes().await.unwrap());
    }
    assert_eq!(server.charges().len(), 1);
    assert_eq!(replayed, 31, "one ran, the others received its response");
    assert!(bodies.iter().all(|b| *b == bodies[0]), "byte for byte");
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
    let answer = IdemClient::new(authed())
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
    let http = authed_builder()
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
        authed()
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
    let invalid = authed()
        .post(server.url("/v1/payment_intents"))
        .header("Idempotency-Key", &key)
        .form(&[("currency", "eur")])
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 400);
    let envelope: serde_json::Value = invalid.json().await.unwrap();
    assert_eq!(envelope["error"]["code"], "parameter_missing");
    let fixed = authed()
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
async fn patch_is_guarded_and_put_delete_pass_through() {
    let server = custom::start(memory_layer().await).await;
    let url = format!("http://{}/thing", server.addr);
    let http = authed();
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
    let client = IdemClient::new(authed()).retry_policy(RetryPolicy {
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
        authed()
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
async fn a_response_whose_recording_meets_a_store_blip_is_still_kept() {
    let store = std::sync::Arc::new(crate::common::CountingStore::default());
    store
        .fail_completions_left
        .store(3, std::sync::atomic::Ordering::SeqCst);
    let idem = Idem::builder()
        .lease(Duration::from_secs(10))
        .build(store.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on(idem, Duration::ZERO, ErrorBody::Problem, dir).await;
    let key = key();
    let first = server.create(Some(&key), 500, "sk_a").send().await.unwrap();
    assert_eq!(first.status(), 200);
    let first_body = first.bytes().await.unwrap();
    // The three failed attempts were tried again until the response was recorded.
    let again = server.create(Some(&key), 500, "sk_a").send().await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.unwrap(), first_body);
    assert_eq!(server.charges().len(), 1);
    assert_eq!(
        store
            .fail_completions_left
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}
