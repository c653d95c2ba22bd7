//! The transactional contract on one process: what commits together and what rolls back.

use super::*;

#[tokio::test]
async fn the_writes_and_the_record_commit_once_and_retries_replay() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let scope = idem.scope("tenant-tx");
    let run = common::unique("run");
    let first = scope
        .run(create_order(run.clone(), "s1".into(), "book".into(), 2))
        .await
        .expect("first call");
    assert!(first.is_fresh());
    for _ in 0..3 {
        let again = scope
            .run(create_order(run.clone(), "s1".into(), "book".into(), 2))
            .await
            .expect("retry");
        assert!(again.is_replayed());
        assert_eq!(again.value(), first.value(), "the first order, replayed");
    }
    assert_eq!(db.rows(&run, "s1").await, 1);
    assert_eq!(common::effects(&format!("{run}/s1")), 1);
    assert_eq!(
        record_status(&idem, "orders.create", &run, "s1").await,
        Some(RecordStatus::Completed)
    );
    // Other arguments under the same key: a mismatch, and nothing written.
    let other = scope
        .run(create_order(run.clone(), "s1".into(), "pen".into(), 2))
        .await
        .expect("mismatch");
    assert!(other.is_mismatch());
    assert_eq!(db.rows(&run, "s1").await, 1);
    db.drop().await;
}

#[tokio::test]
async fn an_error_rolls_the_writes_back_with_the_claim_and_a_corrected_retry_runs() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let scope = idem.scope("tenant-tx");
    let run = common::unique("run");
    let failed = scope
        .run(create_order(run.clone(), "s1".into(), "book".into(), 0))
        .await
        .expect_err("out of stock");
    assert_eq!(failed.tool_error(), Some(&OrderError::OutOfStock));
    assert!(failed.body_ran());
    assert_eq!(db.rows(&run, "s1").await, 0, "the insert rolled back");
    assert_eq!(
        record_status(&idem, "orders.create", &run, "s1").await,
        None
    );
    // The same key with corrected arguments runs (the claim went with the writes).
    let fixed = scope
        .run(create_order(run.clone(), "s1".into(), "book".into(), 1))
        .await
        .expect("corrected");
    assert!(fixed.is_fresh());
    assert_eq!(db.rows(&run, "s1").await, 1);
    db.drop().await;
}

#[tokio::test]
async fn a_stored_error_is_replayed_without_its_writes() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let scope = idem.scope("tenant-tx");
    let run = common::unique("run");
    for attempt in 0..3 {
        let failed = scope
            .run(create_order_storing_errors(
                run.clone(),
                "s1".into(),
                "book".into(),
                0,
            ))
            .await
            .expect_err("out of stock");
        assert_eq!(failed.tool_error(), Some(&OrderError::OutOfStock));
        assert_eq!(failed.body_ran(), attempt == 0, "replayed after the first");
    }
    assert_eq!(common::effects(&format!("{run}/s1")), 1);
    assert_eq!(
        db.rows(&run, "s1").await,
        0,
        "the savepoint took the insert back"
    );
    assert_eq!(
        record_status(&idem, "orders.create_stored", &run, "s1").await,
        Some(RecordStatus::Completed)
    );
    // A value under this policy keeps its writes.
    let ok = scope
        .run(create_order_storing_errors(
            run.clone(),
            "s2".into(),
            "book".into(),
            3,
        ))
        .await
        .expect("stored value");
    assert!(ok.is_fresh());
    assert_eq!(db.rows(&run, "s2").await, 1);
    db.drop().await;
}

#[tokio::test]
async fn sixty_four_concurrent_calls_of_one_key_write_one_row() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let run = common::unique("run");
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let scope = idem.scope("tenant-tx");
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let out = scope
                    .run(create_order(run.clone(), "s1".into(), "book".into(), 1))
                    .await
                    .expect("no error");
                if out.is_in_flight() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                return out;
            }
        }));
    }
    let mut fresh = 0;
    let mut ids = Vec::new();
    for task in tasks {
        let out = task.await.unwrap();
        fresh += usize::from(out.is_fresh());
        ids.push(out.value().expect("a value").id);
    }
    assert_eq!(fresh, 1, "one call ran, the others replayed");
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "one order for all");
    assert_eq!(db.rows(&run, "s1").await, 1);
    assert_eq!(common::effects(&format!("{run}/s1")), 1);
    db.drop().await;
}

#[tokio::test]
async fn a_concurrent_call_waits_for_the_commit_and_answers_in_flight_past_its_wait() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let run = common::unique("run");
    // Held 100 ms, within the 300 ms wait: the second call waits, then replays.
    let first = tokio::spawn({
        let scope = idem.scope("tenant-tx");
        let run = run.clone();
        async move { scope.run(slow_order(run, 100)).await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let second = idem
        .scope("tenant-tx")
        .run(slow_order(run.clone(), 100))
        .await
        .expect("second");
    assert!(second.is_replayed(), "{second:?}");
    assert!(first.await.unwrap().expect("first").is_fresh());
    // Held 1.5 s, past the wait: the second answers in flight, then replays once committed.
    let slow = common::unique("run");
    let first = tokio::spawn({
        let scope = idem.scope("tenant-tx");
        let slow = slow.clone();
        async move { scope.run(slow_order(slow, 1_500)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let second = idem
        .scope("tenant-tx")
        .run(slow_order(slow.clone(), 1_500))
        .await
        .expect("second");
    assert!(second.is_in_flight(), "{second:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1_400),
        "bounded by the wait"
    );
    assert!(first.await.unwrap().expect("first").is_fresh());
    let third = idem
        .scope("tenant-tx")
        .run(slow_order(slow.clone(), 1_500))
        .await
        .expect("third");
    assert!(third.is_replayed());
    assert_eq!(common::effects(&run), 1, "one body per key");
    assert_eq!(common::effects(&slow), 1, "one body per key");
    assert_eq!(db.all_rows().await, 2);
    db.drop().await;
}

#[tokio::test]
async fn a_cancelled_call_leaves_nothing_and_its_retry_runs() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let run = common::unique("run");
    let scope = idem.scope("tenant-tx");
    // Cancelled while its transaction is open (inserted, holding): everything rolls back.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        scope.run(slow_order(run.clone(), 5_000)),
    )
    .await;
    assert!(cancelled.is_err(), "cancelled");
    let retry = scope.run(slow_order(run.clone(), 0)).await.expect("retry");
    assert!(retry.is_fresh(), "{retry:?}");
    assert_eq!(db.all_rows().await, 1, "the cancelled insert is gone");
    db.drop().await;
}

#[tokio::test]
async fn a_transactional_tool_on_another_store_is_refused_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let idem = Idem::open(&format!(
        "sqlite://{}",
        dir.path().join("idem.db").display()
    ))
    .await
    .expect("open");
    let run = common::unique("run");
    let refused = idem
        .scope("tenant-tx")
        .run(create_order(run.clone(), "s1".into(), "book".into(), 1))
        .await
        .expect_err("refused");
    assert!(!refused.body_ran());
    let message = refused.to_string();
    assert!(
        message.contains("transactional") && message.contains("postgres://"),
        "{message}"
    );
    assert_eq!(common::effects(&format!("{run}/s1")), 0);
    let audit = idem::registry::audit(&idem).await;
    assert!(
        audit.errors().any(|f| f.tool == Some("orders.create")),
        "{audit}"
    );
}

#[tokio::test]
async fn the_store_over_the_same_database_sees_the_record_as_every_tool_does() {
    let Some(db) = Db::new().await else { return };
    let store = PostgresStore::open_url(&db.store_url(""))
        .await
        .expect("open");
    let idem = Idem::with_store(Arc::new(store));
    let run = common::unique("run");
    let out = idem
        .scope("tenant-tx")
        .run(create_order(run.clone(), "s1".into(), "book".into(), 1))
        .await
        .expect("through an Arc'd store");
    assert!(out.is_fresh());
    assert_eq!(db.rows(&run, "s1").await, 1);
    db.drop().await;
}

/// An optional key: without it, the call runs unprotected, in a transaction of its own.
#[idempotent(key = "request_id", mutating, transactional, name = "orders.optional")]
async fn optional_order(
    tx: &mut Transaction<'_>,
    request_id: Option<String>,
    run_id: String,
) -> Result<i64, OrderError> {
    let row = tx
        .query_one(
            "INSERT INTO orders (run_id, step_id, item, qty) VALUES ($1, 'o', 'o', 1) RETURNING id",
            &[&run_id],
        )
        .await?;
    let _ = request_id;
    Ok(row.get(0))
}

#[tokio::test]
async fn without_its_optional_key_a_call_runs_unprotected_and_commits_its_writes() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let scope = idem.scope("tenant-tx");
    let run = common::unique("run");
    for _ in 0..2 {
        let out = scope
            .run(optional_order(None, run.clone()))
            .await
            .expect("unprotected");
        assert!(matches!(out, idem::Outcome::Unprotected(_)), "{out:?}");
    }
    assert_eq!(db.rows(&run, "o").await, 2, "each unprotected call wrote");
    for attempt in 0..2 {
        let out = scope
            .run(optional_order(Some("req-1".into()), run.clone()))
            .await
            .expect("keyed");
        assert_eq!(out.is_replayed(), attempt == 1);
    }
    assert_eq!(db.rows(&run, "o").await, 3, "the keyed calls wrote once");
    db.drop().await;
}

#[tokio::test]
async fn a_large_result_commits_as_a_blob_with_the_writes_and_replays_whole() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let scope = idem.scope("tenant-tx-large");
    let run = common::unique("run");
    // An item name of 200 KiB: the order returned is past the blob threshold.
    let item = "b".repeat(200 << 10);
    let first = scope
        .run(create_order(run.clone(), "s1".into(), item.clone(), 2))
        .await
        .expect("first call");
    assert!(first.is_fresh());
    let again = scope
        .run(create_order(run.clone(), "s1".into(), item, 2))
        .await
        .expect("retry");
    assert!(again.is_replayed());
    assert_eq!(again.value(), first.value(), "replayed whole");
    assert_eq!(db.rows(&run, "s1").await, 1);
    let admin = idem::store::admin::open(&db.store_url(""))
        .await
        .expect("open");
    let usage = admin
        .blob_usage(Some("tenant-tx-large"))
        .await
        .expect("usage");
    assert_eq!(
        usage.blobs, 1,
        "the result is a blob, committed with the order"
    );
    db.drop().await;
}
