//! Group commit: writes queue up, and the caller that finds no commit under way leads: it
//! applies everything queued in one transaction, commits once and answers the batch (on its own
//! thread when alone, on a blocking thread when others are queued). A leadership is handed on,
//! never lost, even when a caller's future is dropped.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::claim::{Op, Reply, apply};
use super::driver::{BACKEND, closed, sql_error, unexpected};
use super::keeper::{Keeper, KeeperCell};
use super::options::SqliteOptions;
use super::syncer::{Committed, Syncer};
use idem_core::store::Fenced;
use idem_core::store::Watchers;
use idem_core::store::read_first::ReadFirst;
use idem_core::store::replay_cache::ReplayCache;
use idem_core::{StoreError, StoreErrorKind};

/// Most operations one transaction takes.
pub(super) const MAX_BATCH: usize = 512;

pub(super) struct Shared {
    pub(super) options: SqliteOptions,
    pub(super) queue: Mutex<Queue>,
    /// Wakes a lingering leader when a write is queued.
    pub(super) queued: Condvar,
    /// The write connection; only the current leader locks it.
    pub(super) writer: Mutex<Connection>,
    pub(super) readers: Mutex<Vec<Connection>>,
    /// Holds a read transaction for the readers; the leader unpins it while it writes.
    pub(super) keeper: KeeperCell,
    pub(super) replays: ReplayCache,
    /// Whether a claim reads a snapshot before it queues, as the claims lately were answered.
    pub(super) read_first: ReadFirst,
    /// Callers of this store waiting for a key to settle: woken by its completions and releases.
    pub(super) watchers: Watchers,
    /// Makes commits durable before they are answered or read.
    pub(super) syncer: Syncer,
}

/// Writes waiting for the next commit, and whether a leader is at work.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) jobs: Vec<Job>,
    pub(super) leading: bool,
    /// A leader is waiting on `queued` for more writes.
    pub(super) lingering: bool,
}

pub(super) struct Job {
    pub(super) op: Op,
    pub(super) reply: oneshot::Sender<Answer>,
}

/// What a queued caller hears: its answer, or that it leads the next batch.
pub(super) enum Answer {
    Done(Result<Reply, StoreError>),
    Lead(LeadToken),
}

/// The leadership of the next batch, with the receiver's own operation. If it is dropped
/// unused (the caller's future was dropped after it was sent), it passes itself on: the
/// leadership is never lost.
pub(super) struct LeadToken {
    pub(super) shared: Arc<Shared>,
    pub(super) op: Option<Op>,
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

impl Shared {
    /// Queues a write and waits for the commit that carries it, leading that commit if no one
    /// else is.
    /// [`SqliteStore::write`] for the operations that answer whether a fenced write applied.
    pub(super) async fn write_fenced(self: &Arc<Self>, op: Op) -> Result<Fenced, StoreError> {
        match self.write(op).await? {
            Reply::Fenced(f) => Ok(f),
            _ => Err(unexpected()),
        }
    }

    /// [`Self::write`] of a batch's operations in one job: one reply per operation.
    pub(super) async fn write_batch(
        self: &Arc<Self>,
        ops: Vec<Op>,
    ) -> Result<Vec<Reply>, StoreError> {
        let count = ops.len();
        match self.write(Op::Batch(ops)).await? {
            Reply::Batch(replies) if replies.len() == count => Ok(replies),
            _ => Err(unexpected()),
        }
    }

    /// [`Self::write_batch`] of fenced writes: whether each applied.
    pub(super) async fn write_fenced_batch(
        self: &Arc<Self>,
        ops: Vec<Op>,
    ) -> Result<Vec<Fenced>, StoreError> {
        let replies = self.write_batch(ops).await?;
        replies
            .into_iter()
            .map(|reply| match reply {
                Reply::Fenced(fenced) => Ok(fenced),
                _ => Err(unexpected()),
            })
            .collect()
    }

    pub(super) async fn write(self: &Arc<Self>, op: Op) -> Result<Reply, StoreError> {
        self.syncer.check()?;
        let mut op = op;
        let mut front = false;
        loop {
            let (reply, answer) = oneshot::channel();
            let (lead, wake) = {
                let mut queue = self.queue.lock().map_err(|_| closed())?;
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
                self.queued.notify_one();
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
    pub(super) fn lead(self: &Arc<Self>) {
        let contended = self.queue.lock().map(|q| q.jobs.len() > 1).unwrap_or(false);
        if contended && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = Arc::clone(self);
            runtime.spawn_blocking(move || lead_rounds(&shared, usize::MAX, LINGER));
            return;
        }
        lead_rounds(self, 1, Duration::ZERO);
    }
}

/// How long a leader on a blocking thread waits for more writes before it stops leading: the
/// callers it just answered usually send their next write within this time.
pub(super) const LINGER: Duration = Duration::from_micros(500);

/// Commits up to `rounds` batches, then hands the leadership on. When the queue is empty it
/// waits up to `linger` for more, then ends the leadership.
pub(super) fn lead_rounds(shared: &Arc<Shared>, rounds: usize, linger: Duration) {
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
            Ok(mut conn) => {
                // Unpinned until after the commit, so that its checkpoint copies back every
                // frame and a later writer can restart the WAL (see `keeper`).
                let mut keeper = shared.keeper.for_write();
                if let Some(committed) = run_batch(&mut conn, &mut keeper, &shared.syncer, batch) {
                    drop(keeper);
                    // A caller leading on its own thread with no one queued behind it syncs
                    // there; otherwise the syncer thread does, and this leader goes on.
                    let lone =
                        rounds == 1 && shared.queue.lock().is_ok_and(|queue| queue.jobs.is_empty());
                    shared.syncer.after_commit(committed, lone);
                }
            }
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
pub(super) fn hand_over(shared: &Arc<Shared>) {
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
pub(super) struct LeaderGuard<'a>(&'a Arc<Shared>);

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        hand_over(self.0);
    }
}

/// The write transaction of one batch. `BEGIN IMMEDIATE` and `COMMIT` come from the
/// connection's statement cache (rusqlite's `Transaction` parses them again at every batch: 6 %
/// of a lone fresh call's instructions); dropped while the transaction is still open (not
/// committed, or its commit failed), it rolls back.
struct WriteTransaction<'c> {
    conn: &'c Connection,
}

impl<'c> WriteTransaction<'c> {
    /// Takes the write lock.
    fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(WriteTransaction { conn })
    }

    fn commit(self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([]).map(drop)
    }
}

impl std::ops::Deref for WriteTransaction<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for WriteTransaction<'_> {
    fn drop(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// Applies a batch in one transaction and commits it. The answers wait for the commit's sync
/// (`None`: the transaction could not begin, and the batch is answered with that error).
pub(super) fn run_batch(
    conn: &mut Connection,
    keeper: &mut Keeper,
    syncer: &Syncer,
    batch: Vec<Job>,
) -> Option<Committed> {
    let tx = match WriteTransaction::begin(conn) {
        Ok(tx) => {
            keeper.note_writer(&tx, Instant::now());
            tx
        }
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
            return None;
        }
    };
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        let answer = apply(&tx, job.op);
        answers.push((job.reply, answer));
    }
    let number = syncer.before_commit();
    // A failed commit: nothing of this batch is durable, so no answer may say it is.
    let failed_commit = tx.commit().err().map(|e| {
        let message = format!("commit failed ({e})");
        (sql_error("", e).kind(), message)
    });
    let answer = Box::new(move |failed_sync: Option<&str>| {
        // A failed sync: what the commit holds may not survive.
        let failure = failed_commit
            .or_else(|| failed_sync.map(|reason| (StoreErrorKind::Unavailable, reason.to_owned())));
        for (reply, answer) in answers {
            let answer = match &failure {
                Some((kind, message)) => Err(StoreError::new(BACKEND, *kind, message.clone())),
                None => answer,
            };
            let _ = reply.send(Answer::Done(answer));
        }
    });
    // Even a failed commit took a number: its (empty) sync lets the readers waiting on it go.
    Some(Committed { number, answer })
}

#[cfg(test)]
mod tests {
    use super::super::tests::request;
    use super::*;
    use crate::SqliteStore;
    use idem_core::store::{Claim, Store};

    /// Callers that give up while queued (their futures dropped, as an agent loop cancelling a
    /// tool call does) never strand the leadership: everyone else is answered, and later writes
    /// still commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_callers_never_strand_the_group_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open_path(dir.path().join("drop.db")).unwrap());
        let claim = |store: Arc<SqliteStore>, n: u32| async move { store.claim(request(n)).await };
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
}
