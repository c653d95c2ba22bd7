//! A transactional tool: `create_order` inserts an order row in the same Postgres transaction
//! that claims its key and records its result, so the order exists exactly once per intent,
//! whatever happens to the call.
//!
//! ```text
//! cargo run -p idem-integration --example orders
//! ```
//!
//! It uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`), in a schema of its
//! own (`idem_orders_example`, dropped at the end): idem's records and the `orders` table side
//! by side.

use std::time::Duration;

use idem::store::postgres::tokio_postgres::{self, Transaction};
use idem::{Idem, idempotent};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Order {
    id: i64,
    item: String,
    quantity: i32,
}

#[derive(Debug, thiserror::Error)]
enum OrderError {
    #[error("out of stock")]
    OutOfStock,
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
}

/// The tool: its writes and its record commit together, or not at all.
#[idempotent(
    key = "run_id, step_id",
    mutating,
    transactional,
    name = "orders.create"
)]
async fn create_order(
    tx: &mut Transaction<'_>,
    run_id: String,
    step_id: String,
    item: String,
    quantity: i32,
) -> Result<Order, OrderError> {
    let row = tx
        .query_one(
            "INSERT INTO orders (item, quantity) VALUES ($1, $2) RETURNING id",
            &[&item, &quantity],
        )
        .await?;
    if quantity > 10 {
        // After the insert: the error takes the row back with it.
        return Err(OrderError::OutOfStock);
    }
    // Something slow after the write (a price lookup, a call that times out…).
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(Order {
        id: row.get(0),
        item,
        quantity,
    })
}

const SCHEMA: &str = "idem_orders_example";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA};
             CREATE TABLE {SCHEMA}.orders (id bigserial PRIMARY KEY, item text NOT NULL,
                                           quantity int NOT NULL);"
        ))
        .await?;
    // idem's records in the same schema; `search_path` lets the tool say `orders`.
    let sep = if url.contains('?') { '&' } else { '?' };
    let idem = Idem::open(&format!(
        "{url}{sep}schema={SCHEMA}&options=-csearch_path%3D{SCHEMA}"
    ))
    .await?;
    let tenant = idem.scope("shop-1");
    let orders = async || -> Result<i64, tokio_postgres::Error> {
        let row = client
            .query_one(&format!("SELECT count(*) FROM {SCHEMA}.orders"), &[])
            .await?;
        Ok(row.get(0))
    };

    // 1. A call and its retry: one order, the retry replays it.
    let call = || create_order("run-7".into(), "step-1".into(), "tent".into(), 2);
    let first = tenant.run(call()).await?;
    let retry = tenant.run(call()).await?;
    println!(
        "first call: {:?}, retry: replayed = {}, orders: {}",
        first.value(),
        retry.is_replayed(),
        orders().await?
    );

    // 2. A call cancelled after its insert (the agent's timeout fired): nothing is left, and
    //    the retry simply runs.
    let step2 = || create_order("run-7".into(), "step-2".into(), "stove".into(), 1);
    let cancelled = tokio::time::timeout(Duration::from_millis(20), tenant.run(step2())).await;
    println!(
        "cancelled mid-body: {}, orders: {}",
        cancelled.is_err(),
        orders().await?
    );
    let retried = tenant.run(step2()).await?;
    println!(
        "its retry: fresh = {}, orders: {}",
        retried.is_fresh(),
        orders().await?
    );

    // 3. An error after the insert: rolled back with the claim; a corrected call runs.
    let too_many = tenant
        .run(create_order(
            "run-7".into(),
            "step-3".into(),
            "lamp".into(),
            50,
        ))
        .await;
    println!(
        "error after the insert: {}, orders: {}",
        too_many.err().map(|e| e.to_string()).unwrap_or_default(),
        orders().await?
    );

    // 4. Eight concurrent calls of one intent: one runs, the others wait for its commit and
    //    replay it.
    let calls = (0..8).map(|_| {
        let tenant = tenant.clone();
        tokio::spawn(async move {
            let call = create_order("run-8".into(), "step-1".into(), "rope".into(), 3);
            tenant.run(call).await
        })
    });
    let mut fresh = 0;
    for call in calls.collect::<Vec<_>>() {
        fresh += usize::from(call.await??.is_fresh());
    }
    println!(
        "8 concurrent calls: {fresh} ran, {} replayed, orders: {}",
        8 - fresh,
        orders().await?
    );

    let total = orders().await?;
    assert_eq!(total, 3, "tent, stove, rope: one order each");
    println!("{total} orders for 3 intents, each exactly once");
    client
        .batch_execute(&format!("DROP SCHEMA {SCHEMA} CASCADE"))
        .await?;
    Ok(())
}
