//! The same tools on sqlx: the body gets the transaction's `PgConnection`, from the pool the
//! application handed the store.

use super::*;

/// Inserts the order (one effect); `qty` 0 is out of stock, after the insert.
async fn insert_order(
    tx: &mut sqlx::PgConnection,
    run_id: String,
    step_id: String,
    item: String,
    qty: i32,
) -> Result<Order, String> {
    common::effect(&format!("{run_id}/{step_id}"));
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO orders (run_id, step_id, item, qty) VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(&run_id)
    .bind(&step_id)
    .bind(&item)
    .bind(qty)
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| e.to_string())?;
    if qty == 0 {
        return Err("out of stock".into());
    }
    Ok(Order { id, item })
}

#[idempotent(
    key = "run_id, step_id",
    mutating,
    transactional,
    name = "orders.create_sqlx"
)]
async fn create_order(
    tx: &mut sqlx::PgConnection,
    run_id: String,
    step_id: String,
    item: String,
    qty: i32,
) -> Result<Order, String> {
    insert_order(tx, run_id, step_id, item, qty).await
}

#[idempotent(
    key = "run_id, step_id",
    mutating,
    transactional,
    on_error = "store",
    name = "orders.create_sqlx_stored"
)]
async fn create_order_storing_errors(
    tx: &mut sqlx::PgConnection,
    run_id: String,
    step_id: String,
    qty: i32,
) -> Result<i64, String> {
    let order = insert_order(tx, run_id, step_id, "x".into(), qty).await?;
    Ok(order.id)
}

/// The runtime over `db`, with a sqlx pool on the same database (its own `search_path`).
async fn idem_with_pool(db: &Db) -> Idem {
    let idem = db.idem().await;
    let schema = db.schema.clone();
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().expect("a URL");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.options([("search_path", schema.as_str())]))
        .await
        .expect("a sqlx pool");
    idem.store().postgres().expect("postgres").use_sqlx(pool);
    idem
}

#[tokio::test]
async fn the_writes_and_the_record_commit_once_and_errors_roll_back() {
    let Some(db) = Db::new().await else { return };
    let idem = idem_with_pool(&db).await;
    let scope = idem.scope("tenant-tx");
    let run = common::unique("run");
    let first = scope
        .run(create_order(run.clone(), "s1".into(), "book".into(), 2))
        .await
        .expect("first");
    assert!(first.is_fresh());
    let again = scope
        .run(create_order(run.clone(), "s1".into(), "book".into(), 2))
        .await
        .expect("retry");
    assert!(again.is_replayed());
    assert_eq!(again.value(), first.value());
    assert_eq!(db.rows(&run, "s1").await, 1);
    assert_eq!(
        record_status(&idem, "orders.create_sqlx", &run, "s1").await,
        Some(RecordStatus::Completed)
    );

    let failed = scope
        .run(create_order(run.clone(), "s2".into(), "book".into(), 0))
        .await
        .expect_err("out of stock");
    assert!(failed.body_ran());
    assert_eq!(db.rows(&run, "s2").await, 0, "rolled back with the claim");
    assert_eq!(
        record_status(&idem, "orders.create_sqlx", &run, "s2").await,
        None
    );

    for attempt in 0..2 {
        let stored = scope
            .run(create_order_storing_errors(run.clone(), "s3".into(), 0))
            .await
            .expect_err("stored");
        assert_eq!(stored.body_ran(), attempt == 0);
    }
    assert_eq!(db.rows(&run, "s3").await, 0, "the savepoint took it back");
    assert_eq!(common::effects(&format!("{run}/s3")), 1);

    // A result past the blob threshold commits as a blob with the order, and replays whole.
    let item = "b".repeat(200 << 10);
    let large = scope
        .run(create_order(run.clone(), "s4".into(), item.clone(), 2))
        .await
        .expect("large");
    assert!(large.is_fresh());
    let again = scope
        .run(create_order(run.clone(), "s4".into(), item, 2))
        .await
        .expect("retry");
    assert!(again.is_replayed());
    assert_eq!(again.value(), large.value());
    let admin = idem::store::admin::open(&db.store_url(""))
        .await
        .expect("open");
    let usage = admin.blob_usage(Some("tenant-tx")).await.expect("usage");
    assert_eq!(usage.blobs, 1);
    db.drop().await;
}

#[tokio::test]
async fn sixty_four_concurrent_calls_of_one_key_write_one_row() {
    let Some(db) = Db::new().await else { return };
    let idem = idem_with_pool(&db).await;
    let run = common::unique("run");
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let scope = idem.scope("tenant-tx");
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let call = create_order(run.clone(), "s1".into(), "book".into(), 1);
                let out = scope.run(call).await.expect("no error");
                if !out.is_in_flight() {
                    return out.is_fresh();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    let mut fresh = 0;
    for task in tasks {
        fresh += usize::from(task.await.unwrap());
    }
    assert_eq!(fresh, 1);
    assert_eq!(db.rows(&run, "s1").await, 1);
    assert_eq!(common::effects(&format!("{run}/s1")), 1);
    db.drop().await;
}

#[tokio::test]
async fn without_a_pool_the_call_is_refused_and_says_how_to_give_one() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let run = common::unique("run");
    let refused = idem
        .scope("tenant-tx")
        .run(create_order(run.clone(), "s1".into(), "book".into(), 1))
        .await
        .expect_err("no pool");
    assert!(!refused.body_ran());
    assert!(refused.to_string().contains("use_sqlx"), "{refused}");
    assert_eq!(common::effects(&format!("{run}/s1")), 0);
    db.drop().await;
}
