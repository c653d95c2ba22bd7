//! The durable engine a user writes: the `checkpoint_loop` example's worker (a workflow loop that
//! checkpoints each step in its own Postgres table and resumes from the last one), killed with
//! SIGKILL at random moments of its steps (before the effect, inside it after the effect, after it
//! before the checkpoint) and started again until every workflow is done. The effect is a row in
//! a ledger table that is not idem's store. With idem every step's effect is there exactly once;
//! the same loop without idem leaves duplicates.
//!
//! Needs `IDEM_TEST_POSTGRES_URL` (skipped without, unless `IDEM_REQUIRE_BACKENDS=1`); each run
//! in schemas of its own. `IDEM_CHECKPOINT_ORDERS` sets the number of workflows (default 34, of
//! three steps each: 102 steps).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

#[path = "common/examples.rs"]
mod examples;

use examples::{example, kills_by_point};
use idem::store::conformance::test_server_url;
use idem::store::postgres::tokio_postgres::{self, NoTls};

/// Runs workers until one finishes every workflow; returns how many were killed.
fn run_to_the_end(url: &str, schema: &str, orders: usize, bare: bool, crashes: &Path) -> usize {
    let mut killed = 0;
    loop {
        let status = Command::new(example("checkpoint_loop"))
            .args(["work", &orders.to_string()])
            .env("DATABASE_URL", url)
            .env("SCHEMA", schema)
            .env("BARE", if bare { "1" } else { "0" })
            .env("CRASH_DIR", crashes)
            .env("CRASH_PERCENT", "30")
            .status()
            .unwrap();
        if status.success() {
            return killed;
        }
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "a worker failed rather than being killed: {status}"
        );
        killed += 1;
        assert!(killed < 10 * orders * 3, "the workers never finish");
    }
}

async fn ledger(
    url: &str,
    schema: &str,
) -> (tokio_postgres::Client, BTreeMap<(String, String), i64>) {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let rows = client
        .query(
            &format!("SELECT order_id, step, count(*) FROM {schema}.ledger GROUP BY 1, 2"),
            &[],
        )
        .await
        .unwrap();
    let counts = rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    (client, counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_happens_once_with_idem_and_some_twice_without_under_kills() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let orders: usize = std::env::var("IDEM_CHECKPOINT_ORDERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(34);
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut figures = Vec::new();
    for bare in [false, true] {
        let schema = format!("idem_ckpt_{}_{tag}", if bare { "bare" } else { "idem" });
        let crashes = tempfile::tempdir().unwrap();
        let killed = run_to_the_end(&url, &schema, orders, bare, crashes.path());
        let (client, counts) = ledger(&url, &schema).await;
        let by_point = kills_by_point(crashes.path(), "order-");
        let checkpoints: i64 = client
            .query_one(&format!("SELECT count(*) FROM {schema}.checkpoints"), &[])
            .await
            .unwrap()
            .get(0);
        client
            .batch_execute(&format!(
                "DROP SCHEMA {schema} CASCADE; DROP SCHEMA IF EXISTS {schema}_idem CASCADE;"
            ))
            .await
            .unwrap();
        assert_eq!(checkpoints as usize, orders * 3, "every step checkpointed");
        assert_eq!(counts.len(), orders * 3, "no step lost");
        let extra: i64 = counts.values().map(|n| n - 1).sum();
        figures.push(format!(
            "{}: {killed} kills {by_point:?}, {extra} extra effects",
            if bare { "without idem" } else { "with idem" }
        ));
        if bare {
            assert!(
                extra > 0,
                "the loop alone repeats a step killed after its effect"
            );
        } else {
            for point in ["before", "inside", "after"] {
                assert!(
                    by_point.get(point).copied().unwrap_or(0) > 0,
                    "no kill {point} the effect: the test proves nothing ({by_point:?})"
                );
            }
            assert_eq!(extra, 0, "each step's effect exactly once ({by_point:?})");
        }
    }
    eprintln!(
        "checkpoint loop kill test, {orders} workflows of 3 steps: {}",
        figures.join("; ")
    );
}
