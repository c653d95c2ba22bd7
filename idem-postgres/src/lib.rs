//! The shared PostgreSQL store: many workers on many machines, one key space.
//!
//! `Idem::open("postgres://user@host/db")` connects (a pool) and creates or checks the schema.
//! What it guarantees:
//!
//! - **Atomic claims, one round trip in the common cases.** The decision table of
//!   [`decide`](idem_core::store::decide) runs inside the server. A new key, a replay, a mismatch, a live in-flight record and a blocked
//!   unknown one are decided by one plain statement (read, and insert when nothing is there,
//!   under one snapshot); the rare rest (an expired key, a lapsed lease, a claim sent again
//!   after a lost answer, a key inserted by another claim at the same instant) makes nothing
//!   there and goes to the function `idem_claim` the schema installs, one more round trip. A
//!   claim that only reads takes no lock and writes nothing; a claim that writes does it with a
//!   conditional statement that the server re-checks under the row lock (the insert by its
//!   primary key), so concurrent claims of one key from any number of processes have one winner.
//! - **Replay storms read.** While most claims lately found a record and answered without
//!   writing (a fleet retrying after an outage), a claim first reads the record with a plain
//!   point `SELECT`, cheaper for the server than the statement that may insert, and decides from
//!   it by the decision table itself ([`decide`](idem_core::store::decide), in the client); it goes on
//!   to that statement only for a new key or what the function decides (one round trip more for
//!   those); otherwise it goes straight to the claim statement. Both answer the same (see
//!   `store/read_first.rs`).
//! - **Durable claims.** The claim commits before [`Claim::Acquired`] is answered; with the
//!   server's defaults (`fsync=on`, `synchronous_commit=on`) that commit survives a crash of
//!   the server. [`StoreHealth::durable`] reports the server's settings.
//! - **Fenced writes.** Completion, lease renewal and release apply only while the record
//!   carries the caller's token.
//! - **Connection loss is survivable.** Connections come from a pool (broken ones are replaced);
//!   a claim, completion or release whose connection broke before the answer is sent again once
//!   on a new connection, and each is written so that sending it twice is harmless (a claim
//!   recognises its own token).
//! - **A versioned schema**, created under an advisory lock (so processes starting together do
//!   not race), in the schema named by `?schema=` (default `public`); a store written by a newer
//!   version is refused untouched.
//!
//! URL: `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?option=value&…]`, with the libpq-style
//! options tokio-postgres knows (`connect_timeout` in seconds, `application_name`, …) and these:
//! `schema` (an identifier, default `public`), `pool_size` (default 16), `pool_timeout_ms`
//! (waiting for a connection, default 5000), `statement_timeout_ms` (default 10000; 0 turns it
//! off), `response_timeout_ms` (how long a statement may go unanswered on the client's side, for
//! a stalled server or a network that drops packets: default the statement timeout + 2000, and
//! the connection is then dropped), `replay_cache` (KiB, default 1024, 0 turns it off), `blob_threshold` (bytes, default
//! 65536, or `off`: see below), and the libpq TLS options
//! `sslmode` (`disable`, `prefer` (default), `require`, `verify-ca`, `verify-full`),
//! `sslrootcert` (a PEM file of trusted roots, or `system`, the default), `sslcert` and `sslkey`
//! (a client certificate): see [`TlsOptions`]. A pool you already have is used with
//! [`PostgresStore::from_pool`].

/// The longest result this store keeps: a `bytea` value holds up to 1 GiB, and the statement
/// that writes it carries the rest of the record.
pub const MAX_VALUE_BYTES: usize = 1_000_000_000;

use deadpool_postgres::{Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use idem_core::key::IdempotencyKey;
use idem_core::store::batch::{self, by_key, in_item_order};
use idem_core::store::blob::{self, BlobHash};
use idem_core::store::replay_cache::ReplayCache;
use idem_core::store::stream::out_of_order;
use idem_core::store::{
    BatchClaim, BatchRenewal, BatchSettlement, ChunkAppend, ChunkRead, Claim, ClaimRequest,
    Completion, Fenced, FencingToken, Record, Renewal, Settle, Store, StoreFuture, StoreHealth,
    StreamPage, UnixMillis, Watch, after,
};
use idem_core::{StoreError, StoreErrorKind};

mod admin;
mod claim;
mod driver;
mod notices;
mod options;
mod schema;
#[cfg(feature = "sqlx")]
mod sqlx;
mod store;
mod tls;
pub mod transaction;

/// The pool crate of [`PostgresStore::from_pool`], re-exported so that your pool and idem's
/// name the same version.
pub use deadpool_postgres;
/// The driver whose [`Transaction`](tokio_postgres::Transaction) a transactional tool receives
/// (`#[idempotent(…, transactional)]`), re-exported so that your tool and idem name the same
/// version.
pub use tokio_postgres;

pub use self::options::PostgresOptions;
pub use self::schema::SCHEMA_VERSION;
pub use self::store::PostgresStore;

use self::driver::{
    BACKEND, connection_broke, corrupt, db_millis, db_time, orphans_code, pg_error, pool_error,
};
use self::notices::channel;
use self::store::{Encryption, Inner, READ_FIRST_FROM};
pub use self::tls::{SslMode, TlsOptions};
use idem_core::store::listener::{Listener, Subscribe};

use self::claim::{Sql, Statement, decide_read, decode_claim, decode_record};
use idem_core::store::read_first::ReadFirst;

inventory::submit! {
    idem_core::store::admin::Driver::new(&["postgres", "postgresql"], "postgres://…", |url| {
        Box::pin(open_url(url))
    })
}

/// Opens `postgres://…` (the driver of `Idem::open`).
async fn open_url(url: &str) -> idem_core::store::admin::Opened {
    let options = PostgresOptions::from_url(url)
        .map_err(|reason| idem_core::store::admin::invalid_url(url, reason))?;
    Ok(std::sync::Arc::new(PostgresStore::open(options).await?))
}

impl PostgresStore {
    /// Connects, and creates or checks the schema.
    pub async fn open(options: PostgresOptions) -> Result<Self, StoreError> {
        let connector = options
            .tls
            .connector()
            .map_err(|reason| StoreError::new(BACKEND, StoreErrorKind::Other, reason))?;
        let encryption = match options.tls.mode {
            SslMode::Disable => Encryption::Never,
            SslMode::Prefer => Encryption::IfOffered(connector.clone()),
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Encryption::Always,
        };
        // A transaction pooler cannot hold a `LISTEN`: its callers poll.
        let listen = (!options.transaction_pooler).then(|| {
            let channel = channel(&options.schema);
            let subscribe = notices::subscribe(options.config.clone(), connector.clone(), channel);
            (subscribe, options.response_timeout)
        });
        let manager = Manager::from_config(
            options.config.clone(),
            connector,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            // The most recently used connection first: its server process is the one awake.
            .queue_mode(QueueMode::Lifo)
            .wait_timeout(Some(options.pool_timeout))
            .create_timeout(Some(options.pool_timeout))
            .recycle_timeout(Some(options.pool_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| {
                StoreError::with_source(BACKEND, StoreErrorKind::Other, "building the pool", e)
            })?;
        Self::over(pool, &options, encryption, listen).await
    }

    /// A store over a pool you already have (its connections, TLS and timeouts are yours):
    /// idem's tables are created or checked in `options.schema` exactly as [`PostgresStore::open`]
    /// does, and a schema written by a newer idem is refused. Of `options`, only `schema` and
    /// `replay_cache` apply. Build the pool with the [`deadpool_postgres`] this module re-exports,
    /// so that both name the same version.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_postgres::{PostgresOptions, PostgresStore, deadpool_postgres};
    ///
    /// let mut config = deadpool_postgres::Config::new();
    /// config.url = Some("postgres://app@db.internal/app".into());
    /// let pool = config.create_pool(
    ///     Some(deadpool_postgres::Runtime::Tokio1),
    ///     tokio_postgres::NoTls,
    /// )?;
    /// let mut options = PostgresOptions::default();
    /// options.schema = "idem".into();
    /// let store = PostgresStore::from_pool(pool, options).await?;
    /// // let idem = idem::Idem::with_store(store);
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn from_pool(pool: Pool, options: PostgresOptions) -> Result<Self, StoreError> {
        Self::over(pool, &options, Encryption::Unknown, None).await
    }

    /// The store over `pool`, its schema created or checked.
    async fn over(
        pool: Pool,
        options: &PostgresOptions,
        encryption: Encryption,
        listen: Option<(Subscribe, std::time::Duration)>,
    ) -> Result<Self, StoreError> {
        let store = PostgresStore {
            inner: std::sync::Arc::new(Inner {
                pool,
                sql: Sql::new(&options.schema),
                replays: ReplayCache::new(options.replay_cache),
                blob_threshold: options.blob_threshold,
                read_first: ReadFirst::new(READ_FIRST_FROM),
                encryption,
                transaction_pooler: options.transaction_pooler,
                response_timeout: options.response_timeout,
                listener: Listener::new(listen),
                #[cfg(feature = "sqlx")]
                sqlx: std::sync::RwLock::new(None),
            }),
        };
        store.migrate_in_time(&options.schema).await?;
        Ok(store)
    }

    /// Parses `url` and opens the store.
    pub async fn open_url(url: &str) -> Result<Self, StoreError> {
        let options = PostgresOptions::from_url(url)
            .map_err(|reason| StoreError::new(BACKEND, StoreErrorKind::Other, reason))?;
        Self::open(options).await
    }

    /// [`PostgresStore::migrate`] within a bound: three response timeouts (a handful of
    /// statements, one of which may wait for another worker's migration).
    async fn migrate_in_time(&self, schema: &str) -> Result<(), StoreError> {
        match tokio::time::timeout(self.inner.response_timeout * 3, self.migrate(schema)).await {
            Ok(migrated) => migrated,
            Err(_) => Err(self.unanswered("opening the store")),
        }
    }

    /// The error of a statement the server did not answer within the response timeout.
    fn unanswered(&self, op: &str) -> StoreError {
        StoreError::new(
            BACKEND,
            StoreErrorKind::Timeout,
            format!(
                "{op}: no answer within {} ms (`response_timeout_ms`): the server is stalled or \
                 the network drops packets; the connection is dropped",
                self.inner.response_timeout.as_millis()
            ),
        )
    }

    async fn client(&self, op: &str) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.pool.get().await.map_err(|e| pool_error(op, e))
    }

    /// Runs a statement on a pooled connection and returns its rows. When the
    /// connection broke under it, the connection is thrown away (never handed out again) and the
    /// statement runs once more on a new one; every statement here is safe to send twice.
    async fn query(
        &self,
        op: &str,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let mut retried = false;
        loop {
            let client = self.client(op).await?;
            let sent = async {
                if self.inner.transaction_pooler {
                    let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                        .iter()
                        .copied()
                        .zip(statement.types.iter().cloned())
                        .collect();
                    client.query_typed(&statement.sql, &typed).await
                } else {
                    match client.prepare_cached(&statement.sql).await {
                        Ok(stmt) => client.query(&stmt, params).await,
                        Err(e) => Err(e),
                    }
                }
            };
            let Ok(result) = tokio::time::timeout(self.inner.response_timeout, sent).await else {
                // The statement may or may not have run; the connection may answer it late,
                // or never: it is not handed out again.
                drop(deadpool_postgres::Object::take(client));
                return Err(self.unanswered(op));
            };
            let result = result.map_err(|e| pg_error(op, e));
            match result {
                Err(e) if connection_broke(&e) && !retried => {
                    drop(deadpool_postgres::Object::take(client));
                    retried = true;
                }
                other => return other,
            }
        }
    }
}

/// The answers of a batch statement that returns the positions (from 1, in the order sent) of
/// the items it applied: `Applied` there, `Lost` elsewhere.
fn applied_positions(op: &str, rows: &[Row], items: usize) -> Result<Vec<Fenced>, StoreError> {
    let mut answers = vec![Fenced::Lost; items];
    for row in rows {
        let n: i64 = row.get(0);
        let slot = usize::try_from(n - 1)
            .ok()
            .and_then(|n| answers.get_mut(n))
            .ok_or_else(|| corrupt(op, "the batch's answer named no item"))?;
        *slot = Fenced::Applied;
    }
    Ok(answers)
}

impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// What a `bytea` value holds (1 GiB), less room for the rest of its statement.
    fn result_limit(&self) -> usize {
        MAX_VALUE_BYTES
    }

    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            const OP: &str = "claim";
            let replays = &self.inner.replays;
            if let Some(answer) = replays.get(&req) {
                return Ok(answer);
            }
            let (sql, read_first) = (&self.inner.sql, &self.inner.read_first);
            let (key, fingerprint) = (&req.key.as_bytes()[..], &req.fingerprint.as_bytes()[..]);
            let (now, orphans) = (db_time(req.now), orphans_code(req.orphans));
            // A read that finds no record leaves a new key to the plain claim; what only the
            // function decides (an expired record, an orphan) goes to the function.
            let for_the_function = read_first.wanted() && {
                let rows = self
                    .query(OP, &sql.claim_read, &[&req.tenant, &key])
                    .await?;
                match rows.first() {
                    Some(row) => match decide_read(row, &req, replays)? {
                        Some(answer) => {
                            read_first.note(true);
                            return Ok(answer);
                        }
                        None => true,
                    },
                    None => false,
                }
            };
            // A token only for a claim that may write it (a read needs none: one random draw
            // fewer for each replay that reads first).
            let token = FencingToken::generate();
            let params: [&(dyn ToSql + Sync); 9] = [
                &req.tenant,
                &key,
                &req.tool,
                &fingerprint,
                &(token.get() as i64),
                &now,
                &db_millis(req.lease),
                &db_millis(req.ttl),
                &orphans,
            ];
            if !for_the_function {
                let rows = self.query(OP, &sql.claim_fast, &params).await?;
                if let Some(row) = rows.first().filter(|row| row.get::<_, i16>(0) >= 0) {
                    let claim = decode_claim(row, token, req, replays)?;
                    read_first.note(!matches!(claim, Claim::Acquired { .. }));
                    return Ok(claim);
                }
            }
            read_first.note(false);
            let rows = self.query(OP, &sql.claim, &params).await?;
            let row = rows
                .first()
                .ok_or_else(|| corrupt(OP, "the claim answered no row"))?;
            decode_claim(row, token, req, replays)
        })
    }

    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let expires_at = db_time(after(c.now, c.ttl));
            let token = c.token.get() as i64;
            let key = &c.key.as_bytes()[..];
            let status = c.status.as_str();
            let blob = blob::stored_apart(c.status, c.result, self.inner.blob_threshold);
            let hash = blob.as_ref().map(|h| &h.as_bytes()[..]);
            let params: [&(dyn ToSql + Sync); 7] = [
                &c.tenant,
                &key,
                &token,
                &c.result,
                &expires_at,
                &status,
                &hash,
            ];
            let sql = &self.inner.sql;
            let statement = match (hash, c.notify) {
                (Some(_), notify) => &sql.complete_blob[usize::from(notify)],
                (None, true) => &sql.complete_notify,
                (None, false) => &sql.complete,
            };
            let params = if hash.is_some() {
                &params[..]
            } else {
                &params[..6]
            };
            let applied = self.query("complete", statement, params).await?;
            if !applied.is_empty() {
                self.inner.listener.settled(&c.key);
                return Ok(Fenced::Applied);
            }
            // Nothing changed: either another owner holds the key, or an earlier attempt whose
            // answer was lost already completed it with this very token.
            let ours = self.lookup(c.tenant, c.key).await?.is_some_and(|r| {
                r.token == c.token && r.status == c.status && r.result.as_deref() == Some(c.result)
            });
            Ok(if ours { Fenced::Applied } else { Fenced::Lost })
        })
    }

    /// One statement: `idem_claim` for each item, in key order.
    fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
        Box::pin(async move {
            const OP: &str = "claim";
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            let order = by_key(batch.items, |item| item.key);
            let tokens: Vec<FencingToken> =
                order.iter().map(|_| FencingToken::generate()).collect();
            let keys: Vec<&[u8]> = order
                .iter()
                .map(|&i| &batch.items[i].key.as_bytes()[..])
                .collect();
            let fingerprints: Vec<&[u8]> = order
                .iter()
                .map(|&i| &batch.items[i].fingerprint.as_bytes()[..])
                .collect();
            let raw_tokens: Vec<i64> = tokens.iter().map(|t| t.get() as i64).collect();
            let params: [&(dyn ToSql + Sync); 9] = [
                &batch.tenant,
                &keys,
                &batch.tool,
                &fingerprints,
                &raw_tokens,
                &db_time(batch.now),
                &db_millis(batch.lease),
                &db_millis(batch.ttl),
                &orphans_code(batch.orphans),
            ];
            let rows = self.query(OP, &self.inner.sql.claim_batch, &params).await?;
            if rows.len() != order.len() {
                return Err(corrupt(
                    OP,
                    "the batch's claim answered another number of rows",
                ));
            }
            let claims = rows
                .iter()
                .zip(&order)
                .zip(tokens)
                .map(|((row, &i), token)| {
                    decode_claim(
                        row,
                        token,
                        batch.request(&batch.items[i]),
                        &self.inner.replays,
                    )
                })
                .collect::<Result<Vec<Claim>, StoreError>>()?;
            Ok(in_item_order(&order, claims))
        })
    }

    /// One statement: the fenced completions and releases of every item.
    fn settle_batch<'a>(&'a self, batch: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(async move {
            const OP: &str = "complete";
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            let threshold = self.inner.blob_threshold;
            let with_blob = batch.items.iter().any(|item| match item.settle {
                Settle::Complete { status, result } => {
                    blob::stored_apart(status, result, threshold).is_some()
                }
                Settle::Release => false,
            });
            if with_blob {
                // A result stored as a blob is written by the completion of its own key.
                return batch::settle_each(self, batch).await;
            }
            let order = by_key(batch.items, |item| item.key);
            let items = || order.iter().map(|&i| &batch.items[i]);
            let keys: Vec<&[u8]> = items().map(|item| &item.key.as_bytes()[..]).collect();
            let tokens: Vec<i64> = items().map(|item| item.token.get() as i64).collect();
            let (results, statuses): (Vec<&[u8]>, Vec<&str>) = items()
                .map(|item| match item.settle {
                    Settle::Complete { status, result } => (result, status.as_str()),
                    Settle::Release => (&[][..], "release"),
                })
                .unzip();
            let expires_at = db_time(after(batch.now, batch.ttl));
            let params: [&(dyn ToSql + Sync); 6] = [
                &batch.tenant,
                &keys,
                &tokens,
                &results,
                &statuses,
                &expires_at,
            ];
            let rows = self
                .query(OP, &self.inner.sql.settle_batch, &params)
                .await?;
            let answers = applied_positions(OP, &rows, order.len())?;
            for (item, answer) in items().zip(&answers) {
                if *answer == Fenced::Applied {
                    self.inner.listener.settled(&item.key);
                }
            }
            Ok(in_item_order(&order, answers))
        })
    }

    /// One statement: the fenced renewals of every item, in key order.
    fn renew_batch<'a>(&'a self, batch: BatchRenewal<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(async move {
            const OP: &str = "renew";
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            let order = by_key(batch.items, |item| item.key);
            let items = || order.iter().map(|&i| &batch.items[i]);
            let keys: Vec<&[u8]> = items().map(|item| &item.key.as_bytes()[..]).collect();
            let tokens: Vec<i64> = items().map(|item| item.token.get() as i64).collect();
            let lease_expires_at = db_time(after(batch.now, batch.lease));
            let params: [&(dyn ToSql + Sync); 4] =
                [&batch.tenant, &keys, &lease_expires_at, &tokens];
            let rows = self.query(OP, &self.inner.sql.renew_batch, &params).await?;
            let answers = applied_positions(OP, &rows, order.len())?;
            Ok(in_item_order(&order, answers))
        })
    }

    fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let (key, token) = (&r.key.as_bytes()[..], r.token.get() as i64);
            let lease_expires_at = db_time(after(r.now, r.lease));
            let renewed = self
                .query(
                    "renew",
                    &self.inner.sql.renew,
                    &[&r.tenant, &key, &token, &lease_expires_at],
                )
                .await?;
            // Sent twice after a lost answer, a renewal still finds its own token: it is safe
            // to repeat.
            Ok(if renewed.is_empty() {
                Fenced::Lost
            } else {
                Fenced::Applied
            })
        })
    }

    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let (bytes, token) = (&key.as_bytes()[..], token.get() as i64);
            let deleted = self
                .query(
                    "release",
                    &self.inner.sql.release,
                    &[&tenant, &bytes, &token],
                )
                .await?;
            if deleted.is_empty() {
                return Ok(Fenced::Lost);
            }
            self.inner.listener.settled(&key);
            Ok(Fenced::Applied)
        })
    }

    /// One statement: the owner's check (locking its record against a takeover until the
    /// chunks are in), an earlier holder's chunks dropped, the chunks added.
    fn append_chunks<'a>(&'a self, a: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            const OP: &str = "append_chunks";
            let (key, token) = (&a.key.as_bytes()[..], a.token.get() as i64);
            let first = i64::try_from(a.first).unwrap_or(i64::MAX);
            let hashes: Vec<Option<BlobHash>> = a
                .chunks
                .iter()
                .map(|c| blob::chunk_apart(c, self.inner.blob_threshold))
                .collect();
            let hashes: Vec<Option<&[u8]>> = hashes
                .iter()
                .map(|h| h.as_ref().map(|h| &h.as_bytes()[..]))
                .collect();
            let rows = self
                .query(
                    OP,
                    &self.inner.sql.append_chunks,
                    &[&a.tenant, &key, &token, &first, &a.chunks, &hashes],
                )
                .await?;
            let row = rows.first().ok_or_else(|| corrupt(OP, "no answer"))?;
            let (owns, have): (bool, i64) = (row.get(0), row.get(1));
            if !owns {
                return Ok(Fenced::Lost);
            }
            if first > have {
                return Err(out_of_order(BACKEND, a.first, have.max(0) as u64));
            }
            Ok(Fenced::Applied)
        })
    }

    /// One statement: the record, and its stream's page as an array.
    fn read_chunks<'a>(&'a self, r: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
        Box::pin(async move {
            let key = &r.key.as_bytes()[..];
            let from = i64::try_from(r.from).unwrap_or(i64::MAX);
            let limit = i64::try_from(r.limit.max(1)).unwrap_or(i64::MAX);
            let rows = self
                .query(
                    "read_chunks",
                    &self.inner.sql.read_chunks,
                    &[&r.tenant, &key, &from, &limit],
                )
                .await?;
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            let chunks: Vec<Option<Vec<u8>>> = row.get(11);
            let chunks = chunks
                .into_iter()
                .map(|c| {
                    c.ok_or_else(|| corrupt("read_chunks", "a chunk names a blob that is gone"))
                })
                .collect::<Result<_, _>>()?;
            Ok(Some(StreamPage {
                record: decode_record(row)?,
                chunks,
            }))
        })
    }

    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            let key = &key.as_bytes()[..];
            let rows = self
                .query("lookup", &self.inner.sql.lookup, &[&tenant, &key])
                .await?;
            rows.first().map(decode_record).transpose()
        })
    }

    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let purged = self
                .query("purge", &self.inner.sql.purge, &[&db_time(now), &limit])
                .await?;
            Ok(purged.len())
        })
    }

    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        Box::pin(async move {
            const OP: &str = "health check";
            match tokio::time::timeout(self.inner.response_timeout, self.check_health()).await {
                Ok(health) => health,
                Err(_) => Err(self.unanswered(OP)),
            }
        })
    }

    fn as_any(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        Some(self)
    }

    /// Announced once the store's listener `LISTEN`s (see the `notices` module).
    fn watch<'a>(&'a self, _tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
        Box::pin(async move { Ok(self.inner.listener.watch(key).await) })
    }
}

impl PostgresStore {
    /// The health check's statements (see [`Store::health`]).
    async fn check_health(&self) -> Result<StoreHealth, StoreError> {
        const OP: &str = "health check";
        let client = self.client(OP).await?;
        // Unnamed statements, as through a transaction pooler: the health check runs too
        // seldom to gain from preparing.
        let version: Option<i32> = client
            .query_typed(&self.inner.sql.version.sql, &[])
            .await
            .map_err(|e| pg_error(OP, e))?
            .first()
            .map(|row| row.get(0));
        let settings = client
            .query_typed(
                "SELECT current_setting('fsync'), current_setting('synchronous_commit')",
                &[],
            )
            .await
            .map_err(|e| pg_error(OP, e))?;
        let settings = settings
            .first()
            .ok_or_else(|| corrupt(OP, "the server answered no settings"))?;
        let (fsync, commit): (String, String) = (settings.get(0), settings.get(1));
        let durable = fsync == "on" && commit != "off";
        let encrypted = match &self.inner.encryption {
            Encryption::Never => Some(false),
            Encryption::Always => Some(true),
            Encryption::IfOffered(connector) => Some(connector.handshakes() > 0),
            Encryption::Unknown => None,
        };
        Ok(StoreHealth {
            backend: BACKEND,
            encrypted,
            fencing: None,
            schema_version: version.map_or(0, |v| v.max(0) as u32),
            expected_schema_version: SCHEMA_VERSION,
            durable,
            detail: (!durable).then(|| {
                format!(
                    "the server runs with fsync={fsync}, synchronous_commit={commit}: a \
                         claim may be lost in a server crash"
                )
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deleting a record deletes the chunks of its stream, however it goes: a release, a purge,
    /// an operator's delete (in a schema of its own, which the purge may empty).
    #[tokio::test]
    async fn deleting_a_record_leaves_no_chunk() {
        let Some(url) = idem_core::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL")
        else {
            return;
        };
        let schema = format!("chunks_{}", uuid::Uuid::new_v4().simple());
        let sep = if url.contains('?') { '&' } else { '?' };
        let store = PostgresStore::open_url(&format!("{url}{sep}schema={schema}"))
            .await
            .expect("open");
        let count = || async {
            let client = store.client("count").await.expect("client");
            let sql = format!("SELECT count(*) FROM \"{schema}\".idem_chunks");
            let rows = client.query_typed(&sql, &[]).await.expect("count");
            rows[0].get::<_, i64>(0)
        };
        let chunks = vec![vec![1u8; 100]; 10];
        let mut held = Vec::new();
        for n in 0..3u32 {
            let key = idem_core::key::derive_key(
                "t",
                "tool",
                &[idem_core::key::KeyPart::new(&n).unwrap()],
            );
            let claim = store.claim(ClaimRequest {
                tenant: "t",
                key,
                tool: "tool",
                fingerprint: idem_core::Fingerprint::from_bytes([7; 32]),
                now: 1_000,
                lease: std::time::Duration::from_secs(30),
                ttl: std::time::Duration::from_secs(3_600),
                orphans: idem_core::store::Orphans::TakeOver,
            });
            let Claim::Acquired { token, .. } = claim.await.expect("claim") else {
                panic!("a new key is acquired");
            };
            let append = ChunkAppend {
                tenant: "t",
                key,
                token,
                first: 0,
                chunks: &chunks,
            };
            assert_eq!(
                store.append_chunks(append).await.expect("append"),
                Fenced::Applied
            );
            held.push((key, token));
        }
        assert_eq!(count().await, 30);
        let (key, token) = held[0];
        assert_eq!(
            store.release("t", key, token).await.expect("release"),
            Fenced::Applied
        );
        assert_eq!(count().await, 20, "released");
        let deleted = idem_core::store::admin::AdminStore::delete(&store, "t", held[1].0);
        assert_eq!(deleted.await.expect("delete"), Fenced::Applied);
        assert_eq!(count().await, 10, "deleted by an operator");
        assert_eq!(
            store.purge_expired(u64::MAX / 2, 10).await.expect("purge"),
            1
        );
        assert_eq!(count().await, 0, "purged");
        let client = store.client("drop").await.expect("client");
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .expect("drop the schema");
    }

    /// A claim whose answer was lost is sent again with the same token (see `query`): the
    /// plain statement leaves it to the function, which recognises the claim as its own.
    #[tokio::test]
    async fn a_claim_sent_again_is_recognised_as_its_own() {
        let Some(url) = idem_core::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL")
        else {
            return;
        };
        let store = PostgresStore::open_url(&url).await.expect("open");
        let tenant = format!("resent-{}", uuid::Uuid::new_v4().simple());
        let key = [7u8; 32];
        let token = 4242i64;
        let params: [&(dyn ToSql + Sync); 9] = [
            &tenant,
            &&key[..],
            &"tool",
            &&[1u8; 32][..],
            &token,
            &1_000i64,
            &30_000i64,
            &60_000i64,
            &0i16,
        ];
        let decision = |rows: Vec<Row>| rows.first().map(|r| r.get::<_, i16>(0));
        let sql = &store.inner.sql;
        let first = store.query("claim", &sql.claim_fast, &params).await;
        assert_eq!(
            decision(first.expect("first")),
            Some(0),
            "a new key is inserted"
        );
        let again = store.query("claim", &sql.claim_fast, &params).await;
        assert_eq!(
            decision(again.expect("again")),
            Some(-1),
            "left to the function"
        );
        let full = store.query("claim", &sql.claim, &params).await;
        assert_eq!(
            decision(full.expect("function")),
            Some(0),
            "its own, created now"
        );
    }

    /// Through a transaction pooler each statement is sent with its declared parameter types:
    /// they must be the ones the server infers.
    #[tokio::test]
    async fn declared_parameter_types_are_the_servers() {
        let Some(url) = idem_core::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL")
        else {
            return;
        };
        let store = PostgresStore::open_url(&url).await.expect("open");
        let client = store.client("test").await.expect("client");
        let sql = &store.inner.sql;
        for statement in [
            &sql.claim_fast,
            &sql.claim_read,
            &sql.claim,
            &sql.complete,
            &sql.complete_notify,
            &sql.complete_or_abort,
            &sql.complete_blob[0],
            &sql.complete_blob[1],
            &sql.complete_blob[2],
            &sql.blob_usage,
            &sql.renew,
            &sql.release,
            &sql.lookup,
            &sql.scan,
            &sql.resolve_complete,
            &sql.resolve_release,
            &sql.delete,
            &sql.purge,
            &sql.version,
            &sql.server_time,
        ] {
            let prepared = client.prepare(&statement.sql).await.expect("prepare");
            assert_eq!(prepared.params(), statement.types, "{}", statement.sql);
        }
    }

    /// Two stores on one schema are two processes: the server's notices carry settlements.
    #[tokio::test]
    async fn settlements_in_another_process_wake_watches_by_notice() {
        let Some(url) = idem_core::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL")
        else {
            return;
        };
        let here = PostgresStore::open_url(&url).await.expect("open");
        let there = PostgresStore::open_url(&url).await.expect("open");
        idem_core::store::conformance::settlements_elsewhere_wake_watches(&here, &there).await;
    }

    mod conformance {
        async fn store() -> Option<super::PostgresStore> {
            let url = idem_core::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL")?;
            Some(
                super::PostgresStore::open_url(&url)
                    .await
                    .expect("IDEM_TEST_POSTGRES_URL names a reachable server"),
            )
        }
        idem_core::store_conformance_tests!(maybe: store());
        idem_core::admin_conformance_tests!(maybe: store());

        /// The same contract with every claim reading first, as after a run of replays: the
        /// read answers what it may, and leaves the rest to the claim statement.
        mod read_first {
            async fn store() -> Option<super::super::PostgresStore> {
                let mut store = super::store().await?;
                std::sync::Arc::get_mut(&mut store.inner)
                    .expect("a store just opened is not shared")
                    .read_first = super::super::ReadFirst::always();
                Some(store)
            }
            idem_core::store_conformance_tests!(maybe: store());
        }

        /// The same contract on a store over a pool its user built, in a schema of its own.
        mod own_pool {
            async fn store() -> Option<super::super::PostgresStore> {
                let url = idem_core::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL")?;
                let mut config = deadpool_postgres::Config::new();
                config.url = Some(url);
                let pool = config
                    .create_pool(
                        Some(deadpool_postgres::Runtime::Tokio1),
                        tokio_postgres::NoTls,
                    )
                    .expect("a pool");
                let options = super::super::PostgresOptions {
                    schema: "idem_own_pool".into(),
                    ..Default::default()
                };
                Some(
                    super::super::PostgresStore::from_pool(pool, options)
                        .await
                        .expect("the schema is created through the user's pool"),
                )
            }
            idem_core::store_conformance_tests!(maybe: store());
        }
    }
}
