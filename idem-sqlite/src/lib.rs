//! The embedded SQLite store: a file on disk, WAL, and group commit.
//!
//! `Idem::open("sqlite://idem.db")` opens (and creates) one. What it guarantees:
//!
//! - **Durable claims.** A claim is committed and synced (`synchronous=full`, the default)
//!   before [`Claim::Acquired`] is answered, so the tool body never runs on a claim that a
//!   crash, even of the machine, could forget. The store syncs the WAL itself (`fdatasync`)
//!   rather than inside SQLite's `COMMIT`, so that under many callers the leader applies and
//!   commits the next batch while the last one syncs; no caller hears of a commit, and no read
//!   answers from one, before its sync (`syncer.rs` has the table). A sync that fails stops the
//!   store: every later call is refused, `Unavailable`. Checkpoints run apart from commits too:
//!   a thread of the store copies the WAL back past 1,000 pages while the leader goes on, and
//!   the leader checkpoints only past 4,000, so that the WAL starts again (`checkpoint.rs`).
//! - **Group commit, led by a caller.** Writes queue up; the caller that finds no commit under
//!   way becomes the *leader*: it takes everything queued, applies it in one transaction, commits
//!   once, and answers every caller in the batch. A lone caller commits on its own thread, without
//!   waiting for another thread to wake up (its task is blocked for that one `fsync`, as with any
//!   synchronous SQLite call). When others are queued too, the leading moves to a blocking thread
//!   of the tokio runtime, which commits batch after batch (lingering 0.5 ms for more) so that no
//!   async worker waits in `fsync` while there is work for it. Answers are sent only after the
//!   commit's sync; a leadership is handed on, never lost, even when a caller's future is dropped.
//! - **Reads do not queue.** While claims lately found records (at least one in eight: replays,
//!   mismatches, calls in flight), a claim first reads a committed snapshot on a pool of reader
//!   connections (WAL lets them run beside the writer), which answers without queueing behind
//!   others' commits (it waits only for the sync of a commit its snapshot may hold); only claims
//!   that may write take the write path. While nearly every claim
//!   is a new key, claims go straight to the write path, which inserts the record in its own
//!   transaction and reads the one already there only when the insert finds one (a new key's
//!   claim is one `INSERT … ON CONFLICT DO NOTHING`): the read first would be read again
//!   there, and the keeper pinned for it
//!   and unpinned for the write at every call (a fresh call's process CPU 268–278 µs with it,
//!   236–239 µs without, perf; see `store/read_first.rs`). A keeper connection holds a read
//!   transaction on the newest snapshot, so that the readers' WAL read locks cost no system
//!   call; it lets go while this store writes and stands aside when another process writes.
//! - **Several processes.** Writers take SQLite's write lock (`BEGIN IMMEDIATE`, with a busy
//!   timeout), so processes sharing one file still claim each key exactly once.
//! - **A versioned schema**, created on open; a file written by a newer schema is refused.
//! - **Replays from memory.** A completed record cannot change before it expires, so replays
//!   (and mismatches against it) found once are answered from a small in-process cache
//!   (1 MiB by default, `replay_cache=N` KiB; records of up to 16 KiB, each trusted for at most
//!   10 s; S3-FIFO eviction and TinyLFU admission, so cycling over more intents than fit keeps
//!   a part of them answered from memory, and the other replays cost no copy into the cache).
//!
//! - **Large results stored once.** A completed result longer than `blob_threshold` (64 KiB by
//!   default) is kept in `idem_blobs`, once per tenant and SHA-256, counted by the records that
//!   name it and deleted with the last of them, in the transaction that deletes it (see
//!   [`idem_core::store::blob`]). SQLite keeps values of up to [`MAX_VALUE_BYTES`].
//!
//! URL options: `sqlite://PATH?synchronous=full|normal&busy_timeout_ms=N&replay_cache=N&blob_threshold=N|off`.
//! `normal` survives a crash of the process but not a power loss; [`StoreHealth::durable`] says
//! which you have. `replay_cache=0` turns the cache off.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use rusqlite::Connection;

use idem_core::key::IdempotencyKey;
use idem_core::store::blob;
use idem_core::store::read_first::{ONE, ReadFirst};
use idem_core::store::replay_cache::ReplayCache;
use idem_core::store::{
    BatchClaim, BatchRenewal, BatchSettlement, ChunkAppend, ChunkRead, Claim, ClaimRequest,
    Completion, Fenced, FencingToken, Record, Renewal, Store, StoreFuture, StoreHealth, StreamPage,
    UnixMillis, Watch, Watchers, after, decide,
};
use idem_core::{StoreError, StoreErrorKind};

/// The longest value SQLite stores, as it is built here (`SQLITE_MAX_LENGTH`): a result of the
/// runtime is never longer.
pub const MAX_VALUE_BYTES: usize = 1_000_000_000;

mod admin;
mod checkpoint;
mod claim;
mod driver;
mod group_commit;
mod keeper;
mod options;
mod schema;
mod syncer;

pub use self::options::{SqliteOptions, Synchronous};
pub use self::schema::SCHEMA_VERSION;

use self::claim::{Op, Reply, read_held, read_page, read_record};
use self::driver::{BACKEND, closed, sql_error, unexpected};
use self::group_commit::{Queue, Shared};
use self::keeper::KeeperCell;
use self::schema::{migrate, open_connection};
use self::syncer::Syncer;

inventory::submit! {
    idem_core::store::admin::Driver::new(&["sqlite"], "sqlite://PATH", |url| Box::pin(open_url(url)))
}

/// Opens `sqlite://PATH[?options]` (the driver of `Idem::open`), on a blocking thread.
async fn open_url(url: &str) -> idem_core::store::admin::Opened {
    let rest = url.split_once("://").map_or("", |(_, rest)| rest);
    let options = SqliteOptions::from_url_rest(rest)
        .map_err(|reason| idem_core::store::admin::invalid_url(url, reason))?;
    let store = tokio::task::spawn_blocking(move || SqliteStore::open(options))
        .await
        .map_err(|_| {
            StoreError::new(
                BACKEND,
                StoreErrorKind::Unavailable,
                "opening the file panicked",
            )
        })??;
    Ok(Arc::new(store))
}

/// The share of claims answered without writing from which a claim reads a snapshot first: one
/// in eight. A read first costs a new key little (a point `SELECT` and a read lock), and spares a
/// claim that finds a record a place behind others' `fsync`s, hundreds of times as long: it pays
/// unless nearly every claim is new.
const READ_FIRST_FROM: u32 = ONE / 8;

/// The embedded SQLite [`Store`]. Cheap to clone; clones share the writer and the readers.
#[derive(Clone)]
pub struct SqliteStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.shared.options.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates) the store at `options.path` and creates or checks the schema.
    pub fn open(options: SqliteOptions) -> Result<Self, StoreError> {
        if let Some(dir) = options.path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Unavailable,
                format!(
                    "cannot open `{}`: its directory does not exist",
                    options.path.display()
                ),
            ));
        }
        let mut writer = open_connection(&options)?;
        migrate(&mut writer, options.busy_timeout)?;
        let syncer = writer_syncer(&writer, &options)?;
        checkpoint::install(&mut writer, &options)?;
        let keeper = KeeperCell::new(open_connection(&options)?);
        Ok(SqliteStore {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                queued: Condvar::new(),
                writer: Mutex::new(writer),
                readers: Mutex::new(Vec::new()),
                keeper,
                replays: ReplayCache::new(options.replay_cache),
                read_first: ReadFirst::new(READ_FIRST_FROM),
                watchers: Watchers::new(),
                syncer,
                options,
            }),
        })
    }

    /// Opens the store at `path` with default options.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open(SqliteOptions::new(path.as_ref()))
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.shared.options
    }

    /// Runs `f` on a pooled reader connection; also the number of the newest commit its
    /// snapshot may hold (read after `f`, so after the snapshot opened).
    fn read_snapshot<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<(T, u64), StoreError> {
        let pooled = self.shared.readers.lock().map_err(|_| closed())?.pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_connection(&self.shared.options)?,
        };
        self.shared.keeper.before_read();
        let out = f(&conn);
        let newest = self.shared.syncer.committed();
        if let Ok(mut readers) = self.shared.readers.lock() {
            readers.push(conn);
        }
        Ok((out?, newest))
    }

    /// [`Self::read_snapshot`], answered once every commit the snapshot may hold is durable.
    async fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let (out, newest) = self.read_snapshot(f)?;
        self.shared.syncer.durable(newest).await?;
        Ok(out)
    }
}

/// The syncer of the writer, which from now on commits with `synchronous=NORMAL`: with
/// `synchronous=full` the syncer syncs each commit before it is answered (see `syncer`).
fn writer_syncer(writer: &Connection, options: &SqliteOptions) -> Result<Syncer, StoreError> {
    writer
        .execute_batch("PRAGMA synchronous = NORMAL")
        .map_err(|e| sql_error("setting synchronous", e))?;
    // The file as SQLite resolved it (absolute), whose WAL is `<file>-wal`.
    let file = writer
        .path()
        .filter(|p| !p.is_empty())
        .map_or_else(|| options.path.clone(), PathBuf::from);
    Ok(Syncer::new(&file, options.synchronous == Synchronous::Full))
}

/// The write a claim queues.
fn claim_op(req: &ClaimRequest<'_>) -> Op {
    Op::Claim {
        tenant: req.tenant.to_owned(),
        key: req.key,
        tool: req.tool.to_owned(),
        fingerprint: req.fingerprint,
        now: req.now,
        lease: req.lease,
        ttl: req.ttl,
        orphans: req.orphans,
    }
}

/// The write a completion queues: a result past `blob_threshold` goes to a blob.
fn complete_op(c: &Completion<'_>, blob_threshold: usize) -> Op {
    Op::Complete {
        tenant: c.tenant.to_owned(),
        key: c.key,
        token: c.token,
        status: c.status,
        result: c.result.to_vec(),
        blob: blob::stored_apart(c.status, c.result, blob_threshold),
        expires_at: after(c.now, c.ttl),
    }
}

/// The write a renewal queues.
fn renew_op(r: &Renewal<'_>) -> Op {
    Op::Renew {
        tenant: r.tenant.to_owned(),
        key: r.key,
        token: r.token,
        lease_expires_at: after(r.now, r.lease),
    }
}

/// The write a release queues.
fn release_op(tenant: &str, key: IdempotencyKey, token: FencingToken) -> Op {
    Op::Release {
        tenant: tenant.to_owned(),
        key,
        token,
    }
}

impl SqliteStore {
    /// The claim a write's reply answers; a replay goes into the replay cache.
    fn claim_answer(&self, req: &ClaimRequest<'_>, reply: Reply) -> Result<Claim, StoreError> {
        match reply {
            Reply::Claim(claim) => Ok(claim),
            Reply::Replay { result, expires_at } => {
                self.shared.replays.put(req, &result, expires_at);
                Ok(Claim::Completed { result })
            }
            _ => Err(unexpected()),
        }
    }
}

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// SQLite's own limit on a value (`SQLITE_MAX_LENGTH`, as it is built).
    fn result_limit(&self) -> usize {
        MAX_VALUE_BYTES
    }

    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            let replays = &self.shared.replays;
            if let Some(answer) = replays.get(&req) {
                return Ok(answer);
            }
            // A committed snapshot answers every claim that cannot write, without queueing
            // behind the commits of others.
            let read_first = &self.shared.read_first;
            let snapshot = if read_first.wanted() {
                self.read_snapshot(|conn| read_held(conn, req.tenant, &req.key))?
            } else {
                (None, 0)
            };
            if let (Some((held, result)), newest) = snapshot {
                let decision = decide(Some(held), req.fingerprint, req.now, req.orphans);
                if let Some(answer) = decision.answer_without_writing(|| result.unwrap_or_default())
                {
                    // Answered from a commit: only once it is durable.
                    self.shared.syncer.durable(newest).await?;
                    if let Claim::Completed { result } = &answer {
                        replays.put(&req, result, held.expires_at);
                    }
                    read_first.note(true);
                    return Ok(answer);
                }
            }
            let claim = self.claim_answer(&req, self.shared.write(claim_op(&req)).await?)?;
            read_first.note(!matches!(claim, Claim::Acquired { .. }));
            Ok(claim)
        })
    }

    /// The items' claims in one job of the group commit (one transaction, one commit).
    fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
        Box::pin(async move {
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            let ops = batch
                .items
                .iter()
                .map(|item| claim_op(&batch.request(item)));
            let replies = self.shared.write_batch(ops.collect()).await?;
            batch
                .items
                .iter()
                .zip(replies)
                .map(|(item, reply)| self.claim_answer(&batch.request(item), reply))
                .collect()
        })
    }

    /// The items' completions and releases in one job of the group commit.
    fn settle_batch<'a>(&'a self, batch: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(async move {
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            let ops = batch.items.iter().map(|item| match batch.completion(item) {
                Some(completion) => complete_op(&completion, self.shared.options.blob_threshold),
                None => release_op(batch.tenant, item.key, item.token),
            });
            let answers = self.shared.write_fenced_batch(ops.collect()).await?;
            for (item, fenced) in batch.items.iter().zip(&answers) {
                if *fenced == Fenced::Applied {
                    self.shared.watchers.settled(&item.key);
                }
            }
            Ok(answers)
        })
    }

    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let op = complete_op(&c, self.shared.options.blob_threshold);
            let fenced = self.shared.write_fenced(op).await?;
            if fenced == Fenced::Applied {
                self.shared.watchers.settled(&c.key);
            }
            Ok(fenced)
        })
    }

    fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move { self.shared.write_fenced(renew_op(&r)).await })
    }

    /// The items' renewals in one job of the group commit.
    fn renew_batch<'a>(&'a self, batch: BatchRenewal<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(async move {
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            let ops = batch
                .items
                .iter()
                .map(|item| renew_op(&batch.renewal(item)));
            self.shared.write_fenced_batch(ops.collect()).await
        })
    }

    /// The chunks in one job of the group commit: durable before the answer.
    fn append_chunks<'a>(&'a self, a: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let threshold = self.shared.options.blob_threshold;
            let op = Op::Append {
                tenant: a.tenant.to_owned(),
                key: a.key,
                token: a.token,
                first: a.first,
                chunks: a.chunks.to_vec(),
                blobs: a
                    .chunks
                    .iter()
                    .map(|c| blob::chunk_apart(c, threshold))
                    .collect(),
            };
            self.shared.write_fenced(op).await
        })
    }

    /// On a reader connection, in one read transaction.
    fn read_chunks<'a>(&'a self, r: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
        Box::pin(async move {
            self.read(|conn| read_page(conn, r.tenant, &r.key, r.from, r.limit))
                .await
        })
    }

    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let fenced = self
                .shared
                .write_fenced(release_op(tenant, key, token))
                .await?;
            if fenced == Fenced::Applied {
                self.shared.watchers.settled(&key);
            }
            Ok(fenced)
        })
    }

    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            self.read(|conn| read_record(conn, "lookup", tenant, &key))
                .await
        })
    }

    /// Woken by this store's own completions and releases; another process writing the file
    /// is not announced (the caller polls).
    fn watch<'a>(&'a self, _tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
        Box::pin(async move { Ok(self.shared.watchers.watch(key, false)) })
    }

    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            match self.shared.write(Op::Purge { now, limit }).await? {
                Reply::Purged(n) => Ok(n),
                _ => Err(unexpected()),
            }
        })
    }

    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        Box::pin(async move {
            let version: i64 = self
                .read(|conn| {
                    conn.query_row(
                        "SELECT value FROM idem_meta WHERE name = 'schema_version'",
                        [],
                        |r| r.get(0),
                    )
                    .map_err(|e| sql_error("reading the schema version", e))
                })
                .await?;
            // What makes a commit durable is the syncer (the writer's own `synchronous` is
            // `NORMAL` either way).
            let durable = self.shared.syncer.syncs();
            Ok(StoreHealth {
                encrypted: None,
                fencing: None,
                backend: BACKEND,
                schema_version: u32::try_from(version).unwrap_or(0),
                expected_schema_version: SCHEMA_VERSION,
                durable,
                detail: (!durable).then(|| {
                    "synchronous=normal: a claim survives a crash of the process, not a \
                     power loss"
                        .to_owned()
                }),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use idem_core::fingerprint::Fingerprint;
    use idem_core::store::RecordStatus;

    async fn temp_store() -> SqliteStore {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.keep().join("conformance.db");
        SqliteStore::open_path(path).expect("open")
    }

    idem_core::store_conformance_tests!(temp_store());
    idem_core::admin_conformance_tests!(temp_store());

    /// The same contract with every claim reading a snapshot first, as while replays come:
    /// the snapshot answers what it may, and leaves the rest to the write path. (A new store
    /// goes straight to the write path until claims find records.)
    mod read_first {
        use super::*;

        async fn store() -> SqliteStore {
            let mut store = temp_store().await;
            Arc::get_mut(&mut store.shared)
                .expect("a store just opened is not shared")
                .read_first = ReadFirst::always();
            store
        }
        idem_core::store_conformance_tests!(store());
    }

    #[tokio::test]
    async fn a_dropped_table_fails_closed_with_a_schema_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dropped.db");
        let store = SqliteStore::open_path(&path).unwrap();
        Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE idem_records")
            .unwrap();
        let key = idem_core::key::derive_key("t", "tool", &[]);
        let err = store
            .claim(ClaimRequest {
                tenant: "t",
                key,
                tool: "tool",
                fingerprint: Fingerprint::from_bytes([0; 32]),
                now: 1,
                lease: Duration::from_secs(1),
                ttl: Duration::from_secs(1),
                orphans: idem_core::store::Orphans::TakeOver,
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Schema, "{err}");
    }

    /// Deleting a record deletes the chunks of its stream, however it goes: a release, a purge,
    /// an operator's delete. (Counted in the file: the conformance suite sees the chunks only
    /// through records.)
    #[tokio::test]
    async fn deleting_a_record_leaves_no_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunks.db");
        let store = SqliteStore::open_path(&path).unwrap();
        let count = || -> i64 {
            Connection::open(&path)
                .unwrap()
                .query_row("SELECT count(*) FROM idem_chunks", [], |r| r.get(0))
                .unwrap()
        };
        let chunks = vec![vec![1u8; 100]; 10];
        let mut tokens = Vec::new();
        for n in 0..3 {
            let req = request(n);
            let Claim::Acquired { token, .. } = store.claim(req).await.unwrap() else {
                panic!("a new key is acquired");
            };
            let append = ChunkAppend {
                tenant: req.tenant,
                key: req.key,
                token,
                first: 0,
                chunks: &chunks,
            };
            assert_eq!(store.append_chunks(append).await.unwrap(), Fenced::Applied);
            tokens.push((req.key, token));
        }
        assert_eq!(count(), 30);
        let (key, token) = tokens[0];
        assert_eq!(
            store.release("t", key, token).await.unwrap(),
            Fenced::Applied
        );
        assert_eq!(count(), 20, "released");
        let (key, _) = tokens[1];
        let deleted = idem_core::store::admin::AdminStore::delete(&store, "t", key);
        assert_eq!(deleted.await.unwrap(), Fenced::Applied);
        assert_eq!(count(), 10, "deleted by an operator");
        assert_eq!(store.purge_expired(u64::MAX / 2, 10).await.unwrap(), 1);
        assert_eq!(count(), 0, "purged");
    }

    /// A store without a replay cache (every replay reads the file), `synchronous=normal` (the
    /// tests write thousands of records), and another connection to the same file.
    fn uncached_store(dir: &Path) -> (SqliteStore, Connection) {
        let path = dir.join("keeper.db");
        let url = format!("{}?synchronous=normal&replay_cache=0", path.display());
        let store = SqliteStore::open(SqliteOptions::from_url_rest(&url).unwrap()).unwrap();
        (store, Connection::open(&path).unwrap())
    }

    /// A claim of the `n`th key of tenant `t`.
    pub(super) fn request(n: u32) -> ClaimRequest<'static> {
        ClaimRequest {
            tenant: "t",
            key: idem_core::key::derive_key(
                "t",
                "tool",
                &[idem_core::key::KeyPart::new(&n).unwrap()],
            ),
            tool: "tool",
            fingerprint: Fingerprint::from_bytes([7; 32]),
            now: 1_000,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(3_600),
            orphans: idem_core::store::Orphans::TakeOver,
        }
    }

    /// Claims key `n`, completes it (two commits), and replays it (a read).
    async fn write_and_replay(store: &SqliteStore, n: u32) {
        let Claim::Acquired { token, .. } = store.claim(request(n)).await.unwrap() else {
            panic!("a new key is acquired");
        };
        assert_eq!(
            store.complete(completion(n, token)).await.unwrap(),
            Fenced::Applied
        );
        let replay = store.claim(request(n)).await.unwrap();
        assert!(matches!(replay, Claim::Completed { .. }), "{replay:?}");
    }

    /// The completion of key `n`'s claim.
    fn completion(n: u32, token: FencingToken) -> Completion<'static> {
        Completion {
            tenant: "t",
            key: request(n).key,
            token,
            status: RecordStatus::Completed,
            result: b"{\"ok\":1}",
            now: 1_000,
            ttl: Duration::from_secs(3_600),
            notify: false,
        }
    }

    /// A synced store (`synchronous=full`) without a replay cache.
    fn synced_store(dir: &Path) -> SqliteStore {
        let url = format!("{}?replay_cache=0", dir.join("synced.db").display());
        SqliteStore::open(SqliteOptions::from_url_rest(&url).unwrap()).unwrap()
    }

    /// Nothing is answered from a commit before its sync: while a completion's sync is held,
    /// its caller, a lookup and a claim that reads first all wait (though the commit is there to
    /// read), and all answer once it ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_read_answers_from_a_commit_before_its_sync() {
        let dir = tempfile::tempdir().unwrap();
        let store = synced_store(dir.path());
        for n in 0..4 {
            write_and_replay(&store, n).await;
        }
        assert!(
            store.shared.read_first.wanted(),
            "replays: claims read first"
        );
        let Claim::Acquired { token, .. } = store.claim(request(9)).await.unwrap() else {
            panic!("a new key is acquired");
        };

        let held = store.shared.syncer.hold();
        let completing = tokio::spawn({
            let store = store.clone();
            async move { store.complete(completion(9, token)).await }
        });
        let raw = Connection::open(dir.path().join("synced.db")).unwrap();
        let completed = || -> i64 {
            raw.query_row(
                "SELECT count(*) FROM idem_records WHERE status = 'completed'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        while completed() < 5 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The completion is committed, there for any reader to see.
        let lookup = tokio::spawn({
            let store = store.clone();
            async move { store.lookup("t", request(9).key).await }
        });
        let replay = tokio::spawn({
            let store = store.clone();
            async move { store.claim(request(9)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!completing.is_finished(), "its caller waits for the sync");
        assert!(!lookup.is_finished(), "a lookup of it waits");
        assert!(!replay.is_finished(), "a claim reading it first waits");

        drop(held);
        assert_eq!(completing.await.unwrap().unwrap(), Fenced::Applied);
        let record = lookup.await.unwrap().unwrap().expect("the record");
        assert_eq!(record.status, RecordStatus::Completed);
        let replay = replay.await.unwrap().unwrap();
        assert!(matches!(replay, Claim::Completed { .. }), "{replay:?}");
    }

    /// A store whose WAL vanished cannot make a commit durable: the write that found it out
    /// is answered with an error, not `Acquired`, and every later call is refused.
    #[tokio::test]
    async fn a_store_that_cannot_sync_answers_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let store = synced_store(dir.path());
        write_and_replay(&store, 1).await;
        assert!(store.health().await.unwrap().durable);
        std::fs::remove_file(dir.path().join("synced.db-wal")).unwrap();

        let claim = store.claim(request(2)).await.expect_err("not durable");
        assert_eq!(claim.kind(), StoreErrorKind::Unavailable);
        assert!(
            claim.to_string().contains("syncing the WAL failed"),
            "{claim}"
        );
        for later in [
            store.claim(request(3)).await.map(drop),
            store.lookup("t", request(1).key).await.map(drop),
            store.health().await.map(drop),
        ] {
            let error = later.expect_err("refused");
            assert!(error.to_string().contains("open it again"), "{error}");
        }
    }

    /// A passive checkpoint by `conn`: the WAL's frames, and how many of them are in the file.
    fn checkpoint(conn: &Connection) -> (i64, i64) {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(1)?, r.get(2)?))
        })
        .unwrap()
    }

    /// The keeper never holds back this store's own commits: after a write, a checkpoint copies
    /// every frame back, and under a mixed load of writes and replays the WAL file stays within
    /// the store's own bound (see `checkpoint`) instead of growing with every write.
    #[tokio::test]
    async fn the_keeper_holds_back_no_checkpoint_of_the_stores_own_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, other) = uncached_store(dir.path());

        write_and_replay(&store, 0).await;
        write_and_replay(&store, 1).await;
        store
            .claim(request(2))
            .await
            .expect("a write after the replay");
        let (log, copied) = checkpoint(&other);
        assert_eq!(
            copied, log,
            "nothing held back after this store's own write"
        );

        for n in 3..2_003 {
            write_and_replay(&store, n).await;
        }
        let pages = checkpoint::tests::wal_pages(&dir.path().join("keeper.db"));
        // The leader's own checkpoints bound it (see `checkpoint`), the keeper unpinned.
        assert!(
            pages < (checkpoint::INLINE_FROM + checkpoint::BACKGROUND_FROM) as u64,
            "4,000 commits and as many replays leave a WAL of {pages} pages"
        );
        assert!(
            !store.shared.keeper.stood_aside(),
            "this store's own commits never make the keeper stand aside"
        );
    }

    /// A store that stops reading holds back no other writer: the sweeper ends the pin no
    /// reader renews, and the other connection's checkpoint then copies every frame back.
    #[tokio::test]
    async fn an_idle_store_holds_back_no_other_writer() {
        let dir = tempfile::tempdir().unwrap();
        let (store, other) = uncached_store(dir.path());
        other
            .execute_batch("CREATE TABLE other (v INTEGER); INSERT INTO other VALUES (1)")
            .unwrap();
        write_and_replay(&store, 0).await;
        other.execute("INSERT INTO other VALUES (2)", []).unwrap();

        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (log, copied) = checkpoint(&other);
            if copied == log {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "an idle store still holds back {} frames",
                log - copied
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn health_says_whether_commits_are_durable() {
        let dir = tempfile::tempdir().unwrap();
        let full = SqliteStore::open_path(dir.path().join("f.db")).unwrap();
        assert!(full.health().await.unwrap().durable);
        let normal = SqliteStore::open(
            SqliteOptions::from_url_rest(&format!(
                "{}?synchronous=normal",
                dir.path().join("n.db").display()
            ))
            .unwrap(),
        )
        .unwrap();
        assert!(!normal.health().await.unwrap().durable);
    }
}
