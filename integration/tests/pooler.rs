//! The Postgres store behind a transaction pooler: a private PgBouncer (`pool_mode =
//! transaction`, two server connections shared by every client) in front of the test server,
//! and `?pooler=transaction` in the URL. The whole conformance suite runs through it, and so does
//! the cross-process race (4 processes × 16 tasks × 200 intents, every effect exactly once).
//! Without `pooler=transaction`, opening through PgBouncer is refused with an error that names the
//! option. A transactional tool's transactions (the claim, its write and the record) go through it
//! too, each intent's row written once.
//!
//! Needs `pgbouncer` (Debian's package; `.ci/run` installs it); runs when
//! `IDEM_TEST_POSTGRES_URL` names a server.

#[path = "common/race.rs"]
mod race;
#[path = "common/servers.rs"]
mod servers;

use std::sync::OnceLock;

use idem::store::conformance::test_server_url;
use idem::store::postgres::PostgresStore;
use servers::PrivateBouncer;

#[test]
#[ignore = "run by the race below as a child process"]
fn worker() {
    race::worker_main();
}

/// The pooler of this test binary (it dies with the process), and the database and user behind.
fn bouncer() -> Option<&'static (PrivateBouncer, String, String)> {
    static BOUNCER: OnceLock<(PrivateBouncer, String, String)> = OnceLock::new();
    let upstream = test_server_url("IDEM_TEST_POSTGRES_URL")?;
    Some(BOUNCER.get_or_init(|| {
        let config: tokio_postgres::Config = upstream.parse().unwrap();
        let database = config.get_dbname().unwrap().to_owned();
        let user = config.get_user().unwrap().to_owned();
        (PrivateBouncer::start(&upstream, 2), user, database)
    }))
}

fn pooled_url(schema: &str) -> Option<String> {
    let (bouncer, user, database) = bouncer()?;
    Some(format!(
        "{}?pooler=transaction&schema={schema}",
        bouncer.url(user, database)
    ))
}

mod conformance {
    async fn store() -> Option<super::PostgresStore> {
        let url = super::pooled_url("idem_pooler")?;
        Some(
            super::PostgresStore::open_url(&url)
                .await
                .expect("the store opens through PgBouncer"),
        )
    }
    idem::store_conformance_tests!(maybe: store());
    idem::admin_conformance_tests!(maybe: store());
}

#[test]
fn processes_racing_through_the_pooler_run_every_effect_once() {
    let schema = format!("idem_pooler_race_{}", std::process::id());
    let Some(url) = pooled_url(&schema) else {
        return;
    };
    race::race_once(url);
    let upstream = test_server_url("IDEM_TEST_POSTGRES_URL").unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (client, connection) = tokio_postgres::connect(&upstream, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    });
}

#[tokio::test]
async fn without_the_pooler_option_the_error_names_it() {
    let Some(url) = pooled_url("idem_pooler") else {
        return;
    };
    let plain = url.replace("pooler=transaction&", "");
    let error = PostgresStore::open_url(&plain)
        .await
        .expect_err("PgBouncer refuses the session setting");
    assert!(error.to_string().contains("pooler=transaction"), "{error}");
}

/// The schema of the transactional test (its tool names its table in it: PgBouncer refuses a
/// `search_path` startup option).
static TX_SCHEMA: OnceLock<String> = OnceLock::new();

#[idem::idempotent(key = "intent", mutating, transactional, name = "pooler.order")]
async fn place_order(
    tx: &mut idem::store::postgres::tokio_postgres::Transaction<'_>,
    intent: u32,
) -> Result<i64, idem::store::postgres::tokio_postgres::Error> {
    let schema = TX_SCHEMA.get().expect("set by the test");
    let row = tx
        .query_one(
            &format!("INSERT INTO {schema}.orders (intent) VALUES ($1) RETURNING id"),
            &[&i64::from(intent)],
        )
        .await?;
    Ok(row.get(0))
}

/// A transactional tool through the pooler: 8 tasks calling the same 40 intents, each in its
/// own order; the claim, the order and the record commit in one pooled transaction, and every
/// intent has exactly one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_tool_through_the_pooler_writes_each_order_once() {
    let schema = TX_SCHEMA.get_or_init(|| format!("idem_pooler_tx_{}", std::process::id()));
    let Some(url) = pooled_url(schema) else {
        return;
    };
    let upstream = test_server_url("IDEM_TEST_POSTGRES_URL").unwrap();
    let (client, connection) = tokio_postgres::connect(&upstream, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let idem = idem::Idem::open(&url)
        .await
        .expect("open through PgBouncer");
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.orders (id bigserial PRIMARY KEY, intent bigint NOT NULL)"
        ))
        .await
        .unwrap();
    const INTENTS: u32 = 40;
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..8u32 {
        let scope = idem.scope("tenant-pooler-tx");
        tasks.spawn(async move {
            let mut fresh = 0;
            for i in 0..INTENTS {
                let intent = (i + task * 7) % INTENTS;
                loop {
                    let out = scope.run(place_order(intent)).await.expect("no error");
                    if !out.is_in_flight() {
                        fresh += usize::from(out.is_fresh());
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
            fresh
        });
    }
    let mut fresh = 0;
    while let Some(done) = tasks.join_next().await {
        fresh += done.unwrap();
    }
    let rows = client
        .query(
            &format!("SELECT intent, count(*) FROM {schema}.orders GROUP BY intent"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), INTENTS as usize, "every intent has its order");
    assert!(rows.iter().all(|r| r.get::<_, i64>(1) == 1), "and only one");
    assert_eq!(fresh, INTENTS as usize);
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
