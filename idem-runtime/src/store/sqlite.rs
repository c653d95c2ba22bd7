//! The embedded SQLite store: a file on disk, WAL, and group commit.
//!
//! `Idem::open("sqlite://idem.db")` opens (and creates) one. What it guarantees:
//!
//! - **Durable claims.** A claim is committed with `synchronous=FULL` (the default) before
//!   [`Claim::Acquired`] is answered, so the tool body never runs on a claim that a crash, even
//!   of the machine, could forget.
//! - **Group commit, led by a caller.** Writes queue up; the caller that finds no commit under
//!   way becomes the *leader*: it takes everything queued, applies it in one transaction, commits
//!   once, and answers every caller in the batch. A lone caller commits on its own thread, without
//!   waiting for another thread to wake up (its task is blocked for that one `fsync`, as with any
//!   synchronous SQLite call). When others are queued too, the leading moves to a blocking thread
//!   of the tokio runtime, which commits batch after batch (lingering 0.5 ms for more) so that no
//!   async worker waits in `fsync` while there is work for it. Answers are sent only after the
//!   commit; a leadership is handed on, never lost, even when a caller's future is dropped.
//! - **Reads do not queue.** Replays, mismatches and in-flight answers are decided from a
//!   committed snapshot on a pool of reader connections (WAL lets them run beside the writer);
//!   only claims that may write take the write path.
//! - **Several processes.** Writers take SQLite's write lock (`BEGIN IMMEDIATE`, with a busy
//!   timeout), so processes sharing one file still claim each key exactly once.
//! - **A versioned schema**, created on open; a file written by a newer schema is refused.
//! - **Replays from memory.** A completed record cannot change before it expires, so replays
//!   (and mismatches against it) found once are answered from a small in-process cache
//!   (1024 records of up to 16 KiB by default, each trusted for at most 10 s).
//!
//! URL options: `sqlite://PATH?synchronous=full|normal&busy_timeout_ms=N&replay_cache=N`.
//! `normal` survives a crash of the process but not a power loss; [`StoreHealth::durable`] says
//! which you have. `replay_cache=0` turns the cache off.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};
use tokio::sync::oneshot;

use super::admin::{self, AdminStore, Page, Resolution};
use super::replay_cache::{self, ReplayCache};
use super::{
    Claim, ClaimRequest, Completion, Decision, Fenced, FencingToken, Held, Orphans, Record,
    RecordStatus, Store, StoreFuture, StoreHealth, UnixMillis, after, decide,
};
use crate::error::{StoreError, StoreErrorKind};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;

const BACKEND: &str = "sqlite";

/// The schema version this build writes (2 added the `unknown` status and the operator's
/// `note`; a version-1 file is upgraded on open).
pub const SCHEMA_VERSION: u32 = 2;

/// Most operations one transaction takes.
const MAX_BATCH: usize = 512;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idem_meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idem_records (
    tenant           TEXT    NOT NULL,
    key              BLOB    NOT NULL,
    tool             TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('in_flight', 'completed', 'unknown')),
    token            INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    result           BLOB,
    note             TEXT,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);
";

/// Version 1 to 2: SQLite cannot change a CHECK constraint in place, so the records move to a
/// table with the new one (inside the schema transaction: all or nothing).
const UPGRADE_1_TO_2: [&str; 3] = [
    "ALTER TABLE idem_records RENAME TO idem_records_v1;
     DROP INDEX IF EXISTS idem_records_expires_at;",
    SCHEMA,
    "INSERT INTO idem_records (tenant, key, tool, fingerprint, status, token, lease_expires_at,
         created_at, expires_at, result)
     SELECT tenant, key, tool, fingerprint, status, token, lease_expires_at, created_at,
         expires_at, result FROM idem_records_v1;
     DROP TABLE idem_records_v1;
     UPDATE idem_meta SET value = 2 WHERE name = 'schema_version';",
];

const SELECT_HELD: &str = "SELECT fingerprint, status, lease_expires_at, expires_at, result \
     FROM idem_records WHERE tenant = ?1 AND key = ?2";

const RECORD_COLUMNS: &str = "tenant, key, tool, fingerprint, status, token, \
     lease_expires_at, created_at, expires_at, result, note";

/// The condition of a record an operator may resolve (`?3` is now).
const BLOCKED: &str = "tenant = ?1 AND key = ?2 \
     AND (status = 'unknown' OR (status = 'in_flight' AND lease_expires_at <= ?3))";

/// How hard SQLite syncs a commit to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// `synchronous=FULL`: a commit survives a power loss (the default).
    Full,
    /// `synchronous=NORMAL`: a commit survives a crash of the process, not of the machine.
    Normal,
}

/// Options of a [`SqliteStore`], usually taken from the URL.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The database file; created if missing.
    pub path: PathBuf,
    /// Commit durability.
    pub synchronous: Synchronous,
    /// How long to wait for another process's write lock before failing with a timeout.
    pub busy_timeout: Duration,
    /// How many completed records to keep in memory for replays (0: none). See below.
    pub replay_cache: usize,
}

impl SqliteOptions {
    /// Defaults for a file: `synchronous=FULL`, 5 s busy timeout.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteOptions {
            path: path.into(),
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            replay_cache: replay_cache::DEFAULT_CAPACITY,
        }
    }

    /// Parses the part of a `sqlite://` URL after the scheme: `PATH[?option=value&…]`.
    pub fn from_url_rest(rest: &str) -> Result<Self, String> {
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(
                "the URL names no file: write `sqlite://PATH`, e.g. `sqlite://idem.db`".into(),
            );
        }
        let mut options = SqliteOptions::new(path);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match (name, value.to_ascii_lowercase().as_str()) {
                ("synchronous", "full") => options.synchronous = Synchronous::Full,
                ("synchronous", "normal") => options.synchronous = Synchronous::Normal,
                ("synchronous", _) => {
                    return Err(format!(
                        "`synchronous` must be `full` or `normal`, not `{value}`"
                    ));
                }
                ("replay_cache", _) => {
                    options.replay_cache = replay_cache::parse_capacity(value)?;
                }
                ("busy_timeout_ms", v) => {
                    let ms: u64 = v.parse().map_err(|_| {
                        format!("`busy_timeout_ms` must be a whole number of milliseconds, not `{value}`")
                    })?;
                    options.busy_timeout = Duration::from_millis(ms);
                }
                _ => {
                    return Err(format!(
                        "unknown option `{name}`; known: `synchronous`, `busy_timeout_ms`, `replay_cache`"
                    ));
                }
            }
        }
        Ok(options)
    }
}

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

struct Shared {
    options: SqliteOptions,
    queue: Mutex<Queue>,
    /// Wakes a lingering leader when a write is queued.
    queued: Condvar,
    /// The write connection; only the current leader locks it.
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    replays: ReplayCache,
}

/// Writes waiting for the next commit, and whether a leader is at work.
#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    leading: bool,
    /// A leader is waiting on `queued` for more writes.
    lingering: bool,
}

struct Job {
    op: Op,
    reply: oneshot::Sender<Answer>,
}

/// What a queued caller hears: its answer, or that it leads the next batch.
enum Answer {
    Done(Result<Reply, StoreError>),
    Lead(LeadToken),
}

/// The leadership of the next batch, with the receiver's own operation. If it is dropped
/// unused (the caller's future was dropped after it was sent), it passes itself on: the
/// leadership is never lost.
struct LeadToken {
    shared: Arc<Shared>,
    op: Option<Op>,
}

impl LeadToken {
    fn take(mut self) -> Op {
        self.op.take().expect("a lead token carries its operation")
    }
}

impl Drop for LeadToken {
    fn drop(&mut self) {
        if self.op.take().is_some() {
            hand_over(&self.shared);
        }
    }
}

enum Op {
    Claim {
        tenant: String,
        key: IdempotencyKey,
        tool: String,
        fingerprint: Fingerprint,
        now: UnixMillis,
        lease: Duration,
        ttl: Duration,
        orphans: Orphans,
    },
    Complete {
        tenant: String,
        key: IdempotencyKey,
        token: FencingToken,
        status: RecordStatus,
        result: Vec<u8>,
        expires_at: UnixMillis,
    },
    Release {
        tenant: String,
        key: IdempotencyKey,
        token: FencingToken,
    },
    Purge {
        now: UnixMillis,
        limit: usize,
    },
    Delete {
        tenant: String,
        key: IdempotencyKey,
    },
    Resolve {
        tenant: String,
        key: IdempotencyKey,
        /// The result to complete with; `None` releases.
        result: Option<Vec<u8>>,
        reason: String,
        now: UnixMillis,
    },
}

enum Reply {
    Claim(Claim),
    /// A replay decided on the write path, with what the replay cache needs.
    Replay {
        result: Vec<u8>,
        fingerprint: Fingerprint,
        expires_at: UnixMillis,
    },
    Fenced(Fenced),
    Purged(usize),
}

fn sql_error(op: &str, e: rusqlite::Error) -> StoreError {
    let kind = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreErrorKind::Timeout,
        Some(
            ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure,
        ) => StoreErrorKind::Unavailable,
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreErrorKind::Corrupt,
        _ if matches!(e, rusqlite::Error::SqliteFailure(_, Some(ref m)) if m.starts_with("no such table")) => {
            StoreErrorKind::Schema
        }
        _ => StoreErrorKind::Other,
    };
    StoreError::with_source(BACKEND, kind, format!("{op} failed"), e)
}

fn closed() -> StoreError {
    StoreError::new(
        BACKEND,
        StoreErrorKind::Closed,
        "a writer panicked while holding the write connection",
    )
}

/// Clamps a time to SQLite's signed 64-bit integers.
fn db_time(t: UnixMillis) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

fn bytes32(op: &str, blob: Vec<u8>) -> Result<[u8; 32], StoreError> {
    blob.try_into().map_err(|_| {
        StoreError::new(
            BACKEND,
            StoreErrorKind::Corrupt,
            format!("{op}: a 32-byte column has another length"),
        )
    })
}

fn status(op: &str, s: &str) -> Result<RecordStatus, StoreError> {
    RecordStatus::parse(s).ok_or_else(|| {
        StoreError::new(
            BACKEND,
            StoreErrorKind::Corrupt,
            format!("{op}: unknown status `{s}`"),
        )
    })
}

/// What a claim decides on, and the stored result when the record is completed.
type HeldRecord = (Held, Option<Vec<u8>>);

/// Reads what a claim decides on, without allocating for the fixed-size columns. The result is
/// copied only for completed records (the replay path).
fn read_held(
    conn: &Connection,
    tenant: &str,
    key: &IdempotencyKey,
) -> Result<Option<HeldRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(SELECT_HELD)
        .map_err(|e| sql_error("claim", e))?;
    let mut rows = stmt
        .query(params![tenant, &key.as_bytes()[..]])
        .map_err(|e| sql_error("claim", e))?;
    let Some(row) = rows.next().map_err(|e| sql_error("claim", e))? else {
        return Ok(None);
    };
    let corrupt =
        |what: &str| StoreError::new(BACKEND, StoreErrorKind::Corrupt, format!("claim: {what}"));
    let column = |i| row.get_ref(i).map_err(|e| sql_error("claim", e));
    let fingerprint: [u8; 32] = column(0)?
        .as_blob()
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("the fingerprint column is not 32 bytes"))?;
    let status = column(1)?
        .as_str()
        .ok()
        .and_then(RecordStatus::parse)
        .ok_or_else(|| corrupt("unknown status"))?;
    let time = |i| -> Result<u64, StoreError> {
        let t = column(i)?
            .as_i64()
            .map_err(|_| corrupt("a time column is not an integer"))?;
        Ok(t.max(0) as u64)
    };
    let held = Held {
        fingerprint: Fingerprint::from_bytes(fingerprint),
        status,
        lease_expires_at: time(2)?,
        expires_at: time(3)?,
    };
    let result = match status {
        RecordStatus::Completed => column(4)?
            .as_blob_or_null()
            .ok()
            .flatten()
            .map(<[u8]>::to_vec),
        RecordStatus::InFlight | RecordStatus::Unknown => None,
    };
    Ok(Some((held, result)))
}

fn open_connection(options: &SqliteOptions) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        &options.path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|e| {
        StoreError::with_source(
            BACKEND,
            StoreErrorKind::Unavailable,
            format!("cannot open `{}`", options.path.display()),
            e,
        )
    })?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| sql_error("setting busy_timeout", e))?;
    let sync = match options.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.execute_batch(&format!("PRAGMA synchronous = {sync};"))
        .map_err(|e| sql_error("setting synchronous", e))?;
    Ok(conn)
}

/// Switches the file to WAL. Several processes opening a new file at once race for that switch,
/// and SQLite answers `SQLITE_BUSY` at once (without its busy handler) to the losers: they retry
/// until the busy timeout, and find WAL already on.
fn enable_wal(conn: &Connection, busy_timeout: Duration) -> Result<String, StoreError> {
    let deadline = std::time::Instant::now() + busy_timeout;
    loop {
        let attempt = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
            .and_then(|mode| {
                if mode.eq_ignore_ascii_case("wal") {
                    Ok(mode)
                } else {
                    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                }
            });
        match attempt {
            Ok(mode) => return Ok(mode),
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(sql_error("enabling WAL", e)),
        }
    }
}

/// Creates the schema, or checks the one found, inside the write lock.
fn migrate(conn: &mut Connection, busy_timeout: Duration) -> Result<(), StoreError> {
    let mode = enable_wal(conn, busy_timeout)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::new(
            BACKEND,
            StoreErrorKind::Unavailable,
            format!("the file refused WAL mode (journal_mode is `{mode}`)"),
        ));
    }
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| sql_error("locking the schema", e))?;
    let has_meta: bool = tx
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
        .map_err(|e| sql_error("reading the schema", e))?;
    let found: Option<i64> = if has_meta {
        tx.query_row(
            "SELECT value FROM idem_meta WHERE name = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| sql_error("reading the schema version", e))?
    } else {
        None
    };
    match found {
        None => {
            tx.execute_batch(SCHEMA)
                .map_err(|e| sql_error("creating the schema", e))?;
            tx.execute(
                "INSERT INTO idem_meta (name, value) VALUES ('schema_version', ?1)",
                [SCHEMA_VERSION],
            )
            .map_err(|e| sql_error("recording the schema version", e))?;
        }
        Some(v) if v == i64::from(SCHEMA_VERSION) => {}
        Some(1) => {
            for step in UPGRADE_1_TO_2 {
                tx.execute_batch(step)
                    .map_err(|e| sql_error("upgrading the schema from version 1", e))?;
            }
        }
        Some(v) if v > i64::from(SCHEMA_VERSION) => {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Schema,
                format!(
                    "the file has schema version {v}, newer than this build's {SCHEMA_VERSION}; \
                     upgrade idem instead of writing to it"
                ),
            ));
        }
        Some(v) => {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Schema,
                format!("the file has unknown schema version {v}"),
            ));
        }
    }
    tx.commit()
        .map_err(|e| sql_error("committing the schema", e))
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
        Ok(SqliteStore {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                queued: Condvar::new(),
                writer: Mutex::new(writer),
                readers: Mutex::new(Vec::new()),
                replays: ReplayCache::new(options.replay_cache),
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

    /// Runs `f` on a pooled reader connection.
    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = self.shared.readers.lock().map_err(|_| closed())?.pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_connection(&self.shared.options)?,
        };
        let out = f(&conn);
        if let Ok(mut readers) = self.shared.readers.lock() {
            readers.push(conn);
        }
        out
    }

    /// Queues a write and waits for the commit that carries it, leading that commit if no one
    /// else is.
    /// [`SqliteStore::write`] for the operations that answer whether a fenced write applied.
    async fn write_fenced(&self, op: Op) -> Result<Fenced, StoreError> {
        match self.write(op).await? {
            Reply::Fenced(f) => Ok(f),
            _ => Err(unexpected()),
        }
    }

    async fn write(&self, op: Op) -> Result<Reply, StoreError> {
        let mut op = op;
        let mut front = false;
        loop {
            let (reply, answer) = oneshot::channel();
            let (lead, wake) = {
                let mut queue = self.shared.queue.lock().map_err(|_| closed())?;
                let job = Job { op, reply };
                if front {
                    queue.jobs.insert(0, job);
                } else {
                    queue.jobs.push(job);
                }
                let lead = !std::mem::replace(&mut queue.leading, true) || front;
                (lead, queue.lingering)
            };
            if wake {
                self.shared.queued.notify_one();
            }
            if lead {
                self.lead();
            }
            match answer.await.map_err(|_| closed())? {
                Answer::Done(result) => return result,
                // The previous leader handed the next batch to us: our job goes first.
                Answer::Lead(token) => {
                    op = token.take();
                    front = true;
                }
            }
        }
    }

    /// Leads commits. A lone caller commits its own write on its own thread: nothing to wait
    /// for. When others are queued too, the leading moves to a blocking thread of the runtime,
    /// which commits batch after batch until the queue is empty, so that no async worker is held
    /// in `fsync` while there is work for it.
    fn lead(&self) {
        let contended = self
            .shared
            .queue
            .lock()
            .map(|q| q.jobs.len() > 1)
            .unwrap_or(false);
        if contended && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = self.shared.clone();
            runtime.spawn_blocking(move || lead_rounds(&shared, usize::MAX, LINGER));
            return;
        }
        lead_rounds(&self.shared, 1, Duration::ZERO);
    }
}

/// How long a leader on a blocking thread waits for more writes before it stops leading: the
/// callers it just answered usually send their next write within this time.
const LINGER: Duration = Duration::from_micros(500);

/// Commits up to `rounds` batches, then hands the leadership on. When the queue is empty it
/// waits up to `linger` for more, then ends the leadership.
fn lead_rounds(shared: &Arc<Shared>, rounds: usize, linger: Duration) {
    let guard = LeaderGuard(shared);
    for _ in 0..rounds {
        let batch: Vec<Job> = {
            let Ok(mut queue) = shared.queue.lock() else {
                return;
            };
            if queue.jobs.is_empty() && !linger.is_zero() {
                queue.lingering = true;
                queue = match shared.queued.wait_timeout(queue, linger) {
                    Ok((queue, _)) => queue,
                    Err(_) => return,
                };
                queue.lingering = false;
            }
            if queue.jobs.is_empty() {
                queue.leading = false;
                std::mem::forget(guard);
                return;
            }
            let n = queue.jobs.len().min(MAX_BATCH);
            queue.jobs.drain(..n).collect()
        };
        match shared.writer.lock() {
            Ok(mut conn) => run_batch(&mut conn, batch),
            Err(_) => {
                for job in batch {
                    let _ = job.reply.send(Answer::Done(Err(closed())));
                }
            }
        }
    }
    std::mem::forget(guard);
    hand_over(shared);
}

/// Passes the leadership to the first queued caller that is still waiting, or ends it.
fn hand_over(shared: &Arc<Shared>) {
    let Ok(mut queue) = shared.queue.lock() else {
        return;
    };
    while !queue.jobs.is_empty() {
        let job = queue.jobs.remove(0);
        let token = LeadToken {
            shared: shared.clone(),
            op: Some(job.op),
        };
        match job.reply.send(Answer::Lead(token)) {
            Ok(()) => return,
            // That caller gave up (its future was dropped): its write is not made. Disarm the
            // token (we hold the queue lock) and try the next one.
            Err(Answer::Lead(mut token)) => token.op = None,
            Err(Answer::Done(_)) => unreachable!("we sent a lead"),
        }
    }
    queue.leading = false;
}

/// If a leader unwinds, the leadership passes on instead of being held forever.
struct LeaderGuard<'a>(&'a Arc<Shared>);

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        hand_over(self.0);
    }
}

fn run_batch(conn: &mut Connection, batch: Vec<Job>) {
    let tx = match conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let message = format!("taking the write lock failed ({e})");
            let kind = sql_error("", e).kind();
            for job in batch {
                let _ = job.reply.send(Answer::Done(Err(StoreError::new(
                    BACKEND,
                    kind,
                    message.clone(),
                ))));
            }
            return;
        }
    };
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        let answer = apply(&tx, job.op);
        answers.push((job.reply, answer));
    }
    match tx.commit() {
        Ok(()) => {
            for (reply, answer) in answers {
                let _ = reply.send(Answer::Done(answer));
            }
        }
        Err(e) => {
            // The commit failed: nothing of this batch is durable, so no answer may say it is.
            let message = format!("commit failed ({e})");
            let kind = sql_error("", e).kind();
            for (reply, _) in answers {
                let _ = reply.send(Answer::Done(Err(StoreError::new(
                    BACKEND,
                    kind,
                    message.clone(),
                ))));
            }
        }
    }
}

fn apply(tx: &rusqlite::Transaction<'_>, op: Op) -> Result<Reply, StoreError> {
    match op {
        Op::Claim {
            tenant,
            key,
            tool,
            fingerprint,
            now,
            lease,
            ttl,
            orphans,
        } => {
            let held = read_held(tx, &tenant, &key)?;
            let claim = match decide(held.as_ref().map(|h| h.0), fingerprint, now, orphans) {
                Decision::Mismatch => Claim::Mismatch,
                Decision::Blocked => Claim::Unknown,
                Decision::MarkUnknown => {
                    tx.prepare_cached(
                        "UPDATE idem_records SET status = 'unknown' WHERE tenant = ?1 AND key = ?2",
                    )
                    .and_then(|mut s| s.execute(params![tenant, &key.as_bytes()[..]]))
                    .map_err(|e| sql_error("claim", e))?;
                    Claim::Unknown
                }
                Decision::InFlight { lease_expires_at } => Claim::InFlight { lease_expires_at },
                Decision::Replay => {
                    let (held, result) = held.expect("a replay has a record");
                    return Ok(Reply::Replay {
                        result: result.unwrap_or_default(),
                        fingerprint: held.fingerprint,
                        expires_at: held.expires_at,
                    });
                }
                Decision::Insert => {
                    let token = FencingToken::generate();
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO idem_records (tenant, key, tool, fingerprint, \
                         status, token, lease_expires_at, created_at, expires_at, result) \
                         VALUES (?1, ?2, ?3, ?4, 'in_flight', ?5, ?6, ?7, ?8, NULL)",
                    )
                    .and_then(|mut s| {
                        s.execute(params![
                            tenant,
                            &key.as_bytes()[..],
                            tool,
                            &fingerprint.as_bytes()[..],
                            token.get() as i64,
                            db_time(after(now, lease)),
                            db_time(now),
                            db_time(after(now, ttl)),
                        ])
                    })
                    .map_err(|e| sql_error("claim", e))?;
                    Claim::Acquired {
                        token,
                        takeover: false,
                    }
                }
                Decision::Takeover => {
                    let token = FencingToken::generate();
                    tx.prepare_cached(
                        "UPDATE idem_records SET status = 'in_flight', token = ?3, \
                         lease_expires_at = ?4, result = NULL WHERE tenant = ?1 AND key = ?2",
                    )
                    .and_then(|mut s| {
                        s.execute(params![
                            tenant,
                            &key.as_bytes()[..],
                            token.get() as i64,
                            db_time(after(now, lease)),
                        ])
                    })
                    .map_err(|e| sql_error("claim", e))?;
                    Claim::Acquired {
                        token,
                        takeover: true,
                    }
                }
            };
            Ok(Reply::Claim(claim))
        }
        Op::Complete {
            tenant,
            key,
            token,
            status,
            result,
            expires_at,
        } => {
            let n = tx
                .prepare_cached(
                    "UPDATE idem_records SET status = ?6, result = ?4, expires_at = ?5 \
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND status = 'in_flight'",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        tenant,
                        &key.as_bytes()[..],
                        token.get() as i64,
                        result,
                        db_time(expires_at),
                        status.as_str(),
                    ])
                })
                .map_err(|e| sql_error("complete", e))?;
            Ok(Reply::Fenced(if n == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            }))
        }
        Op::Release { tenant, key, token } => {
            let n = tx
                .prepare_cached(
                    "DELETE FROM idem_records \
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND status = 'in_flight'",
                )
                .and_then(|mut s| {
                    s.execute(params![tenant, &key.as_bytes()[..], token.get() as i64])
                })
                .map_err(|e| sql_error("release", e))?;
            Ok(Reply::Fenced(if n == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            }))
        }
        Op::Delete { tenant, key } => {
            let n = tx
                .prepare_cached("DELETE FROM idem_records WHERE tenant = ?1 AND key = ?2")
                .and_then(|mut s| s.execute(params![tenant, &key.as_bytes()[..]]))
                .map_err(|e| sql_error("delete", e))?;
            Ok(Reply::Fenced(if n == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            }))
        }
        Op::Resolve {
            tenant,
            key,
            result,
            reason,
            now,
        } => {
            let key = &key.as_bytes()[..];
            let n = match result {
                Some(result) => {
                    tx.prepare_cached(&format!(
                        "UPDATE idem_records SET status = 'completed', result = ?4, note = ?5, \
                         token = 0 WHERE {BLOCKED}"
                    ))
                    .and_then(|mut s| s.execute(params![tenant, key, db_time(now), result, reason]))
                }
                None => tx
                    .prepare_cached(&format!("DELETE FROM idem_records WHERE {BLOCKED}"))
                    .and_then(|mut s| s.execute(params![tenant, key, db_time(now)])),
            }
            .map_err(|e| sql_error("resolve", e))?;
            Ok(Reply::Fenced(if n == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            }))
        }
        Op::Purge { now, limit } => {
            let n = tx
                .prepare_cached(
                    "DELETE FROM idem_records WHERE (tenant, key) IN \
                     (SELECT tenant, key FROM idem_records WHERE expires_at <= ?1 LIMIT ?2)",
                )
                .and_then(|mut s| s.execute(params![db_time(now), limit as i64]))
                .map_err(|e| sql_error("purge", e))?;
            Ok(Reply::Purged(n))
        }
    }
}

/// A row of [`RECORD_COLUMNS`].
fn decode_record(op: &str, row: &rusqlite::Row<'_>) -> Result<Record, StoreError> {
    let get = |e| sql_error(op, e);
    let time =
        |i| -> Result<u64, StoreError> { Ok(row.get::<_, i64>(i).map_err(get)?.max(0) as u64) };
    Ok(Record {
        tenant: row.get(0).map_err(get)?,
        key: IdempotencyKey::from_bytes(bytes32(op, row.get(1).map_err(get)?)?),
        tool: row.get(2).map_err(get)?,
        fingerprint: Fingerprint::from_bytes(bytes32(op, row.get(3).map_err(get)?)?),
        status: status(op, &row.get::<_, String>(4).map_err(get)?)?,
        token: FencingToken::from_raw(row.get::<_, i64>(5).map_err(get)? as u64),
        lease_expires_at: time(6)?,
        created_at: time(7)?,
        expires_at: time(8)?,
        result: row.get(9).map_err(get)?,
        note: row.get(10).map_err(get)?,
    })
}

fn unexpected() -> StoreError {
    StoreError::new(
        BACKEND,
        StoreErrorKind::Other,
        "the write path answered another operation",
    )
}

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            let replays = &self.shared.replays;
            if let Some(answer) = replays.get(req.tenant, &req.key, req.fingerprint, req.now) {
                return Ok(answer);
            }
            // A committed snapshot answers every claim that cannot write, without queueing
            // behind the commits of others.
            let snapshot = self.read(|conn| read_held(conn, req.tenant, &req.key))?;
            if let Some((held, result)) = snapshot {
                match decide(Some(held), req.fingerprint, req.now, req.orphans) {
                    Decision::Replay => {
                        let result = result.unwrap_or_default();
                        let (tenant, key) = (req.tenant, req.key);
                        replays.put(tenant, key, held.fingerprint, &result, held.expires_at);
                        return Ok(Claim::Completed { result });
                    }
                    Decision::Mismatch => return Ok(Claim::Mismatch),
                    Decision::InFlight { lease_expires_at } => {
                        return Ok(Claim::InFlight { lease_expires_at });
                    }
                    Decision::Blocked => return Ok(Claim::Unknown),
                    Decision::Insert | Decision::Takeover | Decision::MarkUnknown => {}
                }
            }
            let op = Op::Claim {
                tenant: req.tenant.to_owned(),
                key: req.key,
                tool: req.tool.to_owned(),
                fingerprint: req.fingerprint,
                now: req.now,
                lease: req.lease,
                ttl: req.ttl,
                orphans: req.orphans,
            };
            match self.write(op).await? {
                Reply::Claim(claim) => Ok(claim),
                Reply::Replay {
                    result,
                    fingerprint,
                    expires_at,
                } => {
                    replays.put(req.tenant, req.key, fingerprint, &result, expires_at);
                    Ok(Claim::Completed { result })
                }
                _ => Err(unexpected()),
            }
        })
    }

    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let op = Op::Complete {
                tenant: c.tenant.to_owned(),
                key: c.key,
                token: c.token,
                status: c.status,
                result: c.result.to_vec(),
                expires_at: after(c.now, c.ttl),
            };
            self.write_fenced(op).await
        })
    }

    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let op = Op::Release {
                tenant: tenant.to_owned(),
                key,
                token,
            };
            self.write_fenced(op).await
        })
    }

    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            self.read(|conn| {
                let sql = format!(
                    "SELECT {RECORD_COLUMNS} FROM idem_records WHERE tenant = ?1 AND key = ?2"
                );
                let mut stmt = conn
                    .prepare_cached(&sql)
                    .map_err(|e| sql_error("lookup", e))?;
                let mut rows = stmt
                    .query(params![tenant, &key.as_bytes()[..]])
                    .map_err(|e| sql_error("lookup", e))?;
                match rows.next().map_err(|e| sql_error("lookup", e))? {
                    Some(row) => decode_record("lookup", row).map(Some),
                    None => Ok(None),
                }
            })
        })
    }

    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            match self.write(Op::Purge { now, limit }).await? {
                Reply::Purged(n) => Ok(n),
                _ => Err(unexpected()),
            }
        })
    }

    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        Box::pin(async move {
            self.read(|conn| {
                let version: i64 = conn
                    .query_row(
                        "SELECT value FROM idem_meta WHERE name = 'schema_version'",
                        [],
                        |r| r.get(0),
                    )
                    .map_err(|e| sql_error("reading the schema version", e))?;
                let sync: i64 = conn
                    .query_row("PRAGMA synchronous", [], |r| r.get(0))
                    .map_err(|e| sql_error("reading synchronous", e))?;
                Ok(StoreHealth {
                    backend: BACKEND,
                    schema_version: u32::try_from(version).unwrap_or(0),
                    expected_schema_version: SCHEMA_VERSION,
                    durable: sync >= 2,
                    detail: (sync < 2).then(|| {
                        "synchronous=normal: a claim survives a crash of the process, not a \
                         power loss"
                            .to_owned()
                    }),
                })
            })
        })
    }
}

impl AdminStore for SqliteStore {
    fn delete<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let op = Op::Delete {
                tenant: tenant.to_owned(),
                key,
            };
            self.write_fenced(op).await
        })
    }

    fn scan<'a>(
        &'a self,
        tenant: Option<&'a str>,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            let (after_tenant, after_key) = admin::scan_start(cursor, BACKEND)?;
            let limit = limit.max(1);
            let records = self.read(|conn| {
                let sql = format!(
                    "SELECT {RECORD_COLUMNS} FROM idem_records \
                     WHERE (?1 IS NULL OR tenant = ?1) AND (tenant, key) > (?2, ?3) \
                     ORDER BY tenant, key LIMIT ?4"
                );
                let mut stmt = conn
                    .prepare_cached(&sql)
                    .map_err(|e| sql_error("scan", e))?;
                let mut rows = stmt
                    .query(params![tenant, after_tenant, after_key, (limit + 1) as i64])
                    .map_err(|e| sql_error("scan", e))?;
                let mut records = Vec::new();
                while let Some(row) = rows.next().map_err(|e| sql_error("scan", e))? {
                    records.push(decode_record("scan", row)?);
                }
                Ok(records)
            })?;
            Ok(super::memory::page(records, limit))
        })
    }

    fn resolve<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        resolution: Resolution<'a>,
        reason: &'a str,
        now: UnixMillis,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let op = Op::Resolve {
                tenant: tenant.to_owned(),
                key,
                result: match resolution {
                    Resolution::Complete { result } => Some(result.to_vec()),
                    Resolution::Release => None,
                },
                reason: reason.to_owned(),
                now,
            };
            self.write_fenced(op).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn temp_store() -> SqliteStore {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.keep().join("conformance.db");
        SqliteStore::open_path(path).expect("open")
    }

    crate::store_conformance_tests!(temp_store());
    crate::admin_conformance_tests!(temp_store());

    #[test]
    fn url_options_are_parsed_and_checked() {
        let o = SqliteOptions::from_url_rest("data/idem.db?synchronous=normal&busy_timeout_ms=250")
            .unwrap();
        assert_eq!(o.path, PathBuf::from("data/idem.db"));
        assert_eq!(o.synchronous, Synchronous::Normal);
        assert_eq!(o.busy_timeout, Duration::from_millis(250));
        assert!(
            SqliteOptions::from_url_rest("")
                .unwrap_err()
                .contains("names no file")
        );
        assert!(
            SqliteOptions::from_url_rest("a.db?synchronous=off")
                .unwrap_err()
                .contains("`full` or `normal`")
        );
        assert!(
            SqliteOptions::from_url_rest("a.db?journal=x")
                .unwrap_err()
                .contains("unknown option `journal`")
        );
    }

    #[test]
    fn a_newer_schema_is_refused_not_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("newer.db");
        drop(SqliteStore::open_path(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE idem_meta SET value = 99 WHERE name = 'schema_version'",
            [],
        )
        .unwrap();
        drop(conn);
        let err = SqliteStore::open_path(&path).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Schema);
        assert!(err.to_string().contains("schema version 99"), "{err}");
        let conn = Connection::open(&path).unwrap();
        let v: i64 = conn
            .query_row(
                "SELECT value FROM idem_meta WHERE name = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(v, 99, "the file is left as it was");
    }

    #[tokio::test]
    async fn a_version_1_file_is_upgraded_with_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE idem_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
             CREATE TABLE idem_records (
                 tenant TEXT NOT NULL, key BLOB NOT NULL, tool TEXT NOT NULL,
                 fingerprint BLOB NOT NULL,
                 status TEXT NOT NULL CHECK (status IN ('in_flight', 'completed')),
                 token INTEGER NOT NULL, lease_expires_at INTEGER NOT NULL,
                 created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, result BLOB,
                 PRIMARY KEY (tenant, key)) WITHOUT ROWID;
             CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
             INSERT INTO idem_meta VALUES ('schema_version', 1);",
        )
        .unwrap();
        let key = crate::key::derive_key("t", "tool", &[crate::key::KeyPart::new(&1).unwrap()]);
        conn.execute(
            "INSERT INTO idem_records VALUES ('t', ?1, 'tool', ?2, 'completed', 5, 0, 1, ?3, ?4)",
            params![&key.as_bytes()[..], &[7u8; 32][..], i64::MAX, &b"kept"[..]],
        )
        .unwrap();
        drop(conn);

        let store = SqliteStore::open_path(&path).unwrap();
        let health = store.health().await.unwrap();
        assert_eq!(health.schema_version, SCHEMA_VERSION);
        let record = store.lookup("t", key).await.unwrap().expect("kept");
        assert_eq!(record.result.as_deref(), Some(&b"kept"[..]));
        assert_eq!(record.status, RecordStatus::Completed);
        // The new status is accepted now.
        let conn = Connection::open(&path).unwrap();
        conn.execute("UPDATE idem_records SET status = 'unknown'", [])
            .unwrap();
        let indexes: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' \
                 AND name = 'idem_records_expires_at' AND tbl_name = 'idem_records'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(indexes, 1, "the expiry index is on the new table");
    }

    #[test]
    fn a_missing_directory_is_a_clear_error() {
        let err = SqliteStore::open_path("/nonexistent-idem-dir/x.db").unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable);
        assert!(
            err.to_string().contains("directory does not exist"),
            "{err}"
        );
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
        let key = crate::key::derive_key("t", "tool", &[]);
        let err = store
            .claim(ClaimRequest {
                tenant: "t",
                key,
                tool: "tool",
                fingerprint: Fingerprint::from_bytes([0; 32]),
                now: 1,
                lease: Duration::from_secs(1),
                ttl: Duration::from_secs(1),
                orphans: crate::store::Orphans::TakeOver,
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Schema, "{err}");
    }

    /// Callers that give up while queued (their futures dropped, as an agent loop cancelling a
    /// tool call does) never strand the leadership: everyone else is answered, and later writes
    /// still commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_callers_never_strand_the_group_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open_path(dir.path().join("drop.db")).unwrap());
        let claim = |store: Arc<SqliteStore>, n: u32| async move {
            let key = crate::key::derive_key("t", "tool", &[crate::key::KeyPart::new(&n).unwrap()]);
            store
                .claim(ClaimRequest {
                    tenant: "t",
                    key,
                    tool: "tool",
                    fingerprint: Fingerprint::from_bytes([1; 32]),
                    now: 1_000,
                    lease: Duration::from_secs(30),
                    ttl: Duration::from_secs(60),
                    orphans: crate::store::Orphans::TakeOver,
                })
                .await
        };
        for round in 0..20u32 {
            let mut kept = tokio::task::JoinSet::new();
            let mut dropped = Vec::new();
            for i in 0..32 {
                let task = tokio::spawn(claim(store.clone(), round * 100 + i));
                if i % 3 == 0 {
                    dropped.push(task);
                } else {
                    kept.spawn(task);
                }
            }
            tokio::task::yield_now().await;
            for task in dropped {
                task.abort();
            }
            let all = async {
                while let Some(done) = kept.join_next().await {
                    let claim = done.unwrap().unwrap().unwrap();
                    assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
                }
            };
            tokio::time::timeout(Duration::from_secs(30), all)
                .await
                .expect("every caller that stayed is answered (no stranded leadership)");
        }
        let last = tokio::time::timeout(Duration::from_secs(30), claim(store.clone(), 99_999))
            .await
            .expect("the store still commits");
        assert!(matches!(last.unwrap(), Claim::Acquired { .. }));
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
