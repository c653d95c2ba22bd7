//! Transactional tools on sqlx (feature `sqlx`): the same transaction as
//! [`transact`](PostgresStore::transact), on a connection of the sqlx pool you hand the store
//! ([`PostgresStore::use_sqlx`]), for tools that take `&mut sqlx::PgConnection`. sqlx sends one
//! statement at a time, so the wait and the claim, and the completion and the `COMMIT`, are two
//! round trips each here instead of one.

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{PgConnection, PgPool, Postgres, Row as _};

use super::claim::{ClaimRow, Statement, decide_claim};
use super::driver::{BACKEND, corrupt, db_millis, db_time, orphans_code};
use super::store::PostgresStore;
use super::transaction::{Settlement, Transacted};
use idem_core::store::{Claim, ClaimRequest, FencingToken, RecordStatus, after, blob};
use idem_core::{StoreError, StoreErrorKind};

/// A sqlx future, boxed where it is made.
type BoxFuture<'f, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'f>>;

/// A statement with its arguments bound.
type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// Classifies a sqlx error; sqlx's own text stays in `source()`.
fn sqlx_error(op: &str, e: sqlx::Error) -> StoreError {
    let (kind, cause) = match &e {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("57014") => (StoreErrorKind::Timeout, "the statement timed out"),
            Some("55P03") => (StoreErrorKind::Timeout, "the wait for another call ran out"),
            Some("42P01" | "42883") => (
                StoreErrorKind::Schema,
                "idem's tables are missing (dropped?); reopen the store to recreate them",
            ),
            _ => (StoreErrorKind::Other, "the server reported an error"),
        },
        sqlx::Error::PoolTimedOut => (
            StoreErrorKind::Timeout,
            "no connection of the sqlx pool became available in time",
        ),
        sqlx::Error::PoolClosed => (StoreErrorKind::Closed, "the sqlx pool is closed"),
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::WorkerCrashed => {
            (StoreErrorKind::Unavailable, "cannot reach the server")
        }
        _ => (StoreErrorKind::Other, "sqlx reported an error"),
    };
    StoreError::with_source(BACKEND, kind, format!("{op}: {cause}"), e)
}

/// Whether a claim gave up waiting for another transaction's uncommitted claim of the key.
fn lock_timed_out(e: &StoreError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .and_then(|e| e.as_database_error())
        .is_some_and(|db| db.code().as_deref() == Some("55P03"))
}

impl PostgresStore {
    /// Hands the store a sqlx pool on the same database, for transactional tools that take
    /// `&mut sqlx::PgConnection`: their transactions run on its connections (your TLS, timeouts
    /// and sizes). idem's own statements keep using the store's pool. A second call replaces
    /// the pool.
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let store = idem_postgres::PostgresStore::open_url("postgres://app@db.internal/shop").await?;
    /// store.use_sqlx(pool);
    /// // On a runtime opened by URL: idem.store().postgres().expect("a Postgres store").use_sqlx(pool)
    /// # Ok(()) }
    /// ```
    pub fn use_sqlx(&self, pool: PgPool) {
        *self.inner.sqlx.write().unwrap_or_else(|e| e.into_inner()) = Some(pool);
    }

    /// [`PostgresStore::transact`] on a connection of the sqlx pool.
    pub async fn transact_sqlx<X, R, B, S>(
        &self,
        req: Option<ClaimRequest<'_>>,
        wait: Duration,
        savepoint: bool,
        body: B,
        settle: S,
    ) -> Result<Transacted<R>, StoreError>
    where
        B: for<'a> AsyncFnOnce(&'a mut PgConnection) -> X,
        S: FnOnce(X) -> (Settlement, R),
    {
        const OP: &str = "transactional call";
        if let Some(req) = &req
            && let Some(answer) = self.inner.replays.get(req)
        {
            return Ok(Transacted::Answered(answer));
        }
        let pool = self
            .inner
            .sqlx
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                StoreError::new(
                    BACKEND,
                    StoreErrorKind::Other,
                    "a transactional tool takes a sqlx connection, but the Postgres store has no \
                     sqlx pool: hand it yours with `PostgresStore::use_sqlx` \
                     (`idem.store().postgres()`)",
                )
            })?;
        let mut discard = false;
        let mut conn = self
            .timed_sqlx(OP, &mut discard, Box::pin(pool.acquire()))
            .await?;
        let ended = self
            .transact_sqlx_on(&mut conn, &mut discard, req, wait, savepoint, body, settle)
            .await;
        if discard {
            // A statement went unanswered: the connection may answer it late, or never.
            conn.close_on_drop();
        }
        ended
    }

    #[allow(clippy::too_many_arguments)]
    async fn transact_sqlx_on<X, R, B, S>(
        &self,
        conn: &mut PgConnection,
        discard: &mut bool,
        req: Option<ClaimRequest<'_>>,
        wait: Duration,
        savepoint: bool,
        body: B,
        settle: S,
    ) -> Result<Transacted<R>, StoreError>
    where
        B: for<'a> AsyncFnOnce(&'a mut PgConnection) -> X,
        S: FnOnce(X) -> (Settlement, R),
    {
        let mut tx = self
            .timed_sqlx("begin", discard, sqlx::Connection::begin(conn))
            .await?;
        let token = FencingToken::generate();
        if let Some(req) = &req {
            let claim = match self.claim_sqlx(&mut tx, discard, req, wait, token).await {
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
                .timed_sqlx("savepoint", discard, sqlx::Acquire::begin(&mut tx))
                .await?;
            let (settlement, answer) = settle(body(&mut inner).await);
            let closed = match settlement {
                Settlement::Keep(..) => {
                    self.timed_sqlx("savepoint", discard, Box::pin(inner.commit()))
                        .await
                }
                Settlement::RecordWithoutWrites(..) | Settlement::RollBack => {
                    self.timed_sqlx("savepoint", discard, Box::pin(inner.rollback()))
                        .await
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
                let _ = self
                    .timed_sqlx("rollback", discard, Box::pin(tx.rollback()))
                    .await;
                return Ok(Transacted::Settled(answer));
            }
        };
        let Some(req) = req else {
            return match self
                .timed_sqlx("commit", discard, Box::pin(tx.commit()))
                .await
            {
                Ok(()) => Ok(Transacted::Settled(answer)),
                Err(e) => Ok(Transacted::NotCommitted(answer, e)),
            };
        };
        let expires_at = db_time(after(req.now, req.ttl));
        let blob = blob::stored_apart(status, &bytes, self.inner.blob_threshold);
        let statement = match blob {
            Some(_) => &self.inner.sql.complete_blob[0],
            None => &self.inner.sql.complete,
        };
        let complete = self
            .prepared(statement)
            .bind(req.tenant)
            .bind(&req.key.as_bytes()[..])
            .bind(token.get() as i64)
            .bind(&bytes[..])
            .bind(expires_at)
            .bind(status.as_str());
        let complete = match &blob {
            Some(hash) => complete.bind(&hash.as_bytes()[..]),
            None => complete,
        };
        match self
            .timed_sqlx("complete", discard, Box::pin(complete.fetch_all(&mut *tx)))
            .await
        {
            Ok(rows) if rows.len() == 1 => {}
            Ok(_) => {
                let lost = corrupt(
                    "complete",
                    "the claim's own row vanished inside its transaction",
                );
                return Ok(Transacted::NotCommitted(answer, lost));
            }
            Err(e) => return Ok(Transacted::NotCommitted(answer, e)),
        }
        if let Err(e) = self
            .timed_sqlx("commit", discard, Box::pin(tx.commit()))
            .await
        {
            return Ok(Transacted::NotCommitted(answer, e));
        }
        if status == RecordStatus::Completed {
            self.inner
                .replays
                .put(&req, &bytes, expires_at.max(0) as u64);
        }
        Ok(Transacted::Settled(answer))
    }

    /// The store's claim inside the transaction, after setting its wait.
    async fn claim_sqlx(
        &self,
        conn: &mut PgConnection,
        discard: &mut bool,
        req: &ClaimRequest<'_>,
        wait: Duration,
        token: FencingToken,
    ) -> Result<Claim, StoreError> {
        const OP: &str = "claim";
        // Whole milliseconds, at least one: `0` would turn the wait off.
        let set_wait = format!("SET LOCAL lock_timeout = {}", db_millis(wait).max(1));
        self.timed_sqlx(
            OP,
            discard,
            Box::pin(sqlx::query(&set_wait).persistent(false).execute(&mut *conn)),
        )
        .await?;
        let sql = &self.inner.sql;
        let fast = self.bound_claim(&sql.claim_fast, req, token);
        let rows = self
            .timed_sqlx(OP, discard, Box::pin(fast.fetch_all(&mut *conn)))
            .await?;
        if let Some(row) = rows.first() {
            let row = claim_row(row).map_err(|e| sqlx_error(OP, e))?;
            if row.decision >= 0 {
                return decide_claim(row, token, *req, &self.inner.replays);
            }
        }
        let full = self.bound_claim(&sql.claim, req, token);
        let rows = self
            .timed_sqlx(OP, discard, Box::pin(full.fetch_all(&mut *conn)))
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| corrupt(OP, "the claim answered no row"))?;
        let row = claim_row(row).map_err(|e| sqlx_error(OP, e))?;
        decide_claim(row, token, *req, &self.inner.replays)
    }

    /// A claim statement with its nine arguments.
    fn bound_claim<'q>(
        &self,
        statement: &'q Statement,
        req: &'q ClaimRequest<'q>,
        token: FencingToken,
    ) -> Query<'q> {
        self.prepared(statement)
            .bind(req.tenant)
            .bind(&req.key.as_bytes()[..])
            .bind(req.tool)
            .bind(&req.fingerprint.as_bytes()[..])
            .bind(token.get() as i64)
            .bind(db_time(req.now))
            .bind(db_millis(req.lease))
            .bind(db_millis(req.ttl))
            .bind(orphans_code(req.orphans))
    }

    /// `statement` as a sqlx query: prepared and kept per connection, except through a
    /// transaction pooler (see [`PostgresOptions::transaction_pooler`](super::PostgresOptions)).
    fn prepared<'q>(&self, statement: &'q Statement) -> Query<'q> {
        sqlx::query(&statement.sql).persistent(!self.inner.transaction_pooler)
    }

    /// `fut` within the response timeout; a timeout sets `discard`. Boxed (`Send` proven where
    /// it is made): a sqlx future held inside a future generic over the tool's body trips
    /// rustc's higher-ranked `Send` check ("implementation of `Executor` is not general enough").
    async fn timed_sqlx<T>(
        &self,
        op: &str,
        discard: &mut bool,
        fut: BoxFuture<'_, Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.response_timeout, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(sqlx_error(op, e)),
            Err(_) => {
                *discard = true;
                Err(self.unanswered(op))
            }
        }
    }
}

/// A claim's answer, read from a sqlx row.
fn claim_row(row: &PgRow) -> Result<ClaimRow, sqlx::Error> {
    Ok(ClaimRow {
        decision: row.try_get(0)?,
        token: row.try_get(1)?,
        lease_expires_at: row.try_get(2)?,
        expires_at: row.try_get(3)?,
        result: row.try_get(4)?,
    })
}
