//! Streaming tools on SQLite, Postgres and Redis.
//!
//! - A stream of 1,000 chunks of varied sizes and bytes, produced once, replays the same
//!   chunks (the values, and the bytes the store holds, read twice) and the same end.
//! - A retry that joins at chunk 500 (through a store of its own, as another process would)
//!   gets all 1,000 in order, with no gap and no duplicate, then the end; the body ran once.
//! - Kill -9 at a random chunk (`IDEM_STREAM_CRASH_CYCLES` cycles, default 100, on SQLite and
//!   Postgres): workers produce 8 streams of 100 chunks, each chunk naming the process that
//!   produced it; the parent kills them at random moments. Every worker first reads what the
//!   dead left: each stream is a readable prefix of one holder's chunks, in order. Every call
//!   that follows a stream reads one holder's chunks in order, or breaks off; the last worker
//!   completes every stream, and each holds exactly one holder's 100 chunks.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem::key::KeyPart;
use idem::store::conformance::test_server_url;
use idem::store::postgres::PostgresStore;
use idem::store::redis::RedisStore;
use idem::store::sqlite::SqliteStore;
use idem::store::{ChunkRead, RecordStatus, Store};
use idem::{Emitter, Error, Idem, IdempotencyKey, Outcome, derive_key, idempotent};

#[path = "common/kills.rs"]
mod kills;
use kills::{append_synced, env_path, open_store};

/// The bodies that ran, by run (the tests run in parallel).
static DRAFTS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn drafts(run_id: &str) -> usize {
    DRAFTS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| *r == run_id)
        .count()
}

/// Chunk `n`: 1 to 3,000 characters, ASCII and not, so that a store that trims, pads or
/// re-encodes a chunk is caught.
fn chunk(n: u32) -> String {
    let len = 1 + (n as usize * 97) % 3000;
    (0..len)
        .map(|i| match (n as usize + i) % 7 {
            0 => 'ñ',
            1 => '"',
            2 => '\\',
            3 => '😀',
            _ => char::from(b'a' + ((n as usize * 31 + i) % 26) as u8),
        })
        .collect()
}

/// Emits `count` chunks; past chunk `pause` it waits for the gate (a test's cue).
#[idempotent(key = "run_id", mutating, name = "stream.draft")]
async fn draft(
    run_id: String,
    count: u32,
    pause: u32,
    out: Emitter<String>,
) -> Result<u32, std::io::Error> {
    DRAFTS.lock().unwrap().push(run_id.clone());
    for n in 0..count {
        if n == pause {
            gate(&run_id).notified().await;
        }
        out.emit(chunk(n)).await;
    }
    Ok(count)
}

/// The gate of run `run_id`.
fn gate(run_id: &str) -> Arc<tokio::sync::Notify> {
    static GATES: std::sync::Mutex<Vec<(String, Arc<tokio::sync::Notify>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut gates = GATES.lock().unwrap();
    if let Some((_, gate)) = gates.iter().find(|(run, _)| run == run_id) {
        return gate.clone();
    }
    let gate = Arc::new(tokio::sync::Notify::new());
    gates.push((run_id.to_owned(), gate.clone()));
    gate
}

fn draft_key(tenant: &str, run_id: &str) -> IdempotencyKey {
    derive_key(tenant, "stream.draft", &[KeyPart::new(run_id).unwrap()])
}

/// The bytes the store holds for a key's stream, every chunk, and the status of its record
/// (`None` without a record).
async fn stored_chunks(
    store: &dyn Store,
    tenant: &str,
    key: IdempotencyKey,
) -> Option<(Vec<Vec<u8>>, RecordStatus)> {
    let mut out = Vec::new();
    loop {
        let page = store
            .read_chunks(ChunkRead {
                tenant,
                key,
                from: out.len() as u64,
                limit: 64,
            })
            .await
            .unwrap()?;
        let last = page.chunks.len() < 64;
        out.extend(page.chunks);
        if last {
            return Some((out, page.record.status));
        }
    }
}

async fn a_1000_chunk_stream_replays_byte_identical(store: Arc<dyn Store>) {
    let idem = Idem::with_store(store.clone());
    let tenant = format!("stream-{}", uuid::Uuid::new_v4().simple());
    let scope = idem.scope(tenant.clone());
    let run = format!("replay-{}", uuid::Uuid::new_v4().simple());
    let Ok(Outcome::Fresh(first)) = scope.run(draft(run.clone(), 1000, u32::MAX)).await else {
        panic!("the first call runs");
    };
    let (produced, end) = first.collect().await.unwrap();
    assert_eq!(end, 1000);
    assert!(produced.iter().zip(0..).all(|(c, n)| *c == chunk(n)));
    assert_eq!(produced.len(), 1000);
    let key = draft_key(&tenant, &run);
    let (bytes, _) = stored_chunks(&*store, &tenant, key)
        .await
        .expect("a record");
    assert_eq!(bytes.len(), 1000);
    for (stored, n) in bytes.iter().zip(0..) {
        assert_eq!(*stored, serde_json::to_vec(&chunk(n)).unwrap(), "chunk {n}");
    }
    for _ in 0..2 {
        let Ok(Outcome::Replayed(again)) = scope.run(draft(run.clone(), 1000, u32::MAX)).await
        else {
            panic!("a retry replays");
        };
        let (replayed, end) = again.collect().await.unwrap();
        assert_eq!(end, 1000);
        assert!(
            replayed == produced,
            "the replay is the stream, chunk for chunk"
        );
    }
    let (again, _) = stored_chunks(&*store, &tenant, key)
        .await
        .expect("a record");
    assert_eq!(again, bytes);
    assert_eq!(drafts(&run), 1, "the body ran once");
}

/// `second` is a store of its own on the same data, as another process has.
async fn an_attacher_at_500_gets_all_1000(first: Arc<dyn Store>, second: Arc<dyn Store>) {
    let tenant = format!("stream-{}", uuid::Uuid::new_v4().simple());
    let run = format!("attach-{}", uuid::Uuid::new_v4().simple());
    let producer = Idem::with_store(first).scope(tenant.clone());
    let follower = Idem::with_store(second).scope(tenant.clone());
    let Ok(Outcome::Fresh(mut produced)) = producer.run(draft(run.clone(), 1000, 500)).await else {
        panic!("the first call runs");
    };
    // The producer's reader takes the first 500 (each recorded before it is read); the body
    // waits at the gate.
    let mut head = Vec::new();
    while head.len() < 500 {
        head.push(
            produced
                .next_chunk()
                .await
                .expect("500 chunks before the gate"),
        );
    }
    let Ok(Outcome::Replayed(mut followed)) = follower.run(draft(run.clone(), 1000, 500)).await
    else {
        panic!("a retry during the stream follows it");
    };
    let mut got = Vec::new();
    while got.len() < 500 {
        got.push(
            followed
                .next_chunk()
                .await
                .expect("the 500 recorded so far"),
        );
    }
    let producing = tokio::spawn(async move {
        let (rest, end) = produced.collect().await.unwrap();
        head.extend(rest);
        (head, end)
    });
    gate(&run).notify_one();
    let (rest, end) = followed.collect().await.unwrap();
    got.extend(rest);
    assert_eq!(end, 1000);
    assert_eq!(got.len(), 1000, "no gap, no duplicate");
    assert!(got.iter().zip(0..).all(|(c, n)| *c == chunk(n)), "in order");
    let (all, produced_end) = producing.await.unwrap();
    assert_eq!(produced_end, 1000);
    assert!(all == got);
    assert_eq!(drafts(&run), 1, "the body ran once");
}

fn sqlite_pair() -> (Arc<dyn Store>, Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let first = SqliteStore::open_path(&path).unwrap();
    let second = SqliteStore::open_path(&path).unwrap();
    (Arc::new(first), Arc::new(second), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1000_chunk_stream_replays_byte_identical_on_sqlite() {
    let (store, _, _dir) = sqlite_pair();
    a_1000_chunk_stream_replays_byte_identical(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1000_chunk_stream_replays_byte_identical_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let store = PostgresStore::open_url(&url).await.unwrap();
    a_1000_chunk_stream_replays_byte_identical(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1000_chunk_stream_replays_byte_identical_on_redis() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let store = RedisStore::open_url(&url).await.unwrap();
    a_1000_chunk_stream_replays_byte_identical(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attacher_at_500_gets_all_1000_on_sqlite() {
    let (first, second, _dir) = sqlite_pair();
    an_attacher_at_500_gets_all_1000(first, second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attacher_at_500_gets_all_1000_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let first = PostgresStore::open_url(&url).await.unwrap();
    let second = PostgresStore::open_url(&url).await.unwrap();
    an_attacher_at_500_gets_all_1000(Arc::new(first), Arc::new(second)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attacher_at_500_gets_all_1000_on_redis() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let first = RedisStore::open_url(&url).await.unwrap();
    let second = RedisStore::open_url(&url).await.unwrap();
    an_attacher_at_500_gets_all_1000(Arc::new(first), Arc::new(second)).await;
}

// The kill test.

const STREAMS: u32 = 8;
const CHUNKS: u32 = 100;
const LEASE: Duration = Duration::from_millis(40);
const TENANT: &str = "tenant-stream-crash";

/// This process's name in the chunks it produces: its pid and a random number.
fn holder() -> &'static str {
    static HOLDER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOLDER.get_or_init(|| format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()))
}

/// Produces stream `stream`: chunk `n` is `HOLDER:n`, one a millisecond.
#[idempotent(key = "stream", mutating, name = "stream.crash.produce")]
async fn produce(stream: u32, out: Emitter<String>) -> Result<u32, std::io::Error> {
    for n in 0..CHUNKS {
        out.emit(format!("{}:{n}", holder())).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = stream;
    Ok(CHUNKS)
}

/// Whether `chunks` are one holder's `0, 1, …` in order; the holder.
fn one_holders_prefix(chunks: &[String]) -> Result<Option<String>, String> {
    let mut holder: Option<&str> = None;
    for (i, chunk) in chunks.iter().enumerate() {
        let (who, n) = chunk
            .rsplit_once(':')
            .ok_or_else(|| format!("chunk {i} is not a holder's: {chunk}"))?;
        if *holder.get_or_insert(who) != who {
            return Err(format!("chunk {i} is {who}'s, after {holder:?}'s"));
        }
        if n != i.to_string() {
            return Err(format!("chunk {i} is {who}'s chunk {n}"));
        }
    }
    Ok(holder.map(str::to_owned))
}

fn produce_key(stream: u32) -> IdempotencyKey {
    derive_key(
        TENANT,
        "stream.crash.produce",
        &[KeyPart::new(&stream).unwrap()],
    )
}

/// What the store holds of each stream: one holder's prefix each (checked), and its length.
async fn prefixes(store: &dyn Store) -> Vec<(u32, usize, Option<RecordStatus>)> {
    let mut out = Vec::new();
    for stream in 0..STREAMS {
        let (bytes, status) = match stored_chunks(store, TENANT, produce_key(stream)).await {
            Some((bytes, status)) => (bytes, Some(status)),
            None => (Vec::new(), None),
        };
        let chunks: Vec<String> = bytes
            .iter()
            .map(|c| serde_json::from_slice(c).unwrap())
            .collect();
        if let Err(mixed) = one_holders_prefix(&chunks) {
            panic!("stream {stream}: {mixed}");
        }
        out.push((stream, chunks.len(), status));
    }
    out
}

/// One worker: checks what earlier workers left, then produces (or follows) every stream to
/// its end, checking every chunk it reads.
#[test]
#[ignore = "run by the kill tests below as a child process"]
fn stream_worker() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::from(
            open_store(
                std::env::var("IDEM_STREAM_POSTGRES").ok().as_deref(),
                &env_path("IDEM_STREAM_DB"),
            )
            .await,
        );
        let found = prefixes(&*store).await;
        let lengths: Vec<String> = found.iter().map(|(_, n, _)| n.to_string()).collect();
        append_synced(
            &env_path("IDEM_STREAM_PREFIXES"),
            &format!("{}\n", lengths.join(" ")),
        );
        let idem = Idem::builder().lease(LEASE).build(store);
        let tenant = idem.scope(TENANT);
        let phases = env_path("IDEM_STREAM_PHASES");
        for stream in 0..STREAMS {
            loop {
                append_synced(&phases, "B\n");
                let call = tenant.run(produce(stream)).await;
                let (fresh, mut streamed) = match call {
                    Ok(Outcome::Fresh(s)) => (true, s),
                    Ok(Outcome::Replayed(s)) => (false, s),
                    Ok(other) => panic!("stream {stream}: {other:?}"),
                    Err(e) if e.is_store() => {
                        tokio::time::sleep(LEASE).await;
                        continue;
                    }
                    Err(e) => panic!("stream {stream}: {e}"),
                };
                append_synced(&phases, if fresh { "P\n" } else { "F\n" });
                let mut got = Vec::new();
                while let Some(chunk) = streamed.next_chunk().await {
                    got.push(chunk);
                }
                match one_holders_prefix(&got) {
                    Ok(Some(who)) if fresh => assert_eq!(who, holder(), "a fresh stream is ours"),
                    Ok(_) => {}
                    Err(mixed) => panic!("stream {stream}, read by a call: {mixed}"),
                }
                match streamed.finish().await {
                    Ok(n) => {
                        assert_eq!((n, got.len()), (CHUNKS, CHUNKS as usize));
                        append_synced(&phases, "D\n");
                        break;
                    }
                    // The holder followed died; its lease lapses, then a retry takes over.
                    Err(Error::StreamInterrupted { .. } | Error::LeaseLost { .. }) => {
                        tokio::time::sleep(LEASE / 2).await;
                    }
                    Err(e) => panic!("stream {stream}: {e}"),
                }
            }
        }
    });
}

fn kill_9_mid_stream(postgres: Option<String>) {
    let cycles = kills::cycles("IDEM_STREAM_CRASH_CYCLES", 100);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let prefixes_file = dir.path().join("prefixes");
    let child = |phases: &Path| {
        let files = [
            ("IDEM_STREAM_DB", db.as_path()),
            ("IDEM_STREAM_PREFIXES", &prefixes_file),
            ("IDEM_STREAM_PHASES", phases),
        ];
        kills::worker(
            "stream_worker",
            &files,
            ("IDEM_STREAM_POSTGRES", postgres.as_deref()),
        )
    };
    let kills = kills::kill_cycles(dir.path(), cycles, 0x57ae_0000, (40, 160), child);

    // What each worker found the dead had left: prefixes cut at a chunk, each one holder's.
    let cut: Vec<usize> = std::fs::read_to_string(&prefixes_file)
        .unwrap()
        .lines()
        .flat_map(|l| {
            l.split_whitespace()
                .map(|n| n.parse::<usize>().unwrap())
                .collect::<Vec<_>>()
        })
        .filter(|n| (1..CHUNKS as usize).contains(n))
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = open_store(postgres.as_deref(), &db).await;
        for (stream, len, status) in prefixes(&*store).await {
            assert_eq!(
                (len, status),
                (CHUNKS as usize, Some(RecordStatus::Completed)),
                "stream {stream} completed, whole"
            );
        }
    });
    let mut phases: Vec<_> = kills.iter().collect();
    phases.sort();
    let store = if postgres.is_some() {
        "Postgres"
    } else {
        "SQLite"
    };
    let distinct: std::collections::BTreeSet<_> = cut.iter().collect();
    println!(
        "{store}: {cycles} cycles, kills by the last moment reached ({{B: before a call, P: \
         producing, F: following, D: a stream done, -: before the first call}}): {phases:?}; \
         {} streams found cut after a kill, at {} distinct chunks (from {:?} to {:?}), each a \
         prefix of one holder's chunks; all {STREAMS} streams completed with one holder's \
         {CHUNKS} chunks",
        cut.len(),
        distinct.len(),
        cut.iter().min(),
        cut.iter().max(),
    );
    assert!(
        cut.len() * 2 >= cycles as usize / 2,
        "kills should land mid-stream: {} of {cycles} did",
        cut.len()
    );
}

#[test]
fn kill_9_mid_stream_on_sqlite() {
    kill_9_mid_stream(None);
}

/// The same against Postgres (a schema of its own), when `IDEM_TEST_POSTGRES_URL` names one.
#[test]
fn kill_9_mid_stream_on_postgres() {
    kills::in_private_schema("idem_stream", |url| kill_9_mid_stream(Some(url)));
}
