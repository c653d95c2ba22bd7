// A transactional tool: the transaction is filled in by idem (callers pass the arguments only),
// taken `&mut` or `&`, on a free function or a method, on tokio-postgres or sqlx, and the call
// is a `Send` future.
use idem::store::postgres::tokio_postgres::{Error, Transaction};
use idem::{Idem, idempotent};

#[idempotent(key = "run_id, step_id", mutating, transactional, name = "orders.create")]
async fn create_order(
    tx: &mut Transaction<'_>,
    run_id: String,
    step_id: String,
    item: String,
) -> Result<i64, Error> {
    let row = tx
        .query_one("INSERT INTO orders (item) VALUES ($1) RETURNING id", &[&item])
        .await?;
    Ok(row.get(0))
}

#[idempotent(
    key = "run_id",
    mutating,
    transactional,
    wait = "500ms",
    on_error = "store",
    name = "orders.cancel"
)]
async fn cancel_order(tx: &Transaction<'_>, run_id: String, order_id: i64) -> Result<u64, String> {
    tx.execute("DELETE FROM orders WHERE id = $1", &[&order_id])
        .await
        .map_err(|e| e.to_string())
}

/// On sqlx: the transaction's connection, as in any sqlx transaction.
#[idempotent(key = "run_id", mutating, transactional, name = "orders.sqlx")]
async fn create_order_sqlx(
    tx: &mut sqlx::PgConnection,
    run_id: String,
    item: String,
) -> Result<i64, String> {
    sqlx::query_scalar("INSERT INTO orders (item) VALUES ($1) RETURNING id")
        .bind(&item)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| e.to_string())
}

struct Orders {
    table: &'static str,
}

impl Orders {
    #[idempotent(key = "run_id", mutating, transactional, name = "orders.count")]
    async fn touch(&self, tx: &mut Transaction<'_>, run_id: String) -> Result<i64, Error> {
        let row = tx
            .query_one(&format!("SELECT count(*) FROM {}", self.table), &[])
            .await?;
        Ok(row.get(0))
    }
}

fn assert_send<T: Send + 'static>(_: &T) {}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let scope = idem.scope("t");
    let fut = scope.run(create_order("r".into(), "s".into(), "book".into()));
    assert_send(&fut);
    // Not the Postgres store: refused before the body runs.
    let refused = tokio::spawn(fut).await.unwrap().unwrap_err();
    assert!(!refused.body_ran());
    assert!(scope.run(cancel_order("r".into(), 1)).await.is_err());
    let fut = scope.run(create_order_sqlx("r".into(), "tent".into()));
    assert_send(&fut);
    assert!(tokio::spawn(fut).await.unwrap().is_err());
    let orders = Orders { table: "orders" };
    assert!(scope.run(orders.touch("r".into())).await.is_err());
}
