//! Large results on SQLite, Postgres and Redis, through the runtime (see
//! `idem_core::store::blob`).
//!
//! - A 10 MiB result round-trips: the fresh call returns it, a retry (through a second store on
//!   the same database, as another process would) replays it byte-identical, the body ran once,
//!   and the store holds it once, as one blob.
//! - 100 calls that return the same 1 MiB result store it once: the store's blobs count one blob
//!   of 1 MiB, and the store's own measure of its size (SQLite's pages, Postgres's
//!   relation sizes, Redis's `MEMORY USAGE` of every key of the test's prefix) stays near 1 MiB,
//!   not 100.
//! - Purging the records (SQL stores: expired records, by the store's purge; Redis: an
//!   operator's deletions, since Redis expires records on its own) leaves no blob behind.
//! - A stream of 30 chunks of 256 KiB, three distinct ones in turn, stores three blobs; a retry
//!   through a second store replays the 30 byte-identical; deleting the record leaves none.

use std::sync::Arc;

use idem::clock::{Clock, SystemClock};
use idem::key::KeyPart;
use idem::store::admin::AdminStore;
use idem::store::blob::BlobUsage;
use idem::store::conformance::test_server_url;
use idem::store::postgres::PostgresStore;
use idem::store::redis::RedisStore;
use idem::store::sqlite::SqliteStore;
use idem::{Emitter, Idem, derive_key, idempotent};

const MIB: usize = 1 << 20;

/// How many times the body of each run ran (the tests run in parallel, each on its own runs).
static RUNS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn ran(run_id: &str) -> usize {
    RUNS.lock().unwrap().iter().filter(|r| *r == run_id).count()
}

/// `len` characters that differ with `seed`, from a small generator (so no store compresses them
/// away: 64 letters, six bits of each byte).
fn document(len: usize, seed: u64) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[(state >> 58) as usize])
        })
        .collect()
}

/// Exports a document of `size` characters (the same for the same `seed`).
#[idempotent(key = "run_id", mutating, name = "large.export")]
async fn export(run_id: String, size: usize, seed: u64) -> Result<String, std::io::Error> {
    RUNS.lock().unwrap().push(run_id);
    Ok(document(size, seed))
}

/// Streams `count` chunks of `size` characters: chunk `n` is the document of seed `n % 3`.
#[idempotent(key = "run_id", mutating, name = "large.chapters")]
async fn chapters(
    run_id: String,
    count: u64,
    size: usize,
    out: Emitter<String>,
) -> Result<u64, std::io::Error> {
    RUNS.lock().unwrap().push(run_id);
    for n in 0..count {
        out.emit(document(size, n % 3)).await;
    }
    Ok(count)
}

fn run_id() -> String {
    format!("run-{}", uuid::Uuid::new_v4().simple())
}

fn tenant() -> String {
    format!("large-{}", uuid::Uuid::new_v4().simple())
}

async fn usage(store: &dyn AdminStore, tenant: &str) -> BlobUsage {
    store.blob_usage(Some(tenant)).await.unwrap()
}

/// A 10 MiB result: fresh, then replayed whole by another store on the same database.
async fn a_10_mib_result_round_trips(first: Arc<dyn AdminStore>, second: Arc<dyn AdminStore>) {
    let tenant = tenant();
    let run = run_id();
    let expected = document(10 * MIB, 10);
    let fresh = Idem::with_store(first.clone())
        .scope(tenant.as_str())
        .run(export(run.clone(), 10 * MIB, 10))
        .await
        .unwrap();
    assert!(fresh.is_fresh());
    assert!(
        fresh.value() == Some(&expected),
        "the fresh call returns it"
    );
    let again = Idem::with_store(second)
        .scope(tenant.as_str())
        .run(export(run.clone(), 10 * MIB, 10))
        .await
        .unwrap();
    assert!(again.is_replayed(), "{again:?}");
    assert!(
        again.value() == Some(&expected),
        "the replay is byte-identical"
    );
    assert_eq!(ran(&run), 1, "the body ran once");
    let held = usage(&*first, &tenant).await;
    assert_eq!(held.blobs, 1, "one blob");
    assert!(
        held.bytes >= 10 * MIB as u64 && held.bytes < 10 * MIB as u64 + 1024,
        "the blob is the encoded result: {held:?}"
    );
}

/// 30 chunks of 256 KiB, three distinct: three blobs, a byte-identical replay through another
/// store on the same database, and none once the record is deleted.
async fn large_chunks_are_stored_once(first: Arc<dyn AdminStore>, second: Arc<dyn AdminStore>) {
    let tenant = tenant();
    let run = run_id();
    let size = 256 * 1024;
    let expected: Vec<String> = (0..30).map(|n| document(size, n % 3)).collect();
    let fresh = Idem::with_store(first.clone())
        .scope(tenant.as_str())
        .run(chapters(run.clone(), 30, size))
        .await
        .unwrap();
    let (chunks, end) = fresh.into_value().unwrap().collect().await.unwrap();
    assert_eq!(end, 30);
    assert!(chunks == expected, "the fresh call's chunks");
    let held = usage(&*first, &tenant).await;
    assert_eq!(
        held.blobs, 3,
        "three distinct chunks, three blobs: {held:?}"
    );
    assert!(
        held.bytes >= 3 * size as u64 && held.bytes < 3 * size as u64 + 1024,
        "each blob is an encoded chunk: {held:?}"
    );
    let again = Idem::with_store(second)
        .scope(tenant.as_str())
        .run(chapters(run.clone(), 30, size))
        .await
        .unwrap();
    assert!(again.is_replayed(), "{again:?}");
    let (replayed, end) = again.into_value().unwrap().collect().await.unwrap();
    assert_eq!(end, 30);
    assert!(replayed == expected, "the replay is byte-identical");
    assert_eq!(ran(&run), 1, "the body ran once");
    let key = derive_key(&tenant, "large.chapters", &[KeyPart::new(&run).unwrap()]);
    first.delete(&tenant, key).await.unwrap();
    assert_eq!(
        usage(&*first, &tenant).await,
        BlobUsage::default(),
        "no blob left"
    );
}

/// What a store occupies by its own measure, in bytes.
type Size = std::pin::Pin<Box<dyn std::future::Future<Output = u64> + Send>>;

/// How the records are purged.
#[derive(Clone, Copy)]
enum Purge {
    /// The store's purge of expired records, two days from now (SQL stores).
    Expired,
    /// An operator's deletions (Redis expires records on its own, a day from now).
    Deleted,
}

/// 100 calls returning the same 1 MiB: one blob, and a store that grew by about 1 MiB (as
/// `measure` says); then purging the records leaves no blob.
async fn identical_results_are_stored_once(
    store: Arc<dyn AdminStore>,
    measure: impl Fn() -> Size,
    purge: Purge,
) {
    let tenant = tenant();
    let before = measure().await;
    let idem = Idem::with_store(store.clone());
    let runs: Vec<String> = (0..100).map(|_| run_id()).collect();
    let expected = document(MIB, 1);
    for run in &runs {
        let out = idem
            .scope(tenant.as_str())
            .run(export(run.clone(), MIB, 1))
            .await
            .unwrap();
        assert!(out.is_fresh() && out.value() == Some(&expected));
    }
    let held = usage(&*store, &tenant).await;
    assert_eq!(held.blobs, 1, "100 identical results, one blob");
    let grown = measure().await.saturating_sub(before);
    eprintln!(
        "{}: 100 calls returning the same 1 MiB: {} blob of {} bytes; the store grew by {grown} \
         bytes ({:.2} MiB)",
        store.backend(),
        held.blobs,
        held.bytes,
        grown as f64 / MIB as f64
    );
    assert!(
        grown < 4 * MIB as u64,
        "{}: the store grew by {grown} bytes for 100 identical 1 MiB results",
        store.backend()
    );
    let keys: Vec<_> = runs
        .iter()
        .map(|run| derive_key(&tenant, "large.export", &[KeyPart::new(run).unwrap()]))
        .collect();
    match purge {
        Purge::Expired => {
            let later = SystemClock.now() + 48 * 3600 * 1000;
            let mut purged = 0;
            loop {
                let n = store.purge_expired(later, 37).await.unwrap();
                if n == 0 {
                    break;
                }
                purged += n;
            }
            assert!(purged >= keys.len(), "purged {purged}");
        }
        Purge::Deleted => {
            for key in &keys {
                store.delete(&tenant, *key).await.unwrap();
            }
        }
    }
    for key in &keys {
        assert!(
            store.lookup(&tenant, *key).await.unwrap().is_none(),
            "purged"
        );
    }
    assert_eq!(
        usage(&*store, &tenant).await,
        BlobUsage::default(),
        "{}: no blob outlives its records",
        store.backend()
    );
}

fn sqlite_pair() -> (Arc<SqliteStore>, Arc<SqliteStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let first = SqliteStore::open_path(&path).unwrap();
    let second = SqliteStore::open_path(&path).unwrap();
    (Arc::new(first), Arc::new(second), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_mib_result_round_trips_on_sqlite() {
    let (first, second, _dir) = sqlite_pair();
    a_10_mib_result_round_trips(first, second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_mib_result_round_trips_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let first = PostgresStore::open_url(&url).await.unwrap();
    let second = PostgresStore::open_url(&url).await.unwrap();
    a_10_mib_result_round_trips(Arc::new(first), Arc::new(second)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_mib_result_round_trips_on_redis() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let first = RedisStore::open_url(&url).await.unwrap();
    let second = RedisStore::open_url(&url).await.unwrap();
    a_10_mib_result_round_trips(Arc::new(first), Arc::new(second)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_chunks_are_stored_once_on_sqlite() {
    let (first, second, _dir) = sqlite_pair();
    large_chunks_are_stored_once(first, second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_chunks_are_stored_once_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let first = PostgresStore::open_url(&url).await.unwrap();
    let second = PostgresStore::open_url(&url).await.unwrap();
    large_chunks_are_stored_once(Arc::new(first), Arc::new(second)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_chunks_are_stored_once_on_redis() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let first = RedisStore::open_url(&url).await.unwrap();
    let second = RedisStore::open_url(&url).await.unwrap();
    large_chunks_are_stored_once(Arc::new(first), Arc::new(second)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_results_are_stored_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = Arc::new(SqliteStore::open_path(&path).unwrap());
    // The database's pages, as of its newest commit (the write-ahead log's too): what the file
    // holds once the log is checkpointed (the log itself is a fixed-size ring of 4 MiB).
    let measure = move || -> Size {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let bytes: i64 = conn
            .query_row(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                [],
                |r| r.get(0),
            )
            .unwrap();
        Box::pin(async move { bytes as u64 })
    };
    identical_results_are_stored_once(store, measure, Purge::Expired).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_results_are_stored_once_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    // A schema of its own, so that its tables' sizes are this test's.
    let schema = format!("idem_large_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::open_url(&format!("{url}?schema={schema}"))
        .await
        .unwrap();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let client = Arc::new(client);
    let sizes = client.clone();
    let tables = schema.clone();
    let measure = move || -> Size {
        let (client, schema) = (sizes.clone(), tables.clone());
        Box::pin(async move {
            let row = client
                .query_one(
                    "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c \
                     JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE n.nspname = $1 AND c.relkind = 'r'",
                    &[&schema],
                )
                .await
                .unwrap();
            row.get::<_, Option<i64>>(0).unwrap_or(0) as u64
        })
    };
    identical_results_are_stored_once(Arc::new(store), measure, Purge::Expired).await;
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_results_are_stored_once_on_redis() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    // A prefix of its own, so that its keys are this test's.
    let prefix = format!("idem-large-{}", uuid::Uuid::new_v4().simple());
    let store = RedisStore::open_url(&format!("{url}?prefix={prefix}"))
        .await
        .unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let measure = move || -> Size {
        let (mut conn, pattern) = (conn.clone(), format!("{prefix}:*"));
        Box::pin(async move {
            let mut keys: Vec<String> = Vec::new();
            let mut cursor: u64 = 0;
            loop {
                let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                keys.extend(page);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            let mut total = 0;
            for key in keys {
                let bytes: Option<u64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                total += bytes.unwrap_or(0);
            }
            total
        })
    };
    identical_results_are_stored_once(Arc::new(store), measure, Purge::Deleted).await;
}
