//! Transactional tools (`#[idempotent(…, transactional)]`) on Postgres: the claim, the tool's own
//! writes and the record commit together. Every test counts the tool's rows in its own table
//! (the effect) and reads the record as an operator would.
//!
//! Each test has a schema of its own (the store's and the tool's tables in it), dropped at the
//! end. One test binary:
//!
//! | file | what |
//! |---|---|
//! | `contract.rs` | commit together, roll back together, stored errors, 64 concurrent calls, waits, cancellation, another store refused, optional keys |
//! | `race.rs` | four processes racing on the same intents; a completion that fails |
//! | `on_sqlx.rs` | the same tools on sqlx (feature `sqlx`) |
//!
//! The database, the tools and the helpers below are shared by the three.

use std::sync::Arc;
use std::time::Duration;

use idem::store::RecordStatus;
use idem::store::postgres::PostgresStore;
use idem::store::postgres::tokio_postgres::{self, Transaction};
use idem::{Idem, derive_key, idempotent, key::KeyPart};
use serde::{Deserialize, Serialize};

#[path = "../common/mod.rs"]
mod common;
mod contract;
#[cfg(feature = "sqlx")]
mod on_sqlx;
mod race;

/// A database of its own for one test: a schema holding idem's records and the `orders` table.
struct Db {
    url: String,
    schema: String,
    client: tokio_postgres::Client,
}

impl Db {
    async fn new() -> Option<Db> {
        let url = idem::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL")?;
        let schema = format!("idem_tx_{}", uuid::Uuid::new_v4().simple());
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; CREATE TABLE {schema}.orders (
                     id bigserial PRIMARY KEY, run_id text NOT NULL, step_id text NOT NULL,
                     item text NOT NULL, qty int NOT NULL)"
            ))
            .await
            .expect("create the orders table");
        Some(Db {
            url,
            schema,
            client,
        })
    }

    /// The store's URL, in this schema (`search_path` too, so the tool's SQL says `orders`).
    fn store_url(&self, extra: &str) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!(
            "{}{sep}schema={s}&options=-csearch_path%3D{s}{extra}",
            self.url,
            s = self.schema
        )
    }

    async fn idem(&self) -> Idem {
        Idem::open(&self.store_url("")).await.expect("open")
    }

    /// The rows of one intent.
    async fn rows(&self, run_id: &str, step_id: &str) -> i64 {
        self.client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {}.orders WHERE run_id = $1 AND step_id = $2",
                    self.schema
                ),
                &[&run_id, &step_id],
            )
            .await
            .expect("count")
            .get(0)
    }

    async fn all_rows(&self) -> i64 {
        self.client
            .query_one(&format!("SELECT count(*) FROM {}.orders", self.schema), &[])
            .await
            .expect("count")
            .get(0)
    }

    async fn drop(self) {
        self.client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await
            .expect("drop the schema");
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: i64,
    item: String,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize, PartialEq)]
enum OrderError {
    #[error("database: {0}")]
    Database(String),
    #[error("out of stock")]
    OutOfStock,
}

impl From<tokio_postgres::Error> for OrderError {
    fn from(e: tokio_postgres::Error) -> Self {
        OrderError::Database(e.to_string())
    }
}

/// Inserts the order (one effect), then answers: `qty` 0 is out of stock, after the insert (the
/// error must take the row back with it).
async fn insert_order(
    tx: &Transaction<'_>,
    run_id: String,
    step_id: String,
    item: String,
    qty: i32,
) -> Result<Order, OrderError> {
    common::effect(&format!("{run_id}/{step_id}"));
    // The body runs as the call: downstream keys are there, as in every keyed tool.
    let downstream = idem::current().expect("a transactional body knows its call");
    assert_eq!(downstream.derive("stripe").as_str().len(), 64);
    let row = tx
        .query_one(
            "INSERT INTO orders (run_id, step_id, item, qty) VALUES ($1, $2, $3, $4) RETURNING id",
            &[&run_id, &step_id, &item, &qty],
        )
        .await?;
    if qty == 0 {
        return Err(OrderError::OutOfStock);
    }
    Ok(Order {
        id: row.get(0),
        item,
    })
}

/// The tool over [`insert_order`].
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
    qty: i32,
) -> Result<Order, OrderError> {
    insert_order(tx, run_id, step_id, item, qty).await
}

/// The same, storing its errors: an out-of-stock answer is kept and replayed, its row is not.
#[idempotent(
    key = "run_id, step_id",
    mutating,
    transactional,
    on_error = "store",
    name = "orders.create_stored"
)]
async fn create_order_storing_errors(
    tx: &Transaction<'_>,
    run_id: String,
    step_id: String,
    item: String,
    qty: i32,
) -> Result<Order, OrderError> {
    insert_order(tx, run_id, step_id, item, qty).await
}

/// Inserts, then holds its transaction open for `hold_ms`.
#[idempotent(
    key = "run_id",
    mutating,
    transactional,
    wait = "300ms",
    name = "orders.slow"
)]
async fn slow_order(
    tx: &mut Transaction<'_>,
    run_id: String,
    hold_ms: u64,
) -> Result<i64, OrderError> {
    common::effect(&run_id);
    let row = tx
        .query_one(
            "INSERT INTO orders (run_id, step_id, item, qty) VALUES ($1, 's', 'slow', 1) \
             RETURNING id",
            &[&run_id],
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    Ok(row.get(0))
}

async fn record_status(
    idem: &Idem,
    tool: &str,
    run_id: &str,
    step_id: &str,
) -> Option<RecordStatus> {
    let parts = [
        KeyPart::new(run_id).unwrap(),
        KeyPart::new(step_id).unwrap(),
    ];
    let key = derive_key("tenant-tx", tool, &parts);
    idem.store()
        .lookup("tenant-tx", key)
        .await
        .expect("lookup")
        .map(|r| r.status)
}
