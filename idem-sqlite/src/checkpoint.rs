//! Checkpoints apart from commits: the writer's WAL is copied back into the database file by a
//! thread of the store, on a connection of its own, rather than inside the leader's `COMMIT`.
//!
//! SQLite's own policy (`wal_autocheckpoint`, 1,000 pages) runs a checkpoint inside the commit
//! that takes the WAL past 1,000 pages: the committing connection syncs the WAL, copies the
//! frames back and syncs the database file before `COMMIT` returns. Under many callers that
//! commit is the group commit's leader, and every caller queued behind it waits for those two
//! syncs (`strace` of the `costs` bench, 64 callers: 359 checkpoint `fsync`s on the leader's
//! thread, 1.8 ms median, 11 ms at p90, a quarter of the run's time).
//!
//! | the WAL after a commit | who checkpoints |
//! |---|---|
//! | under [`BACKGROUND_FROM`] pages | nobody |
//! | from [`BACKGROUND_FROM`] pages | the checkpoint thread (started on demand, ends after [`IDLE`]), `PASSIVE`, while the leader goes on |
//! | from [`INLINE_FROM`] pages | the leader, in its commit, as SQLite's own policy does |
//!
//! A checkpoint beside the writer copies back every frame committed before it began, but the
//! WAL starts again from its beginning only when a write transaction finds every frame copied
//! back; under a steady stream of commits that seldom happens, and the WAL would grow without
//! bound. So the leader still checkpoints past [`INLINE_FROM`] pages: by then the thread copied
//! nearly every frame back, the leader copies the rest, and its next transaction starts the WAL
//! again. The WAL's size stays bounded (about [`INLINE_FROM`] pages), and the leader syncs for a
//! checkpoint a quarter as often as SQLite's policy would make it.
//!
//! Durability is SQLite's either way: a checkpoint syncs the WAL before it copies anything and
//! the database file before it marks the frames copied, whoever runs it.

use std::ffi::c_int;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::Connection;
use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;

use super::driver::sql_error;
use super::options::SqliteOptions;
use super::schema::open_connection;
use idem_core::StoreError;

/// WAL pages from which a commit asks the checkpoint thread for a checkpoint: SQLite's own
/// `wal_autocheckpoint`.
pub(super) const BACKGROUND_FROM: c_int = 1_000;

/// WAL pages from which the leader checkpoints in its commit, so that the WAL starts again.
pub(super) const INLINE_FROM: c_int = 4 * BACKGROUND_FROM;

/// How long the checkpoint thread waits for another request before it ends.
const IDLE: Duration = Duration::from_millis(500);

/// Installs the checkpoint policy on the writer (replacing SQLite's `wal_autocheckpoint`).
pub(super) fn install(writer: &mut Connection, options: &SqliteOptions) -> Result<(), StoreError> {
    let inner = Arc::new(Inner {
        options: options.clone(),
        state: Mutex::new(State::default()),
        requested: Condvar::new(),
    });
    // The WAL's size (in BACKGROUND_FROM pages) at the last request: one request each time it
    // grows past another BACKGROUND_FROM pages, so that a checkpoint copies back a page
    // rewritten by many commits once, as SQLite's policy does.
    let mut requested = 0;
    writer
        .wal_hook(Some(move |wal: &mut Wal, pages: c_int| {
            if pages >= INLINE_FROM {
                // Busy (the thread checkpoints now) is no failure: the next commit tries again.
                // An error here would make `COMMIT` report a failure of a commit that was made.
                let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
            } else if pages / BACKGROUND_FROM != requested {
                requested = pages / BACKGROUND_FROM;
                if requested > 0 {
                    Inner::request(&inner);
                }
            }
            Ok(())
        }))
        .map_err(|e| sql_error("installing the checkpoint policy", e))
}

struct Inner {
    /// How to open the thread's connection.
    options: SqliteOptions,
    state: Mutex<State>,
    /// Wakes the thread when a checkpoint is requested.
    requested: Condvar,
}

#[derive(Default)]
struct State {
    /// A commit asked for a checkpoint the thread has not begun.
    wanted: bool,
    /// The thread runs.
    running: bool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks for a checkpoint; starts the thread if none runs. Never waits for it.
    fn request(inner: &Arc<Inner>) {
        let mut state = inner.lock();
        state.wanted = true;
        if state.running {
            inner.requested.notify_one();
            return;
        }
        let thread = Arc::clone(inner);
        let spawned = std::thread::Builder::new()
            .name("idem-sqlite-checkpoint".into())
            .spawn(move || thread.run());
        // No thread: the leader checkpoints past `INLINE_FROM`, as without one.
        state.running = spawned.is_ok();
    }

    /// The checkpoint thread: a `PASSIVE` checkpoint per request, until none comes for
    /// [`IDLE`]. A connection it cannot open, or a checkpoint that fails, leaves the WAL to the
    /// leader's checkpoints.
    fn run(&self) {
        let conn = open_connection(&self.options).ok();
        let mut state = self.lock();
        loop {
            let (next, idle) = self
                .requested
                .wait_timeout_while(state, IDLE, |state| !state.wanted)
                .unwrap_or_else(PoisonError::into_inner);
            state = next;
            if idle.timed_out() {
                state.running = false;
                return;
            }
            state.wanted = false;
            drop(state);
            if let Some(conn) = &conn {
                let _ = conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE);
            }
            state = self.lock();
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::time::Instant;

    /// A writer with the policy installed, on a new file, with a table to fill.
    fn writer(dir: &std::path::Path) -> (Connection, SqliteOptions) {
        let options = SqliteOptions::new(dir.join("ckpt.db"));
        let mut conn = open_connection(&options).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);",
        )
        .unwrap();
        install(&mut conn, &options).unwrap();
        (conn, options)
    }

    /// One commit of a few pages (rows of 3 KiB under new keys).
    fn commit(conn: &Connection, n: i64) {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        for k in n * 4..n * 4 + 4 {
            conn.execute("INSERT INTO t VALUES (?1, zeroblob(3000))", [k])
                .unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
    }

    /// The frames in the WAL of the database at `db` (of SQLite's default 4 KiB pages).
    pub(crate) fn wal_pages(db: &std::path::Path) -> u64 {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::metadata(wal).expect("the WAL exists").len() / (4096 + 24)
    }

    /// Past BACKGROUND_FROM pages (and short of INLINE_FROM) the thread copies the frames back
    /// without a commit doing it: the database file (a few pages until a checkpoint) grows to
    /// the distinct pages of those frames while nobody writes.
    #[test]
    fn the_thread_checkpoints_past_background_from() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, options) = writer(dir.path());
        let mut n = 0;
        while wal_pages(&options.path) < BACKGROUND_FROM as u64 + 100 {
            commit(&conn, n);
            n += 1;
        }
        assert!(wal_pages(&options.path) < INLINE_FROM as u64);
        let deadline = Instant::now() + Duration::from_secs(30);
        let db_len = || std::fs::metadata(&options.path).unwrap().len();
        while db_len() < 4096 * BACKGROUND_FROM as u64 / 2 {
            assert!(
                Instant::now() < deadline,
                "no checkpoint: the database file is {} bytes",
                db_len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Commits without pause never let a checkpoint beside them copy every frame back; the
    /// leader's checkpoint past INLINE_FROM pages still starts the WAL again, so its size stays
    /// bounded (SQLite's policy alone, with a checkpoint thread, would let it grow).
    #[test]
    fn the_wal_stays_bounded_under_commits_without_pause() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, options) = writer(dir.path());
        // About 30,000 pages written, seven times INLINE_FROM.
        for n in 0..7_500 {
            commit(&conn, n);
        }
        let pages = wal_pages(&options.path);
        // Past INLINE_FROM, a commit whose checkpoint found the thread's under way (busy)
        // leaves it to the next commit.
        assert!(
            pages < (INLINE_FROM + BACKGROUND_FROM) as u64,
            "the WAL grew to {pages} pages"
        );
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 30_000);
    }
}
