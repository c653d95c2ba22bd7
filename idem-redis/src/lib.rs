//! The shared Redis store: records that expire on their own.
//!
//! `Idem::open("redis://127.0.0.1:6379/0")` connects. What it guarantees:
//!
//! - **One round trip per common claim and per completion.** The common claims are one plain command,
//!   `SET … NX PX … GET` (Redis 7.0 and later): it writes a new key's record, or hands back the
//!   record that is there, from which the replay, the mismatch, the live in-flight call and the
//!   blocked `unknown` record are read without writing. What needs a write on an existing record
//!   (an expired record, a lapsed lease, an orphan to mark `unknown`) and every claim on a server
//!   before 7.0 is a Lua script, which Redis runs atomically: the decision table of [`decide`](idem_core::store::decide)
//!   (after the plain command, that is a second round trip, taken only by orphans and records
//!   the caller's clock holds expired). While nearly every claim lately found its key settled
//!   (fifteen in sixteen: retries replaying), a claim reads first with a plain `GET`, which
//!   answers a replay with a shorter request and a lighter command; a new key found then takes
//!   the `SET` as a second round trip.
//! - **Fenced writes at the server's own speed where it can.** On a server that compares and
//!   sets natively (`SET … IFEQ`: Valkey 8.1 and later, Redis 8.4 and later; `DELIFEQ`: Valkey
//!   9), the completion, the renewal of a lease and the release of a new key's claim are that one
//!   command, comparing the whole record with the value the claim wrote (its token among it);
//!   elsewhere a four-line script does the same compare-and-set; a claim taken over, a batch, a
//!   stream or a result kept as a blob settle by the full scripts (a token check, the write,
//!   and the upkeep of the stream and the blobs). A probe at open chooses (never the server's
//!   name: Valkey reports `redis_version:7.2.4`); `fencing=script` keeps the scripts; the health
//!   check and `idem doctor` say which is used (see `native.rs`).
//! - **Records expire on their own.** Each record is one string (see the layout below) with a
//!   Redis expiry equal to its TTL (from the claim, then from the completion); nothing needs
//!   purging.
//! - **Redis Cluster.** A record lives at `PREFIX:{TENANT}:KEY` where `TENANT` is the tenant in
//!   hexadecimal: the braces are a hash tag, so all of a tenant's records hash to one slot, and
//!   each script touches one key (a batch's script, keys of one tenant: one slot).
//!   `redis+cluster://HOST:PORT[,HOST:PORT…]` connects to a cluster (redis-rs routes every
//!   command by its key and follows failovers). Replication is
//!   asynchronous: `wait_replicas=N` makes each claim and completion wait for `N` replicas
//!   (Redis `WAIT`) and read the record back before the body runs (see [`RedisOptions`]).
//! - **TLS** with `rediss://` (rustls): the server's certificate must chain to the system's
//!   roots or to `tls_ca=PATH`, and name the host; `tls_cert` and `tls_key` present a client
//!   certificate. A connection you built yourself: [`RedisStore::from_connection_manager`],
//!   [`RedisStore::from_cluster`].
//! - **Connection loss is survivable.** One multiplexed connection, replaced when it breaks,
//!   when a reply does not come within `timeout_ms`, or when a reply comes back out of order
//!   (every request is tagged, see `connection.rs`): a lost reply never becomes another
//!   request's answer. An operation whose connection failed before the answer is sent again
//!   once, on a new connection, and each script recognises its own token, so sending it twice is
//!   harmless. A store operation therefore ends within two connection timeouts and two response
//!   timeouts (`2 × 2 × timeout_ms`). The connections the store opens set `TCP_NODELAY`, so that
//!   a request is sent as soon as it is written, even while others await their replies.
//!
//! **Durability depends on the server.** Redis answers a write before it reaches the disk. With
//! `appendonly no` (the default of many installations) a restart of Redis forgets every claim,
//! and a retry after it runs the body again; with `appendonly yes` and `appendfsync everysec` a
//! crash of the server may forget the last second. Only `appendfsync always` makes a claim
//! durable before the body runs. [`StoreHealth`](idem_core::store::StoreHealth) says which you have, and the startup audit
//! warns when claims do not survive a restart.
//!
//! **The record** is one string, so that a claim is one `GET` and one `SET … PX` inside the
//! script (measured here: 0.83× the speed of a bare `SET` server-side, against 0.65× for a hash
//! of fields). Its layout, with fixed-width decimal numbers (zero-padded; times in milliseconds,
//! below 2^53 so that Lua compares them exactly):
//!
//! | bytes (1-based) | field |
//! |---|---|
//! | 1–32 | fingerprint |
//! | 33 | status: `i` in flight, `c` completed, `u` unknown, `b` completed with its result in a blob |
//! | 34–49 | expires at (16 digits) |
//! | 50–65 | lease expires at (16 digits) |
//! | 66–81 | created at (16 digits) |
//! | 82–100 | fencing token (19 digits) |
//! | 101–104 | length of the tool name (4 digits), then the tool name |
//! | the rest | the stored result (completed records), or the SHA-256 of its blob in hex (`b`) |
//!
//! Layout version 2 added the status `u`, 3 the status `b` and the blobs. A prefix of an older
//! version is marked current when this build opens it (the records are unchanged); stop the
//! older workers first, since they would take an `unknown` record for an orphan, or a `b` one
//! for a corrupt one.
//!
//! URL: `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?option=value&…]` with `prefix` (letters,
//! digits, `_`, `-`, `.`; default `idem`), `timeout_ms` (connect and response timeout, default
//! 5000), `replay_cache` (KiB, default 1024, 0 turns it off), `blob_threshold` (bytes, default
//! 65536, or `off`: results longer are kept once per tenant, at `PREFIX:{TENANT}:blob:SHA256`,
//! each living as long as the longest-lived record that names it) and the others [`RedisOptions`]
//! lists (replicas to wait for, the fencing, TLS files); `rediss://` for TLS,
//! `redis+cluster://` for a cluster.

use redis::AsyncConnectionConfig;
use redis::aio::ConnectionManager;
use redis::{RedisError, Script};

use idem_core::key::IdempotencyKey;
use idem_core::store::FencingToken;
use idem_core::store::read_first::ReadFirst;
use idem_core::store::replay_cache::ReplayCache;
use idem_core::{StoreError, StoreErrorKind};

mod admin;
mod claim;
mod connection;
mod driver;
mod layout;
mod native;
mod notices;
mod options;
mod record;
mod scripts;
mod store;

/// The Redis client crate of [`RedisStore::from_connection_manager`] and
/// [`RedisStore::from_cluster`], re-exported so that your connection and idem's name the same
/// version.
pub use redis;

pub use self::options::RedisOptions;
pub use self::store::RedisStore;

use self::driver::{BACKEND, again_if_broken, corrupt, redis_error, token_arg};
use self::store::{Scripts, Wait};
use idem_core::store::listener::Listener;

use self::connection::Connection;
pub use self::record::SCHEMA_VERSION;

use self::admin::RESOLVE;
use self::scripts::{
    APPEND_CHUNKS, CLAIM, CLAIM_BATCH, COMPARE_AND_SET, COMPLETE, DELETE, LOOKUP, READ_CHUNKS,
    RELEASE, RENEW, RENEW_BATCH, SETTLE_BATCH,
};

/// The longest result this store keeps: Redis keeps values of up to `proto-max-bulk-len` (512
/// MiB unless the server says otherwise), and a record adds its header and tool name.
pub const MAX_VALUE_BYTES: usize = (512 << 20) - (64 << 10);

inventory::submit! {
    idem_core::store::admin::Driver::new(
        &["redis", "rediss", "redis+cluster", "rediss+cluster"],
        "redis://…, rediss://…, redis+cluster://…",
        |url| Box::pin(open_url(url)),
    )
}

/// Opens `redis://…` and its TLS and cluster forms (the driver of `Idem::open`).
async fn open_url(url: &str) -> idem_core::store::admin::Opened {
    let options = RedisOptions::from_url(url)
        .map_err(|reason| idem_core::store::admin::invalid_url(url, reason))?;
    Ok(std::sync::Arc::new(RedisStore::open(options).await?))
}

impl RedisStore {
    /// Connects (to one server, or to a cluster) and checks the layout version.
    pub async fn open(options: RedisOptions) -> Result<Self, StoreError> {
        const OP: &str = "opening the store";
        let certificates = certificates(&options)?;
        if options.tls() {
            // redis-rs builds its TLS configuration on rustls' process-wide provider: make it
            // ring (ours) unless the process already chose one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let malformed = |e| {
            StoreError::with_source(
                BACKEND,
                StoreErrorKind::Other,
                "malformed connection URL",
                e,
            )
        };
        let mut subscriber = None;
        let conn = if options.cluster {
            let mut builder = redis::cluster::ClusterClient::builder(options.nodes.clone())
                .tcp_settings(connection::tcp_settings())
                .connection_timeout(options.timeout)
                .response_timeout(options.timeout)
                .retries(4);
            if let Some(certificates) = certificates {
                builder = builder.certs(certificates);
            }
            let client = builder.build().map_err(malformed)?;
            Connection::to_cluster(client).await
        } else {
            let server = connection::server_info(&options.nodes[0]).map_err(malformed)?;
            let client = match certificates {
                Some(certificates) => redis::Client::build_with_tls(server, certificates),
                None => redis::Client::open(server),
            }
            .map_err(malformed)?;
            subscriber = Some((client.clone(), options.timeout));
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(options.timeout))
                .set_response_timeout(Some(options.timeout));
            Connection::to_server(client, config).await
        }
        .map_err(|e| first_connection_error(OP, e, options.tls()))?;
        Self::over(conn, &options, Some(options.tls()), subscriber).await
    }

    /// A store over a connection manager you already have (its server, TLS, timeouts and
    /// retries are yours): the layout version is checked exactly as [`RedisStore::open`] does.
    /// Of `options`, the prefix, the replay cache and the replica wait apply. Build the
    /// connection with the [`redis`](mod@redis) crate this module re-exports, so that both name
    /// the same version.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_redis::{RedisOptions, RedisStore, redis};
    ///
    /// let client = redis::Client::open("redis://cache.internal:6379/")?;
    /// let manager = redis::aio::ConnectionManager::new(client).await?;
    /// let options = RedisOptions::from_url("redis://cache.internal:6379/?prefix=agents")?;
    /// let store = RedisStore::from_connection_manager(manager, &options).await?;
    /// // let idem = idem::Idem::with_store(store);
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn from_connection_manager(
        conn: ConnectionManager,
        options: &RedisOptions,
    ) -> Result<Self, StoreError> {
        Self::over(Connection::given_manager(conn), options, None, None).await
    }

    /// A store over a Redis Cluster connection you already have, as
    /// [`RedisStore::from_connection_manager`].
    pub async fn from_cluster(
        conn: redis::cluster_async::ClusterConnection,
        options: &RedisOptions,
    ) -> Result<Self, StoreError> {
        Self::over(Connection::given_cluster(conn), options, None, None).await
    }

    async fn over(
        conn: Connection,
        options: &RedisOptions,
        encrypted: Option<bool>,
        subscriber: Option<(redis::Client, std::time::Duration)>,
    ) -> Result<Self, StoreError> {
        const OP: &str = "opening the store";
        // INFO may be forbidden (managed services): then every claim is the script.
        let server: Option<String> = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn.clone())
            .await
            .ok();
        let fencing = if options.script_fencing {
            native::Fencing::default()
        } else {
            native::probe(&conn, &options.prefix).await
        };
        let store = RedisStore {
            conn,
            prefix: options.prefix.as_str().into(),
            scripts: std::sync::Arc::new(scripts()),
            replays: std::sync::Arc::new(ReplayCache::new(options.replay_cache)),
            blob_threshold: options.blob_threshold,
            set_nx_get: server.as_deref().is_some_and(takes_set_nx_get),
            read_first: std::sync::Arc::new(ReadFirst::new(store::READ_FIRST_FROM)),
            fencing,
            written: std::sync::Arc::default(),
            wait: Wait {
                replicas: options.wait_replicas,
                timeout: options.wait_timeout,
            },
            encrypted,
            channel: notices::channel(&options.prefix).into(),
            notices: std::sync::Arc::new(Listener::new(subscriber.map(|(client, timeout)| {
                (
                    notices::subscribe(client, notices::channel(&options.prefix)),
                    timeout,
                )
            }))),
        };
        let found = store.layout_version(OP).await?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Schema,
                format!(
                    "the prefix `{}` was written by a newer idem (layout version {found}); this \
                     build understands up to {SCHEMA_VERSION}: upgrade idem, or use another `?prefix=`",
                    store.prefix
                ),
            ));
        }
        // New, or version 1 (the same records, one status fewer): mark it as this build's.
        let _: i64 = redis::cmd("HSET")
            .arg(store.meta_key())
            .arg("schema_version")
            .arg(SCHEMA_VERSION)
            .query_async(&mut store.conn.clone())
            .await
            .map_err(|e| redis_error(OP, e))?;
        Ok(store)
    }

    /// Parses `url` and opens the store.
    pub async fn open_url(url: &str) -> Result<Self, StoreError> {
        let options = RedisOptions::from_url(url)
            .map_err(|reason| StoreError::new(BACKEND, StoreErrorKind::Other, reason))?;
        Self::open(options).await
    }

    /// Waits until the replicas the options ask for (`wait_replicas`) hold the write of the
    /// record of `tenant` and `key` that `token` made (Redis `WAIT`, sent to the record's
    /// primary); fewer within `wait_timeout` is an error. `settled`: the write was a completion
    /// (else a claim). Without replicas to wait for, nothing is sent (nor the record's key
    /// formatted).
    ///
    /// `WAIT` counts the writes of the connection it is sent on. If the primary failed over
    /// between the write and the `WAIT`, the client sends the `WAIT` to the new primary, where
    /// this connection wrote nothing: it would pass at once, for a write that was lost. So the
    /// record is read back after the `WAIT`: the write must be there.
    async fn replicated(
        &self,
        op: &str,
        tenant: &str,
        key: &IdempotencyKey,
        token: FencingToken,
        settled: bool,
    ) -> Result<(), StoreError> {
        if self.wait.replicas == 0 {
            return Ok(());
        }
        let key = &self.record_key(tenant, key);
        let mut conn = self.conn.clone();
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.wait.replicas)
            .arg(u64::try_from(self.wait.timeout.as_millis()).unwrap_or(u64::MAX));
        let acked = conn
            .on_primary_of(key, &wait)
            .await
            .map_err(|e| redis_error(op, e))?;
        let acked: i64 = redis::from_redis_value(acked)
            .map_err(|_| corrupt(op, "WAIT answered something other than a number"))?;
        if acked < i64::from(self.wait.replicas) {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Unavailable,
                format!(
                    "{op}: {acked} of the {} replicas asked for acknowledged the write within {} ms \
                     (`wait_replicas`)",
                    self.wait.replicas,
                    self.wait.timeout.as_millis()
                ),
            ));
        }
        let record: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_error(op, e))?;
        let token = token_arg(token);
        let there = record.is_some_and(|v| {
            let status = v.get(record::layout::STATUS).copied();
            v.get(record::layout::TOKEN) == Some(token.as_bytes())
                && (status == Some(b'i')) != settled
        });
        if !there {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Unavailable,
                format!("{op}: the write was lost in a failover before a replica held it"),
            ));
        }
        Ok(())
    }

    /// Runs a batch's `script` over the records of `keys` of `tenant` (one slot: a tenant's
    /// records share its hash tag) with `args`: one answer per key, in order.
    async fn invoke_each<'k, T: redis::FromRedisValue>(
        &self,
        op: &str,
        script: &Script,
        tenant: &str,
        keys: impl Iterator<Item = &'k IdempotencyKey>,
        args: &[&[u8]],
    ) -> Result<Vec<T>, StoreError> {
        let records: Vec<String> = keys.map(|key| self.record_key(tenant, key)).collect();
        let names: Vec<&str> = records.iter().map(String::as_str).collect();
        let answers: Vec<T> = self.invoke(op, script, &names, args).await?;
        if answers.len() != records.len() {
            return Err(corrupt(
                op,
                "the batch's script answered another number of keys",
            ));
        }
        Ok(answers)
    }

    /// Runs a script, once more when the connection broke under it (each script is written so
    /// that a second delivery is harmless).
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        op: &str,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let invocation = &invocation;
        again_if_broken(op, || {
            let mut conn = self.conn.clone();
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await
    }
}

/// The store's scripts, loaded by the server at their first use.
fn scripts() -> Scripts {
    Scripts {
        claim: Script::new(CLAIM),
        claim_batch: Script::new(CLAIM_BATCH),
        complete: Script::new(COMPLETE),
        compare_and_set: Script::new(COMPARE_AND_SET),
        settle_batch: Script::new(SETTLE_BATCH),
        renew: Script::new(RENEW),
        renew_batch: Script::new(RENEW_BATCH),
        release: Script::new(RELEASE),
        resolve: Script::new(RESOLVE),
        append_chunks: Script::new(APPEND_CHUNKS),
        read_chunks: Script::new(READ_CHUNKS),
        lookup: Script::new(LOOKUP),
        delete: Script::new(DELETE),
    }
}

/// The error of a first connection that the server dropped at once: on a plain `redis://`
/// connection, most likely a server that takes only TLS.
fn first_connection_error(op: &str, e: RedisError, tls: bool) -> StoreError {
    let dropped = (e.is_connection_dropped() || e.is_io_error())
        && !e.is_connection_refusal()
        && !e.is_timeout();
    if !tls && dropped && idem_core::store::tls::tls_failure(&e).is_none() {
        return StoreError::with_source(
            BACKEND,
            StoreErrorKind::Unavailable,
            format!(
                "{op}: the server dropped the connection at once: if it takes only TLS, use \
                 rediss://"
            ),
            e,
        );
    }
    redis_error(op, e)
}

/// The TLS files of `options`, read now: an unreadable file is an error at open.
fn certificates(options: &RedisOptions) -> Result<Option<redis::TlsCertificates>, StoreError> {
    let read = |option: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            StoreError::new(
                BACKEND,
                StoreErrorKind::Other,
                format!("`{option}` {}: {e}", path.display()),
            )
        })
    };
    if options.tls_ca.is_none() && options.tls_client.is_none() {
        return Ok(None);
    }
    let root_cert = options
        .tls_ca
        .as_deref()
        .map(|path| read("tls_ca", path))
        .transpose()?;
    let client_tls = match &options.tls_client {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read("tls_cert", cert)?,
            client_key: read("tls_key", key)?,
        }),
        None => None,
    };
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// Whether `INFO server` names a server that takes `SET … NX … GET` (Redis 7.0 and later;
/// Valkey reports the Redis version it is compatible with).
fn takes_set_nx_get(info: &str) -> bool {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))
        .and_then(|version| version.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 7)
}

#[cfg(test)]
mod tests;
