//! The Postgres store behind a transaction pooler: a private PgBouncer (`pool_mode =
//! transaction`, two server connections shared by every client) in front of the test server,
//! and `?pooler=transaction` in the URL. The whole conformance suite runs through it, and so does
//! the cross-process race (4 processes × 16 tasks × 200 intents, every effect exactly once).
//! Without `pooler=transaction`, opening through PgBouncer is refused with an error that names the
//! option.
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
