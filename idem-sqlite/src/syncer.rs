//! Syncs apart from commits: with `synchronous=full` the writer commits with SQLite's
//! `synchronous=NORMAL` (no `fsync` inside `COMMIT`), and the syncer makes each commit durable
//! with an `fdatasync` of the WAL before anyone hears of it.
//!
//! | who | what it waits for |
//! |---|---|
//! | a lone writer (nothing queued, no sync under way) | its own `fdatasync`, on its own thread, as `synchronous=FULL` would |
//! | a batch of the group commit | the syncer thread's next `fdatasync` (one covers every commit made before it starts); meanwhile the leader applies and commits the next batch |
//! | a read that answers (a claim read first, a lookup, a stream page, a scan) | the sync of every commit this store made before the read: nothing is answered from a commit a power loss could take back |
//!
//! Under many callers the leader no longer waits in `fsync` between batches: measured with the
//! `costs` bench (64 callers, fresh calls), see the benchmarks guide.
//!
//! Why this is as durable as `synchronous=FULL`: in WAL mode `NORMAL` already syncs the WAL
//! before every checkpoint, the database file after it, and the WAL's header when the WAL is
//! reused; what it leaves out is the sync of the frames at each commit, which this module adds
//! (the same file, opened by its path at every sync, so that a WAL that vanished is an error,
//! not a sync of something else), and the sync of the directory once, for a WAL file this
//! process may have created. If a sync fails, the commits it covered may be lost: every waiting
//! caller gets an error, and the store refuses every later write and read (`Unavailable`)
//! rather than answer from state that may not survive, as PostgreSQL stops on a failed `fsync`.
//!
//! Another process sharing the file reads this store's commits as soon as they are made, before
//! their sync (SQLite has no way to hold them back): a power loss in that window can take back a
//! replay that process already gave. The effect still happened once; the record is in flight
//! again and is reconciled as any orphan.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::driver::BACKEND;
use idem_core::{StoreError, StoreErrorKind};

/// How long the syncer thread waits for more commits before it ends (the next commit starts
/// another). Longer in tests, so that a slow machine cannot end a thread a test watches.
const IDLE: Duration = Duration::from_millis(if cfg!(test) { 5_000 } else { 100 });

/// One committed batch, to answer once the commit is durable.
pub(super) struct Committed {
    /// The commit's number ([`Syncer::before_commit`]).
    pub(super) number: u64,
    pub(super) answer: SendAnswers,
}

/// Sends a batch's answers: as applied (`None`), or every one failed for the reason given.
pub(super) type SendAnswers = Box<dyn FnOnce(Option<&str>) + Send>;

/// How far this store's commits are durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Durable {
    /// Every commit up to this number is synced.
    Upto(u64),
    /// A sync failed: what it covered may be lost, and the store answers nothing more.
    Failed,
}

/// The syncer of one store.
pub(super) struct Syncer {
    inner: Arc<Inner>,
}

struct Inner {
    /// The WAL file, synced by its path; `None` when commits are not synced (`synchronous=normal`).
    wal: Option<PathBuf>,
    /// Numbers commits: taken just before each `COMMIT`.
    committed: AtomicU64,
    durable: watch::Sender<Durable>,
    queue: Mutex<SyncQueue>,
    /// Wakes the syncer thread when a commit is queued or a lone writer's sync ends.
    queued: Condvar,
    /// The WAL's directory was synced once (the first sync), for a WAL this process created.
    directory_synced: AtomicBool,
    /// Set by a test to keep syncs from ending, with the condition its release signals.
    #[cfg(test)]
    held: (Mutex<bool>, Condvar),
}

#[derive(Default)]
struct SyncQueue {
    waiting: Vec<Committed>,
    /// The syncer thread runs.
    running: bool,
    /// A sync is under way (the thread's or a lone writer's).
    syncing: bool,
}

impl Syncer {
    /// A syncer for the database at `path`; `sync` says whether commits are synced.
    pub(super) fn new(path: &Path, sync: bool) -> Self {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        Syncer {
            inner: Arc::new(Inner {
                wal: sync.then(|| PathBuf::from(wal)),
                committed: AtomicU64::new(0),
                durable: watch::Sender::new(Durable::Upto(0)),
                queue: Mutex::new(SyncQueue::default()),
                queued: Condvar::new(),
                directory_synced: AtomicBool::new(false),
                #[cfg(test)]
                held: (Mutex::new(false), Condvar::new()),
            }),
        }
    }

    /// Whether commits are synced here (else `COMMIT` answers as soon as SQLite does).
    pub(super) fn syncs(&self) -> bool {
        self.inner.wal.is_some()
    }

    /// Keeps every sync from ending while the guard lives (a test's window between a commit and
    /// its sync).
    #[cfg(test)]
    pub(super) fn hold(&self) -> Held<'_> {
        *self.inner.held.0.lock().unwrap() = true;
        Held(&self.inner)
    }

    /// Refuses a write once a sync has failed.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        match *self.inner.durable.borrow() {
            Durable::Failed => Err(sync_failed()),
            Durable::Upto(_) => Ok(()),
        }
    }

    /// The number of the commit about to be made. Taken before `COMMIT`, so that a reader whose
    /// snapshot holds the commit sees at least this number after its snapshot opened.
    pub(super) fn before_commit(&self) -> u64 {
        self.inner.committed.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The newest commit number: read by a reader after its snapshot opened.
    pub(super) fn committed(&self) -> u64 {
        self.inner.committed.load(Ordering::SeqCst)
    }

    /// Waits until every commit up to `number` is durable.
    pub(super) async fn durable(&self, number: u64) -> Result<(), StoreError> {
        if self.inner.wal.is_none() {
            return Ok(());
        }
        let reached = |durable: &Durable| match *durable {
            Durable::Upto(upto) => upto >= number,
            Durable::Failed => true,
        };
        if !reached(&self.inner.durable.borrow()) {
            let mut durable = self.inner.durable.subscribe();
            // The sender lives as long as `self`: `wait_for` cannot see it closed.
            let _ = durable.wait_for(reached).await;
        }
        self.check()
    }

    /// Answers a committed batch once it is durable. `lone` (a writer on its caller's thread,
    /// nothing queued behind it) syncs here when no sync is under way, as `synchronous=FULL`
    /// would inside `COMMIT`; otherwise the syncer thread takes it with whatever else commits
    /// during its sync.
    pub(super) fn after_commit(&self, committed: Committed, lone: bool) {
        let inner = &self.inner;
        if inner.wal.is_none() {
            (committed.answer)(None);
            return;
        }
        let mut queue = inner.lock();
        if lone && !queue.syncing && queue.waiting.is_empty() {
            inner.sync_and_answer(queue, vec![committed]);
            return;
        }
        queue.waiting.push(committed);
        if queue.running {
            inner.queued.notify_one();
            return;
        }
        let thread = Arc::clone(inner);
        let spawned = std::thread::Builder::new()
            .name("idem-sqlite-sync".into())
            .spawn(move || thread.run());
        match spawned {
            Ok(_) => queue.running = true,
            Err(e) => {
                // No thread to sync on: what waits is answered with the error, and the store
                // stops (what was committed is not known durable).
                let waiting = std::mem::take(&mut queue.waiting);
                drop(queue);
                inner.finish(
                    waiting,
                    Err(format!("starting the sync thread failed ({e})")),
                );
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, SyncQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The syncer thread: syncs whatever was committed, answers it, and again, until nothing
    /// comes for [`IDLE`].
    fn run(&self) {
        let mut queue = self.lock();
        loop {
            if queue.waiting.is_empty() {
                // Woken early (a lone writer's sync ended), it waits on for the rest of IDLE.
                let (next, idle) = self
                    .queued
                    .wait_timeout_while(queue, IDLE, |queue| queue.waiting.is_empty())
                    .unwrap_or_else(PoisonError::into_inner);
                queue = next;
                if idle.timed_out() {
                    queue.running = false;
                    return;
                }
            }
            if queue.syncing {
                // A lone writer syncs: wait for it (it notifies) rather than sync beside it.
                (queue, _) = self
                    .queued
                    .wait_timeout(queue, IDLE)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            let batch = std::mem::take(&mut queue.waiting);
            self.sync_and_answer(queue, batch);
            queue = self.lock();
        }
    }

    /// Syncs, without the queue's lock, and answers `batches` (a lone writer's, or those the
    /// thread took). `syncing` keeps any other sync from starting meanwhile.
    fn sync_and_answer(&self, mut queue: MutexGuard<'_, SyncQueue>, batches: Vec<Committed>) {
        queue.syncing = true;
        drop(queue);
        let synced = self.sync();
        self.lock().syncing = false;
        // The syncer thread may be waiting for a lone writer's sync to end.
        self.queued.notify_one();
        self.finish(batches, synced);
    }

    /// `fdatasync` of the WAL (and, the first time, of its directory). Every commit made before
    /// it starts is durable when it returns.
    fn sync(&self) -> Result<(), String> {
        let Some(wal) = &self.wal else {
            return Ok(());
        };
        #[cfg(test)]
        {
            let (held, released) = &self.held;
            let held = held.lock().unwrap();
            drop(released.wait_while(held, |held| *held).unwrap());
        }
        let failed = |what: &str, e: std::io::Error| {
            format!("{what} failed ({e}): the last commits may not survive a power loss")
        };
        std::fs::File::open(wal)
            .and_then(|file| file.sync_data())
            .map_err(|e| failed("syncing the WAL", e))?;
        if !self.directory_synced.load(Ordering::Relaxed) {
            let parent = wal.parent().filter(|p| !p.as_os_str().is_empty());
            std::fs::File::open(parent.unwrap_or(Path::new(".")))
                .and_then(|dir| dir.sync_all())
                .map_err(|e| failed("syncing the WAL's directory", e))?;
            self.directory_synced.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Answers synced batches, or fails them and the store.
    fn finish(&self, batches: Vec<Committed>, synced: Result<(), String>) {
        // After a failed sync, a later one that succeeds proves nothing of what came before it
        // (the kernel may have dropped those pages), and these commits may build on them.
        let synced = synced.and_then(|()| match *self.durable.borrow() {
            Durable::Failed => Err(SYNC_FAILED.to_owned()),
            Durable::Upto(_) => Ok(()),
        });
        match synced {
            Ok(()) => {
                let newest = batches.iter().map(|b| b.number).max().unwrap_or(0);
                self.durable.send_if_modified(|durable| match durable {
                    Durable::Upto(upto) if *upto < newest => {
                        *upto = newest;
                        true
                    }
                    _ => false,
                });
                for batch in batches {
                    (batch.answer)(None);
                }
            }
            Err(reason) => {
                self.durable.send_replace(Durable::Failed);
                for batch in batches {
                    (batch.answer)(Some(&reason));
                }
            }
        }
    }
}

/// Syncs end only after this is dropped ([`Syncer::hold`]).
#[cfg(test)]
pub(super) struct Held<'a>(&'a Inner);

#[cfg(test)]
impl Drop for Held<'_> {
    fn drop(&mut self) {
        let (held, released) = &self.0.held;
        *held.lock().unwrap() = false;
        released.notify_all();
    }
}

/// The error of every operation after a failed sync.
fn sync_failed() -> StoreError {
    StoreError::new(BACKEND, StoreErrorKind::Unavailable, SYNC_FAILED)
}

const SYNC_FAILED: &str = "a sync of the WAL failed earlier: commits since may not survive a \
                           power loss, so this store answers nothing more; open it again";

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    const A_WHILE: Duration = Duration::from_millis(50);

    /// A syncer for a database in a new directory, its WAL file created (as SQLite would).
    fn syncer(dir: &tempfile::TempDir) -> Syncer {
        let path = dir.path().join("s.db");
        std::fs::write(dir.path().join("s.db-wal"), b"frames").unwrap();
        Syncer::new(&path, true)
    }

    /// A batch whose answer is the number it was sent with, or the reason it failed.
    fn committed(number: u64) -> (Committed, oneshot::Receiver<Result<u64, String>>) {
        let (reply, received) = oneshot::channel();
        let answer = Box::new(move |failed: Option<&str>| {
            let _ = reply.send(failed.map_or(Ok(number), |reason| Err(reason.to_owned())));
        });
        (Committed { number, answer }, received)
    }

    /// A read that may see a commit waits until the commit is synced, and so does the batch's
    /// answer; commits made before the read's snapshot and already synced make no one wait.
    #[tokio::test]
    async fn reads_and_answers_wait_for_the_sync_of_what_they_may_see() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = syncer(&dir);
        assert!(
            syncer.durable(syncer.committed()).await.is_ok(),
            "nothing yet"
        );

        let number = syncer.before_commit();
        let seen = syncer.committed();
        assert_eq!(seen, number);
        let read = syncer.durable(seen);
        tokio::pin!(read);
        assert!(
            tokio::time::timeout(A_WHILE, &mut read).await.is_err(),
            "a read of a commit not yet synced waits"
        );

        let (batch, answer) = committed(number);
        syncer.after_commit(batch, false);
        assert_eq!(answer.await.unwrap(), Ok(1));
        read.await.expect("synced: the read goes on");
        assert!(syncer.durable(number).await.is_ok());
    }

    /// Commits made while the syncer thread syncs are answered by its next sync, and every
    /// number up to the newest synced counts as durable.
    #[tokio::test]
    async fn one_sync_answers_every_commit_made_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = syncer(&dir);
        let mut answers = Vec::new();
        for _ in 0..20 {
            let (batch, answer) = committed(syncer.before_commit());
            syncer.after_commit(batch, false);
            answers.push(answer);
        }
        for answer in answers {
            assert!(answer.await.unwrap().is_ok());
        }
        assert!(syncer.durable(20).await.is_ok());
    }

    /// A lone writer syncs on its own thread: its answer is there when `after_commit` returns.
    #[test]
    fn a_lone_writer_syncs_on_its_own_thread() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = syncer(&dir);
        let (batch, mut answer) = committed(syncer.before_commit());
        syncer.after_commit(batch, true);
        assert!(
            answer
                .try_recv()
                .expect("answered before returning")
                .is_ok()
        );
        assert!(!syncer.inner.lock().running, "no thread started");
    }

    /// A lone writer's sync beside the syncer thread's wakes the thread (which may wait for it)
    /// and leaves it running: the next batch is synced by the same thread.
    #[tokio::test]
    async fn a_lone_writers_sync_leaves_the_thread_running() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = syncer(&dir);
        let (batch, answer) = committed(syncer.before_commit());
        syncer.after_commit(batch, false);
        assert!(answer.await.unwrap().is_ok());
        let (batch, answer) = committed(syncer.before_commit());
        syncer.after_commit(batch, true);
        assert!(answer.await.unwrap().is_ok());
        tokio::time::sleep(A_WHILE).await;
        assert!(syncer.inner.lock().running, "the thread waits on for IDLE");
    }

    /// A sync that fails (here the WAL vanished) fails the batches it covered, the reads
    /// waiting on them, and every later write and read: what was committed may not survive.
    #[tokio::test]
    async fn a_failed_sync_fails_what_waits_and_everything_after() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = syncer(&dir);
        std::fs::remove_file(dir.path().join("s.db-wal")).unwrap();
        let number = syncer.before_commit();
        let read = syncer.durable(number);
        let (batch, answer) = committed(number);
        syncer.after_commit(batch, false);

        let reason = answer.await.unwrap().expect_err("not durable: an error");
        assert!(reason.contains("syncing the WAL failed"), "{reason}");
        assert_eq!(read.await.unwrap_err().kind(), StoreErrorKind::Unavailable);
        let later = syncer.check().unwrap_err();
        assert!(later.to_string().contains("open it again"), "{later}");
        assert!(syncer.durable(0).await.is_err(), "reads are refused too");

        // A commit already under way when the sync failed: its own sync succeeds, and proves
        // nothing of the commits before it.
        std::fs::write(dir.path().join("s.db-wal"), b"frames").unwrap();
        let (batch, answer) = committed(syncer.before_commit());
        syncer.after_commit(batch, false);
        let reason = answer
            .await
            .unwrap()
            .expect_err("after a failed sync, no commit is answered as durable");
        assert!(reason.contains("open it again"), "{reason}");
    }

    /// With `synchronous=normal` nothing is synced and nothing waits.
    #[tokio::test]
    async fn without_syncing_answers_and_reads_go_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::new(&dir.path().join("n.db"), false);
        let number = syncer.before_commit();
        assert!(syncer.durable(number).await.is_ok());
        let (batch, mut answer) = committed(number);
        syncer.after_commit(batch, false);
        assert!(answer.try_recv().unwrap().is_ok());
    }
}
