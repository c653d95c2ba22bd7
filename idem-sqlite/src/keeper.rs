//! The read-lock keeper: one connection that holds a read transaction on the newest snapshot,
//! so that the reader pool's read transactions take their WAL read lock without a system call.
//!
//! Every read transaction in WAL mode takes a shared lock on one of the WAL's read-mark slots and
//! drops it at the end: two `fcntl` calls, measured at 40 % of a replay that misses the replay
//! cache (perf; 50 % of a hand-written point `SELECT`). SQLite's unix VFS counts the shared locks
//! that the connections of one process hold on a slot, and only the first one asks the kernel.
//! A reader whose snapshot is the keeper's (nothing committed since the keeper pinned) takes the
//! keeper's slot, so its lock costs a counter. Reads still see the newest commit: a reader that
//! finds a newer one takes another slot, as without a keeper.
//!
//! A pinned reader holds back the WAL, which is why the keeper lets go whenever that matters:
//!
//! | who writes | what a pin would hold back | what the keeper does |
//! |---|---|---|
//! | this store's leader | its commit's checkpoint (no frame past the pin is copied back) and the restart of the WAL from its start | unpinned before `BEGIN IMMEDIATE`, until after `COMMIT`: the commit and its checkpoint run as with no keeper |
//! | another connection (another process) | the same, for that writer | the leader or the next pin sees the foreign commit (`PRAGMA data_version`): no pin for [`QUIET`] |
//! | nobody | nothing | pinned, renewed by a reader after [`PIN_LIFE`] |
//!
//! A pin no reader renews (this process stopped reading) is ended by a sweeper thread within
//! two [`PIN_LIFE`]s. So another process's writes are held back by one pin at most (under
//! 2 × [`PIN_LIFE`]) before the keeper stands aside for [`QUIET`]. Readers pin the keeper lazily
//! and never wait for it; the keeper is only ever a saving, and a failure to pin leaves the
//! reads as they would be without it. Measured across two processes
//! (`integration/tests/cross_process.rs`): 3,000 commits of a writer process beside a store that
//! replays without pause leave its WAL at 4.4 MiB, SQLite's own bound; 36 MiB when the keeper
//! does not stand aside.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// How long one pin lives before a reader renews it (and checks for foreign commits), or the
/// sweeper ends it when no reader comes.
pub(super) const PIN_LIFE: Duration = Duration::from_millis(50);

/// How long the keeper stays unpinned after it saw another connection commit.
pub(super) const QUIET: Duration = Duration::from_secs(1);

/// Sweeper rounds without a pin after which the sweeper thread ends (a later pin starts another).
const IDLE_ROUNDS: u32 = 20;

/// The keeper, shared by the readers (which pin it), the leader (which unpins it) and the
/// sweeper thread (which ends a pin no reader renewed).
pub(super) struct KeeperCell(Arc<Mutex<Keeper>>);

impl KeeperCell {
    pub(super) fn new(conn: Connection) -> Self {
        KeeperCell(Arc::new(Mutex::new(Keeper::new(conn))))
    }

    /// Before a reader's read transaction: pins the keeper or renews its pin, and starts the
    /// sweeper if none runs. Never waits: the leader holds the keeper while it writes.
    pub(super) fn before_read(&self) {
        let mut keeper = match self.0.try_lock() {
            Ok(keeper) => keeper,
            Err(TryLockError::Poisoned(keeper)) => keeper.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        keeper.refresh(Instant::now());
        if keeper.pin.is_some() && !keeper.sweeping {
            let cell = Arc::downgrade(&self.0);
            let spawned = std::thread::Builder::new()
                .name("idem-sqlite-keeper".into())
                .spawn(move || sweep(&cell));
            match spawned {
                Ok(_) => keeper.sweeping = true,
                // Without a sweeper nothing would end a pin if the reads stopped.
                Err(_) => keeper.stand_aside(Instant::now()),
            }
        }
    }

    /// The keeper, unpinned, for the leader to hold until after its commit.
    pub(super) fn for_write(&self) -> MutexGuard<'_, Keeper> {
        let mut keeper = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        keeper.unpin_for_write();
        keeper
    }

    /// Whether the keeper ever stood aside for another connection's writes.
    #[cfg(test)]
    pub(super) fn stood_aside(&self) -> bool {
        self.0.lock().unwrap().quiet_until.is_some()
    }
}

/// The sweeper: ends a pin that lived [`PIN_LIFE`] (no reader came to renew it), so that an idle
/// process never holds back another's writes. Ends with the store, or after [`IDLE_ROUNDS`]
/// rounds without a pin.
fn sweep(cell: &Weak<Mutex<Keeper>>) {
    let mut idle = 0;
    loop {
        std::thread::sleep(PIN_LIFE);
        let Some(cell) = cell.upgrade() else {
            return;
        };
        let mut keeper = cell.lock().unwrap_or_else(PoisonError::into_inner);
        match keeper.pin {
            Some(pin) => {
                idle = 0;
                if pin.at.elapsed() >= PIN_LIFE {
                    keeper.release();
                }
            }
            None => idle += 1,
        }
        if idle >= IDLE_ROUNDS {
            keeper.sweeping = false;
            return;
        }
    }
}

/// The keeper connection and what it holds.
pub(super) struct Keeper {
    conn: Connection,
    pin: Option<Pin>,
    /// The `data_version` of the last pin, when this store has not written since it ended: the
    /// next pin reading another one saw a commit by someone else.
    released: Option<i64>,
    /// No pin before this instant: another connection writes to the file.
    quiet_until: Option<Instant>,
    /// The writer's `data_version` at its last transaction: it changes only when another
    /// connection commits.
    writer_version: Option<i64>,
    /// A sweeper thread runs.
    sweeping: bool,
}

#[derive(Clone, Copy)]
struct Pin {
    at: Instant,
    version: i64,
}

impl Keeper {
    fn new(conn: Connection) -> Self {
        Keeper {
            conn,
            pin: None,
            released: None,
            quiet_until: None,
            writer_version: None,
            sweeping: false,
        }
    }

    /// Pins a read transaction on the newest snapshot if there is none, or renews one older
    /// than [`PIN_LIFE`].
    fn refresh(&mut self, now: Instant) {
        match self.pin {
            Some(pin) if now.saturating_duration_since(pin.at) < PIN_LIFE => return,
            Some(_) => self.release(),
            None => {}
        }
        if self.quiet_until.is_some_and(|until| now < until) {
            return;
        }
        self.pin_at(now);
    }

    /// Ends the pin before this store writes: the next pin compares with nothing.
    fn unpin_for_write(&mut self) {
        self.released = None;
        self.end();
    }

    /// Ends a pin that lived its time, remembering what it saw.
    fn release(&mut self) {
        self.released = self.pin.map(|pin| pin.version);
        self.end();
    }

    fn end(&mut self) {
        self.pin = None;
        if !self.conn.is_autocommit() {
            // Prepared once, as `BEGIN` is: the leader ends a pin at every batch.
            let _ = self
                .conn
                .prepare_cached("COMMIT")
                .and_then(|mut commit| commit.execute([]));
        }
    }

    /// Notes the writer's `data_version`, read inside its write transaction: a change since
    /// its last transaction means another connection committed in between.
    pub(super) fn note_writer(&mut self, writer: &Connection, now: Instant) {
        let Ok(version) = data_version(writer) else {
            return;
        };
        if self
            .writer_version
            .replace(version)
            .is_some_and(|last| last != version)
        {
            self.stand_aside(now);
        }
    }

    fn stand_aside(&mut self, now: Instant) {
        self.unpin_for_write();
        self.quiet_until = Some(now + QUIET);
    }

    /// Begins a read transaction and reads `data_version`, which takes the read lock.
    fn pin_at(&mut self, now: Instant) {
        let pinned = self
            .conn
            .prepare_cached("BEGIN")
            .and_then(|mut begin| begin.execute([]))
            .and_then(|_| data_version(&self.conn));
        match pinned {
            Ok(version) if self.released.take().is_some_and(|seen| seen != version) => {
                self.stand_aside(now);
            }
            Ok(version) => self.pin = Some(Pin { at: now, version }),
            // Reads go on without the saving; try again after a while rather than at every read.
            Err(_) => self.stand_aside(now),
        }
    }
}

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |row| row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &std::path::Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;
             CREATE TABLE IF NOT EXISTS t (v INTEGER)",
        )
        .unwrap();
        conn
    }

    fn checkpoint(conn: &Connection) -> (i64, i64) {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(1)?, r.get(2)?))
        })
        .unwrap()
    }

    /// Another connection's commits make a renewal stand aside for [`QUIET`], during which the
    /// other writer's checkpoint copies every frame back; without commits the pin is renewed.
    #[test]
    fn a_renewal_that_sees_a_foreign_commit_stands_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.db");
        let other = open(&path);
        let mut keeper = Keeper::new(Connection::open(&path).unwrap());
        let t0 = Instant::now();

        keeper.refresh(t0);
        assert!(keeper.pin.is_some());
        keeper.refresh(t0 + PIN_LIFE * 2);
        assert!(keeper.pin.is_some(), "no commit: the pin is renewed");

        other.execute("INSERT INTO t VALUES (1)", []).unwrap();
        let (log, copied) = checkpoint(&other);
        assert!(
            copied < log,
            "the pin holds back the frame committed after it"
        );

        let renewal = t0 + PIN_LIFE * 4;
        keeper.refresh(renewal);
        assert!(
            keeper.pin.is_none(),
            "a foreign commit: the keeper stands aside"
        );
        keeper.refresh(renewal + QUIET / 2);
        assert!(keeper.pin.is_none(), "still quiet");
        other.execute("INSERT INTO t VALUES (2)", []).unwrap();
        let (log, copied) = checkpoint(&other);
        assert_eq!(copied, log, "nothing held back while the keeper is quiet");

        keeper.refresh(renewal + QUIET);
        assert!(keeper.pin.is_some(), "pins again once quiet");
    }

    /// A writer that sees another connection's commit (its `data_version` moved) makes the
    /// keeper stand aside; its own commits do not.
    #[test]
    fn the_writer_reports_foreign_commits_and_not_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let writer = open(&path);
        let other = open(&path);
        let mut keeper = Keeper::new(Connection::open(&path).unwrap());
        let t0 = Instant::now();
        let write = |conn: &Connection, keeper: &mut Keeper| {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            keeper.note_writer(conn, t0);
            conn.execute_batch("INSERT INTO t VALUES (1); COMMIT")
                .unwrap();
        };

        for _ in 0..3 {
            keeper.refresh(t0);
            assert!(keeper.pin.is_some());
            keeper.unpin_for_write();
            write(&writer, &mut keeper);
        }
        keeper.refresh(t0);
        assert!(
            keeper.pin.is_some(),
            "the writer's own commits are not foreign"
        );

        other.execute("INSERT INTO t VALUES (2)", []).unwrap();
        keeper.unpin_for_write();
        write(&writer, &mut keeper);
        keeper.refresh(t0 + QUIET / 2);
        assert!(
            keeper.pin.is_none(),
            "a foreign commit seen by the writer: quiet"
        );
    }

    /// A pin the sweeper ended remembers what it saw: the next pin stands aside if another
    /// connection committed meanwhile, and not if this store did (its leader forgets the pin).
    #[test]
    fn a_pin_after_an_idle_release_checks_for_foreign_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let other = open(&path);
        let mut keeper = Keeper::new(Connection::open(&path).unwrap());
        let t0 = Instant::now();

        keeper.refresh(t0);
        keeper.release();
        other.execute("INSERT INTO t VALUES (1)", []).unwrap();
        keeper.unpin_for_write();
        keeper.refresh(t0);
        assert!(
            keeper.pin.is_some(),
            "a write of this store in between: no comparison"
        );

        keeper.release();
        other.execute("INSERT INTO t VALUES (2)", []).unwrap();
        keeper.refresh(t0);
        assert!(
            keeper.pin.is_none(),
            "a foreign commit since the release: quiet"
        );
    }
}
