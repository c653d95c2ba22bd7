//! The shared PostgreSQL store: many workers on many machines, one key space.
//!
//! `Idem::open("postgres://user@host/db")` connects (a pool) and creates or checks the schema.
//! What it guarantees:
//!
//! - **Atomic claims, one round trip in the common cases.** The decision table of DESIGN §2 runs
//!   inside the server. A new key, a replay, a mismatch, a live in-flight record and a blocked
//!   unknown one are decided by one plain statement (read, and insert when nothing is there,
//!   under one snapshot); the rare rest (an expired key, a lapsed lease, a claim sent again
//!   after a lost answer, a key inserted by another claim at the same instant) makes nothing
//!   there and goes to the function `idem_claim` the schema installs, one more round trip. A
//!   claim that only reads takes no lock and writes nothing; a claim that writes does it with a
//!   conditional statement that the server re-checks under the row lock (the insert by its
//!   primary key), so concurrent claims of one key from any number of processes have one winner.
//! - **Durable claims.** The claim commits before [`Claim::Acquired`] is answered; with the
//!   server's defaults (`fsync=on`, `synchronous_commit=on`) that commit survives a crash of
//!   the server. [`StoreHealth::durable`] reports the server's settings.
//! - **Fenced writes.** Completion and release apply only while the record carries the caller's
//!   token.
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
//! off), `replay_cache` (entries, default 1024, 0 turns it off). TLS is not supported by this
//! build: use it on a private network or a loopback/socket connection.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Pool, PoolError, QueueMode, RecyclingMethod, Runtime,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use super::admin::{self, AdminStore, Page, Resolution};
use super::replay_cache::{self, ReplayCache};
use super::{
    Claim, ClaimRequest, Completion, Fenced, FencingToken, Orphans, Record, RecordStatus, Store,
    StoreFuture, StoreHealth, UnixMillis, after,
};
use crate::error::{StoreError, StoreErrorKind};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;

const BACKEND: &str = "postgres";

/// The schema version this build writes (2 added the `unknown` status, the orphan policy of
/// `idem_claim` and the operator's `note`; a version-1 schema is upgraded on open).
pub const SCHEMA_VERSION: u32 = 2;

/// A constant for `pg_advisory_xact_lock`, so migrations of one database run one at a time.
const MIGRATION_LOCK: i64 = 0x6964_656d_0001; // "idem" + 1

/// Options of a [`PostgresStore`], usually taken from the URL.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    config: tokio_postgres::Config,
    /// The Postgres schema (namespace) holding idem's tables.
    pub schema: String,
    /// Most connections the pool opens.
    pub pool_size: usize,
    /// How long a call waits for a free connection (or for a new one) before a timeout error.
    pub pool_timeout: Duration,
    /// The server-side `statement_timeout` of idem's connections (`None`: the server's).
    pub statement_timeout: Option<Duration>,
    /// How many completed records to keep in memory for replays (0: none).
    pub replay_cache: usize,
}

impl PostgresOptions {
    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn from_url(url: &str) -> Result<Self, String> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut options = PostgresOptions {
            config: tokio_postgres::Config::new(),
            schema: "public".into(),
            pool_size: 16,
            pool_timeout: Duration::from_secs(5),
            statement_timeout: Some(Duration::from_secs(10)),
            replay_cache: replay_cache::DEFAULT_CAPACITY,
        };
        let millis = |name: &str, value: &str| -> Result<u64, String> {
            value.parse().map_err(|_| {
                format!("`{name}` must be a whole number of milliseconds, not `{value}`")
            })
        };
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "schema" => {
                    if !is_identifier(value) {
                        return Err(format!(
                            "`schema` must be a lowercase SQL identifier (letters, digits, `_`, \
                             at most 63), not `{value}`"
                        ));
                    }
                    options.schema = value.to_owned();
                }
                "pool_size" => {
                    options.pool_size = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        format!("`pool_size` must be a positive number, not `{value}`")
                    })?;
                }
                "pool_timeout_ms" => {
                    options.pool_timeout = Duration::from_millis(millis(name, value)?);
                }
                "statement_timeout_ms" => {
                    let ms = millis(name, value)?;
                    options.statement_timeout = (ms > 0).then(|| Duration::from_millis(ms));
                }
                "replay_cache" => {
                    options.replay_cache = replay_cache::parse_capacity(value)?;
                }
                "sslmode" if value != "disable" => {
                    return Err(
                        "TLS is not supported by this build: use `sslmode=disable` on a \
                                private network or a local connection"
                            .into(),
                    );
                }
                _ => passed_on.push(pair),
            }
        }
        let rest = if passed_on.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", passed_on.join("&"))
        };
        options.config = tokio_postgres::Config::from_str(&rest).map_err(|e| e.to_string())?;
        if options.config.get_connect_timeout().is_none() {
            options.config.connect_timeout(Duration::from_secs(5));
        }
        if options.config.get_application_name().is_none() {
            options.config.application_name("idem");
        }
        if let Some(timeout) = options.statement_timeout {
            let ours = format!("-c statement_timeout={}", timeout.as_millis());
            let all = match options.config.get_options() {
                Some(theirs) => format!("{theirs} {ours}"),
                None => ours,
            };
            options.config.options(all);
        }
        Ok(options)
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && s.len() <= 63
}

/// The columns of a [`Record`], in [`decode_record`]'s order.
const COLUMNS: &str = "tenant, key, tool, fingerprint, status, token, lease_expires_at, \
     created_at, expires_at, result, note";

/// The condition of a record an operator may resolve (`$3` is now).
const BLOCKED: &str = "tenant = $1 AND key = $2 \
     AND (status = 'unknown' OR (status = 'in_flight' AND lease_expires_at <= $3))";

/// The SQL of one schema, with its name substituted once.
#[derive(Debug)]
struct Sql {
    /// The common claims in one plain statement (no function call): a new key is inserted, and a
    /// live record answers replay, mismatch, in flight or unknown from one snapshot. Anything
    /// else (expired, lapsed lease, this claim sent again, a concurrent insert) answers `-1` or
    /// no row, and the claim goes to [`Sql::claim`].
    claim_fast: String,
    /// The whole decision table: the schema's function `idem_claim`.
    claim: String,
    complete: String,
    release: String,
    lookup: String,
    scan: String,
    resolve_complete: String,
    resolve_release: String,
    delete: String,
    purge: String,
    version: String,
}

impl Sql {
    fn new(schema: &str) -> Self {
        let t = format!("\"{schema}\".idem_records");
        Sql {
            claim_fast: format!(
                "WITH held AS (SELECT fingerprint, status, token, lease_expires_at, expires_at, \
                 result FROM {t} WHERE tenant = $1::text AND key = $2::bytea), \
                 ins AS (INSERT INTO {t} (tenant, key, tool, fingerprint, status, token, \
                 lease_expires_at, created_at, expires_at) SELECT $1, $2, $3::text, $4::bytea, \
                 'in_flight', $5::bigint, $6::bigint + $7::bigint, $6, $6 + $8::bigint \
                 WHERE NOT EXISTS (SELECT 1 FROM held) \
                 ON CONFLICT (tenant, key) DO NOTHING RETURNING token) \
                 SELECT 0::smallint, token, NULL::bigint, NULL::bigint, NULL::bytea FROM ins \
                 UNION ALL \
                 SELECT CASE WHEN h.expires_at <= $6 THEN -1 \
                 WHEN h.fingerprint <> $4 THEN 2 \
                 WHEN h.status = 'completed' THEN 3 \
                 WHEN h.token = $5 THEN -1 \
                 WHEN h.status = 'unknown' THEN CASE WHEN $9::smallint = 1 THEN -1 ELSE 5 END \
                 WHEN h.lease_expires_at > $6 THEN 4 \
                 ELSE -1 END::smallint, NULL, h.lease_expires_at, h.expires_at, h.result \
                 FROM held h"
            ),
            claim: format!(
                "SELECT decision, token, lease_expires_at, expires_at, result \
                 FROM \"{schema}\".idem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            ),
            complete: format!(
                "UPDATE {t} SET status = $6, result = $4, expires_at = $5 \
                 WHERE tenant = $1 AND key = $2 AND token = $3 AND status = 'in_flight' \
                 RETURNING 1"
            ),
            release: format!(
                "DELETE FROM {t} WHERE tenant = $1 AND key = $2 AND token = $3 \
                 AND status = 'in_flight' RETURNING 1"
            ),
            lookup: format!("SELECT {COLUMNS} FROM {t} WHERE tenant = $1 AND key = $2"),
            scan: format!(
                "SELECT {COLUMNS} FROM {t} WHERE ($1::text IS NULL OR tenant = $1) \
                 AND (tenant, key) > ($2, $3) ORDER BY tenant, key LIMIT $4"
            ),
            resolve_complete: format!(
                "UPDATE {t} SET status = 'completed', result = $4, note = $5, token = 0 \
                 WHERE {BLOCKED} RETURNING 1"
            ),
            resolve_release: format!("DELETE FROM {t} WHERE {BLOCKED} RETURNING 1"),
            delete: format!("DELETE FROM {t} WHERE tenant = $1 AND key = $2 RETURNING 1"),
            purge: format!(
                "DELETE FROM {t} WHERE (tenant, key) IN (SELECT tenant, key FROM {t} \
                 WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1"
            ),
            version: format!(
                "SELECT value FROM \"{schema}\".idem_meta WHERE name = 'schema_version'"
            ),
        }
    }
}

/// The schema, version 2. `{s}` is the quoted schema name.
const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS {s}.idem_records (
    tenant           text     NOT NULL,
    key              bytea    NOT NULL CHECK (length(key) = 32),
    tool             text     NOT NULL,
    fingerprint      bytea    NOT NULL CHECK (length(fingerprint) = 32),
    status           text     NOT NULL CONSTRAINT idem_records_status_check
                              CHECK (status IN ('in_flight', 'completed', 'unknown')),
    token            bigint   NOT NULL,
    lease_expires_at bigint   NOT NULL,
    created_at       bigint   NOT NULL,
    expires_at       bigint   NOT NULL,
    result           bytea,
    note             text,
    PRIMARY KEY (tenant, key)
);
ALTER TABLE {s}.idem_records ADD COLUMN IF NOT EXISTS note text;
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON {s}.idem_records (expires_at);

-- The claim: DESIGN §2 in one call. Orphans (p_orphans): 0 take over, 1 reconcile (take over
-- lapsed and unknown records for the caller's state check), 2 block (mark lapsed records
-- unknown). Decisions: 0 acquired, 1 acquired by takeover, 2 mismatch, 3 completed (replay),
-- 4 in flight, 5 unknown.
CREATE OR REPLACE FUNCTION {s}.idem_claim(
    p_tenant text, p_key bytea, p_tool text, p_fingerprint bytea, p_token bigint,
    p_now bigint, p_lease bigint, p_ttl bigint, p_orphans smallint,
    OUT decision smallint, OUT token bigint, OUT lease_expires_at bigint,
    OUT expires_at bigint, OUT result bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    held {s}.idem_records%ROWTYPE;
BEGIN
    FOR attempt IN 1..16 LOOP
        -- A plain read first: replays, mismatches and in-flight answers take no lock.
        SELECT * INTO held FROM {s}.idem_records r
        WHERE r.tenant = p_tenant AND r.key = p_key;
        IF NOT FOUND THEN
            INSERT INTO {s}.idem_records AS r (tenant, key, tool, fingerprint, status, token,
                lease_expires_at, created_at, expires_at, result)
            VALUES (p_tenant, p_key, p_tool, p_fingerprint, 'in_flight', p_token,
                p_now + p_lease, p_now, p_now + p_ttl, NULL)
            ON CONFLICT (tenant, key) DO NOTHING;
            IF FOUND THEN
                decision := 0; token := p_token; RETURN;
            END IF;
        ELSIF held.expires_at <= p_now THEN
            UPDATE {s}.idem_records r SET tool = p_tool, fingerprint = p_fingerprint,
                status = 'in_flight', token = p_token, lease_expires_at = p_now + p_lease,
                created_at = p_now, expires_at = p_now + p_ttl, result = NULL
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.expires_at <= p_now;
            IF FOUND THEN
                decision := 0; token := p_token; RETURN;
            END IF;
        ELSIF held.fingerprint <> p_fingerprint THEN
            decision := 2; RETURN;
        ELSIF held.status = 'completed' THEN
            decision := 3; expires_at := held.expires_at; result := held.result; RETURN;
        ELSIF held.token = p_token THEN
            -- This very claim, sent again after a lost answer: it is ours. It created the
            -- record (created now) or took an older one over.
            decision := CASE WHEN held.created_at = p_now THEN 0 ELSE 1 END;
            token := p_token; RETURN;
        ELSIF held.status = 'unknown' THEN
            IF p_orphans <> 1 THEN
                decision := 5; RETURN;
            END IF;
            UPDATE {s}.idem_records r SET status = 'in_flight', token = p_token,
                lease_expires_at = p_now + p_lease, result = NULL
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.status = 'unknown'
              AND r.fingerprint = p_fingerprint AND r.expires_at > p_now;
            IF FOUND THEN
                decision := 1; token := p_token; RETURN;
            END IF;
        ELSIF held.lease_expires_at > p_now THEN
            decision := 4; lease_expires_at := held.lease_expires_at; RETURN;
        ELSIF p_orphans = 2 THEN
            UPDATE {s}.idem_records r SET status = 'unknown'
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.status = 'in_flight'
              AND r.token = held.token AND r.lease_expires_at <= p_now
              AND r.expires_at > p_now;
            IF FOUND THEN
                decision := 5; RETURN;
            END IF;
        ELSE
            UPDATE {s}.idem_records r SET token = p_token, lease_expires_at = p_now + p_lease
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.status = 'in_flight'
              AND r.fingerprint = p_fingerprint AND r.lease_expires_at <= p_now
              AND r.expires_at > p_now;
            IF FOUND THEN
                decision := 1; token := p_token; RETURN;
            END IF;
        END IF;
        -- Another claim changed the record between the read and the write: decide again.
    END LOOP;
    RAISE EXCEPTION 'idem_claim: the record kept changing under the claim'
        USING ERRCODE = '40001';
END
$fn$;
"#;

/// Version 1 to 2, before [`SCHEMA`] runs: the status constraint admits `unknown`, and the
/// claim function of version 1 (one argument fewer) goes.
const UPGRADE_1_TO_2: &str = r#"
ALTER TABLE {s}.idem_records DROP CONSTRAINT IF EXISTS idem_records_status_check;
ALTER TABLE {s}.idem_records ADD CONSTRAINT idem_records_status_check
    CHECK (status IN ('in_flight', 'completed', 'unknown'));
DROP FUNCTION IF EXISTS {s}.idem_claim(text, bytea, text, bytea, bigint, bigint, bigint, bigint);
"#;

/// The shared PostgreSQL [`Store`]. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    pool: Pool,
    sql: Sql,
    replays: ReplayCache,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.inner.pool.status();
        f.debug_struct("PostgresStore")
            .field("pool_size", &status.max_size)
            .field("connections", &status.size)
            .finish_non_exhaustive()
    }
}

/// Classifies a driver error; the driver's own text stays in `source()`.
fn pg_error(op: &str, e: tokio_postgres::Error) -> StoreError {
    let (kind, cause) = match e.code() {
        Some(code)
            if *code == SqlState::UNDEFINED_TABLE || *code == SqlState::UNDEFINED_FUNCTION =>
        {
            (
                StoreErrorKind::Schema,
                "idem's tables are missing (dropped?); reopen the store to recreate them",
            )
        }
        Some(code)
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            (
                StoreErrorKind::Unavailable,
                "the server refused the credentials",
            )
        }
        Some(code) if *code == SqlState::INVALID_CATALOG_NAME => {
            (StoreErrorKind::Unavailable, "the database does not exist")
        }
        Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => (
            StoreErrorKind::Unavailable,
            "the user lacks a privilege idem needs",
        ),
        Some(code) if *code == SqlState::QUERY_CANCELED => {
            (StoreErrorKind::Timeout, "the statement timed out")
        }
        Some(code)
            if *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::TOO_MANY_CONNECTIONS =>
        {
            (
                StoreErrorKind::Unavailable,
                "the server is shutting down, starting up or full",
            )
        }
        Some(code) if *code == SqlState::T_R_SERIALIZATION_FAILURE => (
            StoreErrorKind::Timeout,
            "the record kept changing under the claim",
        ),
        Some(_) => (StoreErrorKind::Other, "the server reported an error"),
        None if e.is_closed() => (StoreErrorKind::Unavailable, "the connection was closed"),
        None => (StoreErrorKind::Unavailable, "cannot reach the server"),
    };
    StoreError::with_source(BACKEND, kind, format!("{op}: {cause}"), e)
}

fn pool_error(op: &str, e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => pg_error(op, e),
        PoolError::Timeout(_) => StoreError::new(
            BACKEND,
            StoreErrorKind::Timeout,
            format!("{op}: no connection became available in time (server down or pool exhausted)"),
        ),
        PoolError::Closed => StoreError::new(
            BACKEND,
            StoreErrorKind::Closed,
            format!("{op}: the pool is closed"),
        ),
        other => StoreError::with_source(
            BACKEND,
            StoreErrorKind::Unavailable,
            format!("{op}: cannot get a connection"),
            other,
        ),
    }
}

/// Whether an operation may have failed only because its connection broke, so that sending it
/// again on another connection is the right thing to do.
fn connection_broke(e: &StoreError) -> bool {
    e.kind() == StoreErrorKind::Unavailable
        && std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
            .is_some_and(|pg| match pg.code() {
                None => true,
                // The server ended the session (a restart, an administrator): a new connection
                // may well work.
                Some(code) => {
                    pg.is_closed()
                        || *code == SqlState::ADMIN_SHUTDOWN
                        || *code == SqlState::CRASH_SHUTDOWN
                        || *code == SqlState::CANNOT_CONNECT_NOW
                }
            })
}

fn db_time(t: UnixMillis) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

fn db_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn corrupt(op: &str, what: &str) -> StoreError {
    StoreError::new(BACKEND, StoreErrorKind::Corrupt, format!("{op}: {what}"))
}

fn bytes32(op: &str, bytes: &[u8]) -> Result<[u8; 32], StoreError> {
    bytes
        .try_into()
        .map_err(|_| corrupt(op, "a 32-byte column has another length"))
}

impl PostgresStore {
    /// Connects, and creates or checks the schema.
    pub async fn open(options: PostgresOptions) -> Result<Self, StoreError> {
        let manager = Manager::from_config(
            options.config.clone(),
            NoTls,
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
        let store = PostgresStore {
            inner: std::sync::Arc::new(Inner {
                pool,
                sql: Sql::new(&options.schema),
                replays: ReplayCache::new(options.replay_cache),
            }),
        };
        store.migrate(&options.schema).await?;
        Ok(store)
    }

    /// Parses `url` and opens the store.
    pub async fn open_url(url: &str) -> Result<Self, StoreError> {
        let options = PostgresOptions::from_url(url)
            .map_err(|reason| StoreError::new(BACKEND, StoreErrorKind::Other, reason))?;
        Self::open(options).await
    }

    async fn client(&self, op: &str) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.pool.get().await.map_err(|e| pool_error(op, e))
    }

    /// Creates the schema, or checks that the one found is this build's.
    async fn migrate(&self, schema: &str) -> Result<(), StoreError> {
        const OP: &str = "opening the store";
        let mut client = self.client(OP).await?;
        let tx = client.transaction().await.map_err(|e| pg_error(OP, e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| pg_error(OP, e))?;
        let quoted = format!("\"{schema}\"");
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {quoted};
             CREATE TABLE IF NOT EXISTS {quoted}.idem_meta (name text PRIMARY KEY, value integer NOT NULL);"
        ))
        .await
        .map_err(|e| pg_error(OP, e))?;
        let found: Option<i32> = tx
            .query_opt(&self.inner.sql.version, &[])
            .await
            .map_err(|e| pg_error(OP, e))?
            .map(|row| row.get(0));
        match found {
            Some(v) if v > SCHEMA_VERSION as i32 => {
                return Err(StoreError::new(
                    BACKEND,
                    StoreErrorKind::Schema,
                    format!(
                        "the schema `{schema}` was written by a newer idem (schema version {v}); \
                         this build understands up to {SCHEMA_VERSION}: upgrade idem, or point \
                         `?schema=` elsewhere"
                    ),
                ));
            }
            found => {
                if found == Some(1) {
                    tx.batch_execute(&UPGRADE_1_TO_2.replace("{s}", &quoted))
                        .await
                        .map_err(|e| pg_error(OP, e))?;
                }
                // (Re)create what is missing, idempotently.
                tx.batch_execute(&SCHEMA.replace("{s}", &quoted))
                    .await
                    .map_err(|e| pg_error(OP, e))?;
                tx.execute(
                    &format!(
                        "INSERT INTO {quoted}.idem_meta (name, value) VALUES ('schema_version', $1) \
                         ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"
                    ),
                    &[&(SCHEMA_VERSION as i32)],
                )
                .await
                .map_err(|e| pg_error(OP, e))?;
            }
        }
        tx.commit().await.map_err(|e| pg_error(OP, e))
    }

    /// Runs a prepared statement on a pooled connection and returns its rows. When the
    /// connection broke under it, the connection is thrown away (never handed out again) and the
    /// statement runs once more on a new one; every statement here is safe to send twice.
    async fn query(
        &self,
        op: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let mut retried = false;
        loop {
            let client = self.client(op).await?;
            let result = match client.prepare_cached(sql).await {
                Ok(stmt) => client.query(&stmt, params).await,
                Err(e) => Err(e),
            }
            .map_err(|e| pg_error(op, e));
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

impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            const OP: &str = "claim";
            let replays = &self.inner.replays;
            if let Some(answer) = replays.get(req.tenant, &req.key, req.fingerprint, req.now) {
                return Ok(answer);
            }
            let token = FencingToken::generate();
            let params: [&(dyn ToSql + Sync); 9] = [
                &req.tenant,
                &&req.key.as_bytes()[..],
                &req.tool,
                &&req.fingerprint.as_bytes()[..],
                &(token.get() as i64),
                &db_time(req.now),
                &db_millis(req.lease),
                &db_millis(req.ttl),
                &match req.orphans {
                    Orphans::TakeOver => 0i16,
                    Orphans::Reconcile => 1,
                    Orphans::Block => 2,
                },
            ];
            let rows = self.query(OP, &self.inner.sql.claim_fast, &params).await?;
            if let Some(row) = rows.first().filter(|row| row.get::<_, i16>(0) >= 0) {
                return decode_claim(row, token, req, replays);
            }
            let rows = self.query(OP, &self.inner.sql.claim, &params).await?;
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
            let params: [&(dyn ToSql + Sync); 6] =
                [&c.tenant, &key, &token, &c.result, &expires_at, &status];
            let applied = self
                .query("complete", &self.inner.sql.complete, &params)
                .await?;
            if !applied.is_empty() {
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

    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let (key, token) = (&key.as_bytes()[..], token.get() as i64);
            let deleted = self
                .query("release", &self.inner.sql.release, &[&tenant, &key, &token])
                .await?;
            Ok(if deleted.is_empty() {
                Fenced::Lost
            } else {
                Fenced::Applied
            })
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
            let client = self.client(OP).await?;
            let version: Option<i32> = client
                .query_opt(&self.inner.sql.version, &[])
                .await
                .map_err(|e| pg_error(OP, e))?
                .map(|row| row.get(0));
            let settings = client
                .query_one(
                    "SELECT current_setting('fsync'), current_setting('synchronous_commit')",
                    &[],
                )
                .await
                .map_err(|e| pg_error(OP, e))?;
            let (fsync, commit): (String, String) = (settings.get(0), settings.get(1));
            let durable = fsync == "on" && commit != "off";
            Ok(StoreHealth {
                backend: BACKEND,
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
        })
    }
}

fn decode_claim(
    row: &Row,
    token: FencingToken,
    req: ClaimRequest<'_>,
    replays: &ReplayCache,
) -> Result<Claim, StoreError> {
    const OP: &str = "claim";
    let decision: i16 = row.get(0);
    Ok(match decision {
        0 | 1 => {
            let stored: i64 = row.get(1);
            if stored as u64 != token.get() {
                return Err(corrupt(OP, "the server answered with another token"));
            }
            Claim::Acquired {
                token,
                takeover: decision == 1,
            }
        }
        2 => Claim::Mismatch,
        3 => {
            let result: Option<Vec<u8>> = row.get(4);
            let result = result.unwrap_or_default();
            let expires_at: i64 = row.get(3);
            replays.put(
                req.tenant,
                req.key,
                req.fingerprint,
                &result,
                expires_at.max(0) as u64,
            );
            Claim::Completed { result }
        }
        4 => {
            let lease: i64 = row.get(2);
            Claim::InFlight {
                lease_expires_at: lease.max(0) as u64,
            }
        }
        5 => Claim::Unknown,
        other => return Err(corrupt(OP, &format!("unknown decision {other}"))),
    })
}

fn decode_record(row: &Row) -> Result<Record, StoreError> {
    const OP: &str = "lookup";
    let status: &str = row.get(4);
    let time = |i: usize| row.get::<_, i64>(i).max(0) as u64;
    Ok(Record {
        tenant: row.get(0),
        key: IdempotencyKey::from_bytes(bytes32(OP, row.get(1))?),
        tool: row.get(2),
        fingerprint: Fingerprint::from_bytes(bytes32(OP, row.get(3))?),
        status: RecordStatus::parse(status).ok_or_else(|| corrupt(OP, "unknown status"))?,
        token: FencingToken::from_raw(row.get::<_, i64>(5) as u64),
        lease_expires_at: time(6),
        created_at: time(7),
        expires_at: time(8),
        result: row.get(9),
        note: row.get(10),
    })
}

impl AdminStore for PostgresStore {
    fn delete<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let k = &key.as_bytes()[..];
            let deleted = self
                .query("delete", &self.inner.sql.delete, &[&tenant, &k])
                .await?;
            Ok(if deleted.is_empty() {
                Fenced::Lost
            } else {
                Fenced::Applied
            })
        })
    }

    fn server_time(&self) -> StoreFuture<'_, Option<UnixMillis>> {
        Box::pin(async move {
            let rows = self
                .query(
                    "reading the server's clock",
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                    &[],
                )
                .await?;
            Ok(rows.first().map(|r| r.get::<_, i64>(0).max(0) as u64))
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
            let fetch = i64::try_from(limit + 1).unwrap_or(i64::MAX);
            let rows = self
                .query(
                    "scan",
                    &self.inner.sql.scan,
                    &[&tenant, &after_tenant, &after_key, &fetch],
                )
                .await?;
            let records = rows
                .iter()
                .map(decode_record)
                .collect::<Result<Vec<_>, _>>()?;
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
            let (k, now) = (&key.as_bytes()[..], db_time(now));
            let changed = match resolution {
                Resolution::Complete { result } => {
                    self.query(
                        "resolve",
                        &self.inner.sql.resolve_complete,
                        &[&tenant, &k, &now, &result, &reason],
                    )
                    .await?
                }
                Resolution::Release => {
                    self.query(
                        "resolve",
                        &self.inner.sql.resolve_release,
                        &[&tenant, &k, &now],
                    )
                    .await?
                }
            };
            if !changed.is_empty() {
                return Ok(Fenced::Applied);
            }
            // Nothing changed: maybe an earlier delivery of this very resolution did it.
            let ours = match resolution {
                Resolution::Complete { result } => {
                    self.lookup(tenant, key).await?.is_some_and(|r| {
                        r.status == RecordStatus::Completed
                            && r.token == admin::RESOLVED_TOKEN
                            && r.note.as_deref() == Some(reason)
                            && r.result.as_deref() == Some(result)
                    })
                }
                Resolution::Release => false,
            };
            Ok(if ours { Fenced::Applied } else { Fenced::Lost })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_are_parsed_and_checked() {
        let o = PostgresOptions::from_url(
            "postgres://app@127.0.0.1:5432/db?schema=idem_x&pool_size=4&application_name=w1",
        )
        .unwrap();
        assert_eq!(o.schema, "idem_x");
        assert_eq!(o.pool_size, 4);
        assert_eq!(o.config.get_application_name(), Some("w1"));
        assert_eq!(
            o.config.get_connect_timeout(),
            Some(&Duration::from_secs(5))
        );
        assert!(PostgresOptions::from_url("postgres://h/db?schema=Bad-Name").is_err());
        assert!(PostgresOptions::from_url("postgres://h/db?pool_size=0").is_err());
        assert!(PostgresOptions::from_url("postgres://h/db?sslmode=require").is_err());
        assert!(PostgresOptions::from_url("postgres://h/db?no_such_option=1").is_err());
    }

    /// A claim whose answer was lost is sent again with the same token (see `query`): the
    /// plain statement leaves it to the function, which recognises the claim as its own.
    #[tokio::test]
    async fn a_claim_sent_again_is_recognised_as_its_own() {
        let Some(url) = crate::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL") else {
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

    mod conformance {
        async fn store() -> Option<super::PostgresStore> {
            let url = crate::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL")?;
            Some(
                super::PostgresStore::open_url(&url)
                    .await
                    .expect("IDEM_TEST_POSTGRES_URL names a reachable server"),
            )
        }
        crate::store_conformance_tests!(maybe: store());
        crate::admin_conformance_tests!(maybe: store());
    }
}
