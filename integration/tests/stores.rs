//! The shared stores when things go wrong: unreachable servers, refused credentials, missing
//! databases, a table dropped under a running store, a newer schema, a connection cut between
//! the claim and the completion. Every failure is a clear `StoreError` naming the backend and the
//! cause, never the key, and the tool body does not run.

mod common;

use common::{effect, effects, unique};
use idem::store::conformance::test_server_url;
use idem::store::{Claim, ClaimRequest, Completion, Fenced, Orphans, RecordStatus, Store};
use idem::{Error, Idem, OpenError, Outcome, StoreErrorKind, idempotent};

#[idempotent(key = "run_id", mutating, name = "stores.charge")]
async fn charge(run_id: String, amount_cents: u64) -> Result<u64, std::convert::Infallible> {
    effect(&run_id);
    Ok(amount_cents)
}

fn postgres_url() -> Option<String> {
    test_server_url("IDEM_TEST_POSTGRES_URL")
}

fn redis_url() -> Option<String> {
    test_server_url("IDEM_TEST_REDIS_URL")
}

/// The URL with `?option` or `&option` appended.
fn with_option(url: &str, option: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{option}")
}

/// `postgres://user@host:port/db` with the database replaced.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    if query.is_empty() {
        format!("{server}/{db}")
    } else {
        format!("{server}/{db}?{query}")
    }
}

/// Opening fails with a store error of `backend` and `kind`; its message names the cause.
fn expect_open_error(
    result: Result<Idem, OpenError>,
    backend: &str,
    kind: StoreErrorKind,
) -> String {
    let err = result.expect_err("the store must not open");
    let OpenError::Store(store) = &err else {
        panic!("expected a store error, got {err:?}")
    };
    assert_eq!(store.backend(), backend, "{err}");
    assert_eq!(store.kind(), kind, "{err}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("{backend} store: ")), "{text}");
    text
}

#[tokio::test]
async fn postgres_unreachable_wrong_role_and_wrong_database_are_clear() {
    let Some(url) = postgres_url() else { return };
    let text = expect_open_error(
        Idem::open("postgres://postgres:s3cret@127.0.0.1:1/test?connect_timeout=2").await,
        "postgres",
        StoreErrorKind::Unavailable,
    );
    assert!(text.contains("cannot reach the server"), "{text}");
    assert!(!text.contains("s3cret"), "no password in errors: {text}");

    let role = url.replacen("postgres://postgres", "postgres://no_such_role_idem", 1);
    let text = expect_open_error(
        Idem::open(&role).await,
        "postgres",
        StoreErrorKind::Unavailable,
    );
    assert!(text.contains("refused the credentials"), "{text}");

    let db = with_database(&url, "no_such_database_idem");
    let text = expect_open_error(
        Idem::open(&db).await,
        "postgres",
        StoreErrorKind::Unavailable,
    );
    assert!(text.contains("database does not exist"), "{text}");
}

#[tokio::test]
async fn redis_unreachable_wrong_password_and_wrong_database_are_clear() {
    let Some(url) = redis_url() else { return };
    let text = expect_open_error(
        Idem::open("redis://:s3cret@127.0.0.1:1/?timeout_ms=2000").await,
        "redis",
        StoreErrorKind::Unavailable,
    );
    assert!(text.contains("cannot reach the server"), "{text}");
    assert!(!text.contains("s3cret"), "no password in errors: {text}");

    let wrong_password = url.replacen("redis://", "redis://:wrong-password@", 1);
    let text = expect_open_error(
        Idem::open(&wrong_password).await,
        "redis",
        StoreErrorKind::Unavailable,
    );
    assert!(text.contains("refused the credentials"), "{text}");
    assert!(!text.contains("wrong-password"), "{text}");

    let base = url.split_once('?').map_or(url.as_str(), |(b, _)| b);
    let db = format!(
        "{}/9999",
        base.trim_end_matches(|c: char| c.is_ascii_digit())
            .trim_end_matches('/')
    );
    let text = expect_open_error(Idem::open(&db).await, "redis", StoreErrorKind::Unavailable);
    assert!(text.contains("database number does not exist"), "{text}");
}

#[tokio::test]
async fn postgres_dropped_table_fails_closed_then_reopening_repairs() {
    let Some(url) = postgres_url() else { return };
    let schema = format!("idem_test_{}", uuid::Uuid::new_v4().simple());
    let scoped = with_option(&url, &format!("schema={schema}"));
    let idem = Idem::open(&scoped).await.expect("open");
    let tenant = idem.scope(unique("tenant"));
    let run = unique("run");
    assert!(tenant.run(charge(run.clone(), 5)).await.unwrap().is_fresh());

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP TABLE \"{schema}\".idem_records CASCADE"))
        .await
        .expect("drop");

    let other = unique("run");
    let err = tenant.run(charge(other.clone(), 5)).await.unwrap_err();
    let Error::Store(store) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(store.backend(), "postgres");
    assert_eq!(store.kind(), StoreErrorKind::Schema, "{err}");
    assert!(err.to_string().contains("tables are missing"), "{err}");
    assert!(!err.to_string().contains(&other), "no key in: {err}");
    assert_eq!(effects(&other), 0, "the body did not run");

    let reopened = Idem::open(&scoped)
        .await
        .expect("reopening recreates the schema");
    let again = reopened
        .scope(unique("tenant"))
        .run(charge(other.clone(), 5))
        .await
        .unwrap();
    assert!(again.is_fresh());
    assert_eq!(effects(&other), 1);
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .expect("clean up");
}

#[tokio::test]
async fn postgres_version_1_schema_is_upgraded_with_its_records() {
    let Some(url) = postgres_url() else { return };
    let schema = format!("idem_test_{}", uuid::Uuid::new_v4().simple());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    // What version 1 left: its table (with the constraint Postgres named), its claim function
    // (one argument fewer), one record.
    client
        .batch_execute(&format!(
            r#"CREATE SCHEMA "{schema}";
            CREATE TABLE "{schema}".idem_meta (name text PRIMARY KEY, value integer NOT NULL);
            INSERT INTO "{schema}".idem_meta VALUES ('schema_version', 1);
            CREATE TABLE "{schema}".idem_records (
                tenant text NOT NULL, key bytea NOT NULL CHECK (length(key) = 32),
                tool text NOT NULL, fingerprint bytea NOT NULL CHECK (length(fingerprint) = 32),
                status text NOT NULL CHECK (status IN ('in_flight', 'completed')),
                token bigint NOT NULL, lease_expires_at bigint NOT NULL,
                created_at bigint NOT NULL, expires_at bigint NOT NULL, result bytea,
                PRIMARY KEY (tenant, key));
            CREATE FUNCTION "{schema}".idem_claim(p_tenant text, p_key bytea, p_tool text,
                p_fingerprint bytea, p_token bigint, p_now bigint, p_lease bigint, p_ttl bigint)
                RETURNS smallint LANGUAGE sql AS 'SELECT 0::smallint';
            INSERT INTO "{schema}".idem_records VALUES ('old', decode(repeat('ab', 32), 'hex'),
                'tool', decode(repeat('cd', 32), 'hex'), 'completed', 5, 0, 1,
                9000000000000, 'kept');"#
        ))
        .await
        .expect("a version 1 schema");

    let scoped = with_option(&url, &format!("schema={schema}"));
    let idem = Idem::open(&scoped).await.expect("open upgrades");
    let run = unique("run");
    assert!(
        idem.scope(unique("tenant"))
            .run(charge(run.clone(), 5))
            .await
            .unwrap()
            .is_fresh()
    );
    assert_eq!(effects(&run), 1);
    let one = |sql: String| {
        let client = &client;
        async move { client.query_one(&sql, &[]).await.expect(&sql) }
    };
    let version: i32 = one(format!(
        r#"SELECT value FROM "{schema}".idem_meta WHERE name = 'schema_version'"#
    ))
    .await
    .get(0);
    assert_eq!(version, 5, "upgraded to this build's version");
    let tables: bool = one(format!(
        r#"SELECT to_regclass('"{schema}".idem_chunks') IS NOT NULL
               AND to_regclass('"{schema}".idem_blobs') IS NOT NULL"#
    ))
    .await
    .get(0);
    assert!(
        tables,
        "the chunks of streams and the blobs have their tables"
    );
    let triggers: i64 = one(format!(
        r#"SELECT count(*) FROM pg_trigger WHERE tgrelid IN ('"{schema}".idem_records'::regclass,
               '"{schema}".idem_chunks'::regclass) AND tgname IN ('idem_records_drop_blob',
               'idem_records_move_blob', 'idem_chunks_drop_blob')"#
    ))
    .await
    .get(0);
    assert_eq!(triggers, 3, "the blobs' triggers");
    let chunk_blobs: bool = one(format!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid =
               '"{schema}".idem_chunks'::regclass AND attname = 'blob' AND NOT attisdropped)"#
    ))
    .await
    .get(0);
    assert!(chunk_blobs, "the chunks name blobs");
    let kept: Vec<u8> = one(format!(
        r#"SELECT result FROM "{schema}".idem_records WHERE tenant = 'old'"#
    ))
    .await
    .get(0);
    assert_eq!(kept, b"kept");
    let claims: i64 = one(format!(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = '{schema}' AND p.proname = 'idem_claim'"
    ))
    .await
    .get(0);
    assert_eq!(claims, 1, "the version 1 claim function is gone");
    client
        .batch_execute(&format!(
            r#"UPDATE "{schema}".idem_records SET status = 'unknown' WHERE tenant = 'old';
            DROP SCHEMA "{schema}" CASCADE"#
        ))
        .await
        .expect("`unknown` is accepted now");
}

/// The CHECK constraints earlier builds put on the table (Postgres parses them again at every
/// write) are dropped on open, once. Opening a table that is as it should be alters nothing, so
/// it does not wait behind a transaction that holds the table (a transactional tool's), nor
/// hold every claim queued behind its own lock meanwhile.
#[tokio::test]
async fn postgres_check_constraints_of_earlier_builds_are_dropped_once() {
    let Some(url) = postgres_url() else { return };
    let schema = format!("idem_test_{}", uuid::Uuid::new_v4().simple());
    let scoped = with_option(&url, &format!("schema={schema}"));
    let run = unique("run");
    let tenant = unique("tenant");
    {
        let idem = Idem::open(&scoped).await.expect("open");
        assert!(
            idem.scope(tenant.clone())
                .run(charge(run.clone(), 5))
                .await
                .unwrap()
                .is_fresh()
        );
    }
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let checks = async || -> i64 {
        client
            .query_one(
                &format!(
                    "SELECT count(*) FROM pg_constraint \
                     WHERE conrelid = '\"{schema}\".idem_records'::regclass AND contype = 'c'"
                ),
                &[],
            )
            .await
            .expect("constraints")
            .get(0)
    };
    assert_eq!(checks().await, 0, "a new table has no CHECK constraint");
    // The table as an earlier build made it.
    client
        .batch_execute(&format!(
            r#"ALTER TABLE "{schema}".idem_records
                ADD CONSTRAINT idem_records_key_check CHECK (length(key) = 32),
                ADD CONSTRAINT idem_records_fingerprint_check CHECK (length(fingerprint) = 32),
                ADD CONSTRAINT idem_records_status_check
                    CHECK (status IN ('in_flight', 'completed', 'unknown'))"#
        ))
        .await
        .expect("the earlier constraints");
    assert_eq!(checks().await, 3);
    let idem = Idem::open(&scoped).await.expect("open drops them");
    assert_eq!(checks().await, 0, "dropped on open");
    match idem
        .scope(tenant.clone())
        .run(charge(run.clone(), 5))
        .await
        .unwrap()
    {
        Outcome::Replayed(5) => {}
        other => panic!("the record survives: {other:?}"),
    }
    assert_eq!(effects(&run), 1);

    // A claim holds the table (as a transaction in flight does); opening again alters nothing,
    // so it does not wait for it.
    let (holder, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    holder
        .batch_execute(&format!(
            r#"BEGIN; LOCK TABLE "{schema}".idem_records IN ROW EXCLUSIVE MODE"#
        ))
        .await
        .expect("hold the table");
    let reopened = tokio::time::timeout(std::time::Duration::from_secs(20), Idem::open(&scoped))
        .await
        .expect("opening waited behind a transaction: it locked the table");
    drop(reopened.expect("open"));
    holder.batch_execute("ROLLBACK").await.expect("release");
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .expect("clean up");
}

#[tokio::test]
async fn postgres_newer_schema_is_refused_untouched() {
    let Some(url) = postgres_url() else { return };
    let schema = format!("idem_test_{}", uuid::Uuid::new_v4().simple());
    let scoped = with_option(&url, &format!("schema={schema}"));
    drop(Idem::open(&scoped).await.expect("open"));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "UPDATE \"{schema}\".idem_meta SET value = 99 WHERE name = 'schema_version'"
        ))
        .await
        .unwrap();
    let text = expect_open_error(
        Idem::open(&scoped).await,
        "postgres",
        StoreErrorKind::Schema,
    );
    assert!(text.contains("newer idem (schema version 99)"), "{text}");
    let version: i32 = client
        .query_one(
            &format!("SELECT value FROM \"{schema}\".idem_meta WHERE name = 'schema_version'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 99, "the newer schema was left as it was");
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

/// A claim taken before the connection is cut is completed after it, on a new connection.
#[tokio::test]
async fn postgres_connection_loss_between_claim_and_completion_keeps_the_claim() {
    let Some(url) = postgres_url() else { return };
    let app = format!("idem-test-{}", uuid::Uuid::new_v4().simple());
    let store = idem::store::postgres::PostgresStore::open_url(&with_option(
        &url,
        &format!("pool_size=1&application_name={app}"),
    ))
    .await
    .expect("open");
    let tenant = unique("tenant");
    let key = idem::derive_key(&tenant, "stores.direct", &[]);
    let request = ClaimRequest {
        tenant: &tenant,
        key,
        tool: "stores.direct",
        fingerprint: idem::Fingerprint::from_bytes([7; 32]),
        now: 1_000,
        lease: std::time::Duration::from_secs(30),
        ttl: std::time::Duration::from_secs(3600),
        orphans: Orphans::TakeOver,
    };
    let Claim::Acquired { token, .. } = store.claim(request).await.expect("claim") else {
        panic!("a new key is acquired")
    };

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let killed: i64 = client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&app],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "the store's one connection was cut");

    let done = store
        .complete(Completion {
            tenant: &tenant,
            key,
            token,
            status: RecordStatus::Completed,
            result: b"{\"ok\":5}",
            now: 1_001,
            ttl: std::time::Duration::from_secs(3600),
            notify: false,
        })
        .await
        .expect("the completion goes through on a new connection");
    assert_eq!(done, Fenced::Applied);
    assert_eq!(
        store
            .claim(ClaimRequest {
                now: 1_002,
                ..request
            })
            .await
            .unwrap(),
        Claim::Completed {
            result: b"{\"ok\":5}".to_vec()
        }
    );
}

#[tokio::test]
async fn shared_stores_replay_and_mismatch_through_the_macro() {
    for url in [postgres_url(), redis_url()].into_iter().flatten() {
        let idem = Idem::open(&url).await.expect("open");
        let tenant = idem.scope(unique("tenant"));
        let run = unique("run");
        let first = tenant.run(charge(run.clone(), 5)).await.unwrap();
        let second = tenant.run(charge(run.clone(), 5)).await.unwrap();
        let other = tenant.run(charge(run.clone(), 6)).await.unwrap();
        assert!(matches!(first, Outcome::Fresh(5)), "{url}: {first:?}");
        assert!(matches!(second, Outcome::Replayed(5)), "{url}: {second:?}");
        assert!(other.is_mismatch(), "{url}: {other:?}");
        assert_eq!(effects(&run), 1, "{url}");
    }
}

#[tokio::test]
async fn redis_health_says_whether_claims_survive_a_restart() {
    let Some(url) = redis_url() else { return };
    let idem = Idem::open(&url).await.expect("open");
    let health = idem.health().await.expect("health");
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(&mut conn)
        .await
        .unwrap();
    if info.contains("aof_enabled:0") {
        assert!(!health.durable);
        assert!(
            health
                .detail
                .as_deref()
                .unwrap_or("")
                .contains("appendonly no"),
            "{health:?}"
        );
        let audit = idem::audit(&idem).await;
        assert!(
            audit.to_string().contains("appendonly no"),
            "the startup audit warns: {audit}"
        );
    } else {
        assert!(health.detail.is_some() || health.durable, "{health:?}");
    }
}

#[tokio::test]
async fn redis_foreign_data_under_a_key_fails_closed() {
    let Some(url) = redis_url() else { return };
    let idem = Idem::open(&url).await.expect("open");
    let tenant_name = unique("tenant");
    let tenant = idem.scope(tenant_name.clone());
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for (n, foreign) in ["garbage", "hash"].into_iter().enumerate() {
        let run = unique("run");
        let key = idem::derive_key(
            &tenant_name,
            "stores.charge",
            &[idem::key::KeyPart::new(&run).unwrap()],
        );
        let record = format!(
            "idem:{{{}}}:{}",
            hex(tenant_name.as_bytes()),
            hex(key.as_bytes())
        );
        let _: () = if n == 0 {
            redis::cmd("SET")
                .arg(&record)
                .arg("not a record")
                .query_async(&mut conn)
                .await
        } else {
            redis::cmd("HSET")
                .arg(&record)
                .arg("f")
                .arg("v")
                .query_async(&mut conn)
                .await
        }
        .unwrap();
        let err = tenant.run(charge(run.clone(), 5)).await.unwrap_err();
        assert!(err.is_store(), "{foreign}: {err:?}");
        assert!(err.to_string().starts_with("redis store: claim: "), "{err}");
        assert!(!err.to_string().contains(&run), "no key in: {err}");
        assert_eq!(effects(&run), 0, "{foreign}: the body did not run");
        let _: () = redis::cmd("DEL")
            .arg(&record)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}
