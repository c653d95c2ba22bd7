//! Transactional tools (`#[idempotent(…, transactional)]`): the claim, the tool's own writes and
//! the completed record commit in one transaction on one pooled connection, Stripe's "atomic
//! phase". A crash or an error anywhere leaves all of it or none of it. idem's runtime
//! (`idem-runtime`, feature `postgres`) runs them through [`PostgresStore::transact`].
//!
//! | step | on this connection | when it fails |
//! |---|---|---|
//! | begin | `BEGIN` | nothing happened ([`StoreError`]) |
//! | claim | `SET LOCAL lock_timeout` = the tool's wait, and the store's claim statements, in the same round trip: a new key inserts an uncommitted `in_flight` row that no other session sees; a concurrent claim of the key waits on that row until this transaction ends, at most the wait | past the wait: [`Claim::InFlight`]; else the claim's answer, and the transaction is rolled back |
//! | body | the tool's statements on the same transaction, under a savepoint when its errors may be stored | the body's own error: [`Settlement`] decides |
//! | settle and commit | the fenced completion of the record and `COMMIT`, in one round trip (a completion that fails aborts the transaction, so the `COMMIT` rolls back); or a rollback | [`Transacted::NotCommitted`]: nothing was kept, or, if the commit's answer was lost, all or nothing was kept; a retry replays or runs |
//!
//! A replay found in the replay cache answers before any of this. The record of a transactional
//! tool is never seen `in_flight` by another session, so it has no lease to renew, no orphan
//! and no `unknown` state.

use std::time::Duration;

use deadpool_postgres::StatementCache;
use tokio_postgres::Transaction;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::claim::{Statement, decode_claim};
use super::driver::{corrupt, db_millis, db_time, orphans_code, pg_error, pool_error};
use super::store::PostgresStore;
use idem_core::StoreError;
use idem_core::store::{Claim, ClaimRequest, FencingToken, RecordStatus, after, blob};

/// What the body's result makes of the transaction.
#[derive(Debug)]
pub enum Settlement {
    /// Keep the body's writes and record `status` with these bytes.
    Keep(RecordStatus, Vec<u8>),
    /// Roll the body's writes back (to the savepoint) and record `status` with these bytes:
    /// a stored error.
    RecordWithoutWrites(RecordStatus, Vec<u8>),
    /// Roll everything back, the claim too: the key is free again.
    RollBack,
}

/// How a transactional call ended.
#[derive(Debug)]
pub enum Transacted<R> {
    /// The claim answered without running the body: a replay, a mismatch, in flight (another
    /// transaction holds the key past the wait) or unknown (a record left by a non-transactional
    /// version of the tool).
    Answered(Claim),
    /// The body ran and its settlement committed (or, for [`Settlement::RollBack`], was rolled
    /// back, which is all it asked).
    Settled(R),
    /// The body ran, but its transaction did not commit: the record or the commit failed, or
    /// the commit's answer was lost. Nothing of it is kept, or (answer lost) all of it is.
    NotCommitted(R, StoreError),
}

impl PostgresStore {
    /// Runs `body` as a transactional tool's call of `req`'s key: claim, body, settlement and
    /// commit in one transaction (see the module docs). `wait` bounds how long a concurrent
    /// claim of the key waits for this one; `savepoint` puts the body under a savepoint, so that
    /// its writes can be rolled back alone ([`Settlement::RecordWithoutWrites`]); `settle` says
    /// what the body's answer makes of the transaction. Without a request (the caller omitted an
    /// optional key) the body runs in a transaction of its own, and nothing is recorded.
    pub async fn transact<X, R, B, S>(
        &self,
        req: Option<ClaimRequest<'_>>,
        wait: Duration,
        savepoint: bool,
        body: B,
        settle: S,
    ) -> Result<Transacted<R>, StoreError>
    where
        B: for<'a, 't> AsyncFnOnce(&'a mut Transaction<'t>) -> X,
        S: FnOnce(X) -> (Settlement, R),
    {
        const OP: &str = "transactional call";
        let replays = &self.inner.replays;
        if let Some(req) = &req
            && let Some(answer) = replays.get(req)
        {
            return Ok(Transacted::Answered(answer));
        }
        let mut client = self.inner.pool.get().await.map_err(|e| pool_error(OP, e))?;
        let mut discard = false;
        let ended = self
            .transact_on(
                &mut client,
                &mut discard,
                req,
                wait,
                savepoint,
                body,
                settle,
            )
            .await;
        if discard {
            // A statement went unanswered: the connection may answer it late, or never.
            drop(deadpool_postgres::Object::take(client));
        }
        ended
    }

    /// [`PostgresStore::transact`] on one connection; sets `discard` when a statement of idem's
    /// went unanswered.
    #[allow(clippy::too_many_arguments)]
    async fn transact_on<X, R, B, S>(
        &self,
        client: &mut deadpool_postgres::Object,
        discard: &mut bool,
        req: Option<ClaimRequest<'_>>,
        wait: Duration,
        savepoint: bool,
        body: B,
        settle: S,
    ) -> Result<Transacted<R>, StoreError>
    where
        B: for<'a, 't> AsyncFnOnce(&'a mut Transaction<'t>) -> X,
        S: FnOnce(X) -> (Settlement, R),
    {
        let cache = client.statement_cache.clone();
        let pg: &mut tokio_postgres::Client = client;
        let mut tx = self.timed("begin", discard, pg.transaction()).await?;
        let token = FencingToken::generate();
        if let Some(req) = &req {
            let claim = match self.claim_in(&tx, &cache, discard, req, wait, token).await {
                Ok(claim) => claim,
                Err(e) if lock_timed_out(&e) => Claim::InFlight {
                    lease_expires_at: after(req.now, wait),
                },
                Err(e) => return Err(e),
            };
            if !matches!(claim, Claim::Acquired { .. }) {
                // Nothing to keep: the transaction rolls back as it drops.
                return Ok(Transacted::Answered(claim));
            }
        }

        let (settlement, answer) = if savepoint {
            let mut inner = self
                .timed("savepoint", discard, tx.savepoint("idem_body"))
                .await?;
            let (settlement, answer) = settle(body(&mut inner).await);
            let closed = match settlement {
                Settlement::Keep(..) => self.timed("savepoint", discard, inner.commit()).await,
                Settlement::RecordWithoutWrites(..) | Settlement::RollBack => {
                    self.timed("savepoint", discard, inner.rollback()).await
                }
            };
            if let Err(e) = closed {
                return Ok(Transacted::NotCommitted(answer, e));
            }
            (settlement, answer)
        } else {
            settle(body(&mut tx).await)
        };

        let (status, bytes) = match settlement {
            Settlement::Keep(status, bytes) | Settlement::RecordWithoutWrites(status, bytes) => {
                (status, bytes)
            }
            Settlement::RollBack => {
                // A failed rollback commits nothing either: the transaction ends with its
                // connection.
                let _ = self.timed("rollback", discard, tx.rollback()).await;
                return Ok(Transacted::Settled(answer));
            }
        };
        let Some(req) = req else {
            // Unprotected: the body's writes, and no record.
            return match self.timed("commit", discard, tx.commit()).await {
                Ok(()) => Ok(Transacted::Settled(answer)),
                Err(e) => Ok(Transacted::NotCommitted(answer, e)),
            };
        };
        let expires_at = db_time(after(req.now, req.ttl));
        let key = &req.key.as_bytes()[..];
        let token_param = token.get() as i64;
        let status_text = status.as_str();
        let blob = blob::stored_apart(status, &bytes, self.inner.blob_threshold);
        let hash = blob.as_ref().map(|h| &h.as_bytes()[..]);
        let params: [&(dyn ToSql + Sync); 7] = [
            &req.tenant,
            &key,
            &token_param,
            &bytes,
            &expires_at,
            &status_text,
            &hash,
        ];
        let (statement, params) = match hash {
            Some(_) => (&self.inner.sql.complete_blob[2], &params[..]),
            None => (&self.inner.sql.complete_or_abort, &params[..6]),
        };
        let complete = match self.ready(&tx, &cache, discard, statement).await {
            Ok(ready) => ready,
            Err(e) => return Ok(Transacted::NotCommitted(answer, e)),
        };
        // The completion and the `COMMIT` go together, in one round trip: a completion that
        // fails (its row gone, which the statement turns into an error) aborts the
        // transaction, and the server answers the `COMMIT` with a rollback.
        let finished = tokio::time::timeout(self.inner.response_timeout, async {
            tokio::join!(send(&tx, &complete, params), tx.batch_execute("COMMIT"))
        })
        .await;
        let committed = match finished {
            Err(_) => {
                *discard = true;
                return Ok(Transacted::NotCommitted(answer, self.unanswered("commit")));
            }
            Ok((Err(e), _)) if e.code() == Some(&SqlState::DIVISION_BY_ZERO) => Err(corrupt(
                "complete",
                "the claim's own row vanished inside its transaction",
            )),
            Ok((Err(e), _)) => Err(pg_error("complete", e)),
            Ok((Ok(_), Err(e))) => Err(pg_error("commit", e)),
            Ok((Ok(_), Ok(()))) => Ok(()),
        };
        // The transaction ended on the server with the `COMMIT` sent above (committed, or
        // rolled back if it had failed): dropping the handle would send a `ROLLBACK` outside
        // any transaction, which the server logs as a warning. It owns no memory.
        std::mem::forget(tx);
        if let Err(e) = committed {
            return Ok(Transacted::NotCommitted(answer, e));
        }
        if status == RecordStatus::Completed {
            self.inner
                .replays
                .put(&req, &bytes, expires_at.max(0) as u64);
        }
        Ok(Transacted::Settled(answer))
    }

    /// The store's claim, inside the transaction: the plain statement first, the function for
    /// the rest, as [`Store::claim`](idem_core::store::Store::claim) does. The transaction's
    /// `lock_timeout` (the wait) goes in the same round trip as the first statement.
    async fn claim_in(
        &self,
        tx: &Transaction<'_>,
        cache: &StatementCache,
        discard: &mut bool,
        req: &ClaimRequest<'_>,
        wait: Duration,
        token: FencingToken,
    ) -> Result<Claim, StoreError> {
        const OP: &str = "claim";
        let key = &req.key.as_bytes()[..];
        let fingerprint = &req.fingerprint.as_bytes()[..];
        let params: [&(dyn ToSql + Sync); 9] = [
            &req.tenant,
            &key,
            &req.tool,
            &fingerprint,
            &(token.get() as i64),
            &db_time(req.now),
            &db_millis(req.lease),
            &db_millis(req.ttl),
            &orphans_code(req.orphans),
        ];
        let sql = &self.inner.sql;
        let replays = &self.inner.replays;
        let claim_fast = self.ready(tx, cache, discard, &sql.claim_fast).await?;
        // Whole milliseconds, at least one: `0` would turn the wait off.
        let set_wait = format!("SET LOCAL lock_timeout = {}", db_millis(wait).max(1));
        let (set, rows) = self
            .timed(OP, discard, async {
                let (set, rows) =
                    tokio::join!(tx.batch_execute(&set_wait), send(tx, &claim_fast, &params));
                Ok((set, rows))
            })
            .await?;
        set.map_err(|e| pg_error(OP, e))?;
        let rows = rows.map_err(|e| pg_error(OP, e))?;
        if let Some(row) = rows.first().filter(|row| row.get::<_, i16>(0) >= 0) {
            return decode_claim(row, token, *req, replays);
        }
        let claim = self.ready(tx, cache, discard, &sql.claim).await?;
        let rows = self.timed(OP, discard, send(tx, &claim, &params)).await?;
        let row = rows
            .first()
            .ok_or_else(|| corrupt(OP, "the claim answered no row"))?;
        decode_claim(row, token, *req, replays)
    }

    /// `statement`, ready to send: prepared once per connection (cached), or, through a
    /// transaction pooler, to be sent unnamed with its declared types.
    async fn ready<'s>(
        &self,
        tx: &Transaction<'_>,
        cache: &StatementCache,
        discard: &mut bool,
        statement: &'s Statement,
    ) -> Result<Ready<'s>, StoreError> {
        if self.inner.transaction_pooler {
            return Ok(Ready::Unnamed(statement));
        }
        let prepared = cache.prepare(tx.client(), &statement.sql);
        Ok(Ready::Prepared(
            self.timed("prepare", discard, prepared).await?,
        ))
    }

    /// `fut` within the response timeout; a timeout sets `discard`.
    async fn timed<T>(
        &self,
        op: &str,
        discard: &mut bool,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.response_timeout, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(pg_error(op, e)),
            Err(_) => {
                *discard = true;
                Err(self.unanswered(op))
            }
        }
    }
}

/// A statement ready to send (see [`PostgresStore::ready`]).
enum Ready<'s> {
    Prepared(tokio_postgres::Statement),
    Unnamed(&'s Statement),
}

/// Sends `statement` with `params`. The request leaves on the first poll, so statements
/// sent by futures joined in order reach the server in that order (one round trip for all).
async fn send(
    tx: &Transaction<'_>,
    statement: &Ready<'_>,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    match statement {
        Ready::Prepared(prepared) => tx.query(prepared, params).await,
        Ready::Unnamed(statement) => {
            let typed: Vec<(&(dyn ToSql + Sync), tokio_postgres::types::Type)> = params
                .iter()
                .copied()
                .zip(statement.types.iter().cloned())
                .collect();
            tx.query_typed(&statement.sql, &typed).await
        }
    }
}

/// Whether a claim gave up waiting for another transaction's uncommitted claim of the key.
fn lock_timed_out(e: &StoreError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
        .is_some_and(|pg| pg.code() == Some(&SqlState::LOCK_NOT_AVAILABLE))
}
