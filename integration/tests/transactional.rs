//! Transactional tools (`#[idempotent(…, transactional)]`) on Postgres: the claim, the tool's own
//! writes and the record commit together. Every test counts the tool's rows in its own table
//! (the effect) and reads the record as an operator would.
//!
//! Each test has a schema of its own (the store's and the tool's tables in it), dropped at the
//! end.

use std::sync::Arc;
use std::time::Duration;

use idem::store::RecordStatus;
use idem::store::postgres::PostgresStore;
use idem::store::postgres::tokio_postgres::{self, Transaction};
use idem::{Idem, derive_key, idempotent, key::KeyPart};
use serde::{Deserialize, Serialize};

mod common;

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

/// One order per intent, for the race between processes.
#[idempotent(key = "intent", mutating, transactional, name = "orders.race")]
async fn race_order(tx: &mut Transaction<'_>, intent: u32) -> Result<i64, OrderError> {
    let row = tx
        .query_one(
            "INSERT INTO orders (run_id, step_id, item, qty) VALUES ('race', $1, 'race', 1) \
             RETURNING id",
            &[&intent.to_string()],
        )
        .await?;
    Ok(row.get(0))
}

const PROCESSES: usize = 4;
const TASKS: u32 = 16;
const INTENTS: u32 = 200;

/// One process of the race: 16 tasks calling every intent, each in its own order, until each
/// answers `Fresh` or `Replayed`. Prints how many were fresh, replayed, and answered in flight.
#[test]
#[ignore = "run by `four_processes_race_on_the_same_intents_and_write_each_once` as a child"]
fn race_worker() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (fresh, replayed, in_flight) = runtime.block_on(async {
        let url = std::env::var("IDEM_RACE_URL").expect("set by the parent");
        let idem = Idem::open(&url).await.expect("open");
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..TASKS {
            let scope = idem.scope("tenant-race");
            tasks.spawn(async move {
                let (mut fresh, mut replayed, mut in_flight) = (0, 0, 0);
                for i in 0..INTENTS {
                    let intent = (i + task * 37) % INTENTS;
                    loop {
                        let out = scope.run(race_order(intent)).await.expect("no error");
                        if out.is_in_flight() {
                            in_flight += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        fresh += usize::from(out.is_fresh());
                        replayed += usize::from(out.is_replayed());
                        break;
                    }
                }
                (fresh, replayed, in_flight)
            });
        }
        let mut total = (0, 0, 0);
        while let Some(done) = tasks.join_next().await {
            let (f, r, i) = done.unwrap();
            total = (total.0 + f, total.1 + r, total.2 + i);
        }
        total
    });
    println!("COUNTS {fresh} {replayed} {in_flight}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_race_on_the_same_intents_and_write_each_once() {
    let Some(db) = Db::new().await else { return };
    // The schema is created by the first process to open it; open it once here first.
    let _ = db.idem().await;
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["race_worker", "--exact", "--ignored", "--nocapture"])
                .env("IDEM_RACE_URL", db.store_url(""))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let (mut fresh, mut replayed, mut in_flight) = (0, 0, 0);
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find(|l| l.starts_with("COUNTS "))
            .expect("counts");
        let n: Vec<usize> = line[7..]
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        (fresh, replayed, in_flight) = (fresh + n[0], replayed + n[1], in_flight + n[2]);
    }
    let rows = db
        .client
        .query(
            &format!(
                "SELECT step_id, count(*) FROM {}.orders WHERE run_id = 'race' GROUP BY step_id",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let twice = rows.iter().filter(|r| r.get::<_, i64>(1) != 1).count();
    println!(
        "{PROCESSES} processes x {TASKS} tasks x {INTENTS} intents: {} intents with rows, {twice} \
         with more than one; {fresh} fresh, {replayed} replayed, {in_flight} in flight (retried)",
        rows.len()
    );
    assert_eq!(rows.len(), INTENTS as usize, "every intent has its row");
    assert_eq!(twice, 0, "no intent has two");
    assert_eq!(fresh, INTENTS as usize, "one fresh call per intent");
    assert_eq!(
        fresh + replayed,
        PROCESSES * TASKS as usize * INTENTS as usize,
        "every call answered"
    );
    db.drop().await;
}

/// Inserts an order, and with `vandal` also deletes idem's records in its own transaction: its
/// completion then finds no row to complete.
#[idempotent(
    key = "run_id",
    mutating,
    transactional,
    skip = "vandal",
    name = "orders.vandal"
)]
async fn vandal_order(
    tx: &mut Transaction<'_>,
    run_id: String,
    vandal: bool,
) -> Result<i64, OrderError> {
    common::effect(&run_id);
    let row = tx
        .query_one(
            "INSERT INTO orders (run_id, step_id, item, qty) VALUES ($1, 'v', 'v', 1) RETURNING id",
            &[&run_id],
        )
        .await?;
    if vandal {
        tx.execute("DELETE FROM idem_records", &[]).await?;
    }
    Ok(row.get(0))
}

#[tokio::test]
async fn a_completion_that_fails_takes_the_writes_with_it() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let scope = idem.scope("tenant-tx");
    let run = common::unique("run");
    let failed = scope
        .run(vandal_order(run.clone(), true))
        .await
        .expect_err("nothing to complete");
    assert!(
        matches!(failed, idem::Error::NotCommitted { .. }),
        "{failed:?}"
    );
    assert!(failed.body_ran());
    assert_eq!(db.rows(&run, "v").await, 0, "the insert rolled back");
    let retry = scope
        .run(vandal_order(run.clone(), false))
        .await
        .expect("retry");
    assert!(retry.is_fresh());
    assert_eq!(db.rows(&run, "v").await, 1);
    assert_eq!(
        common::effects(&run),
        2,
        "the body ran twice, its writes once"
    );
    db.drop().await;
}

/// The same tools on sqlx: the body gets the transaction's `PgConnection`, from the pool the
/// application handed the store.
#[cfg(feature = "sqlx")]
mod on_sqlx {
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
}
