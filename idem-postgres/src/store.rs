//! The store's handle and what it holds: the pool, its prepared statements, the replay cache,
//! the read-first policy, and what it knows of its connections' encryption. Each role adds its
//! methods in its own file (opening and the `Store` operations in `lib.rs`, the schema, admin,
//! transactions); this file holds the state they share.

use std::time::Duration;

use deadpool_postgres::Pool;
use idem_core::store::read_first::{ONE, ReadFirst};
use idem_core::store::replay_cache::ReplayCache;

use crate::claim::Sql;
use crate::tls;
use idem_core::store::listener::Listener;

/// The shared PostgreSQL [`Store`](idem_core::store::Store). Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: std::sync::Arc<Inner>,
}

/// The share of claims answered without writing from which a claim reads first. Over a claim
/// statement, a read saves about a quarter of a round trip to a claim it answers and costs a
/// whole one to a claim it does not: it pays from about four in five.
pub(crate) const READ_FIRST_FROM: u32 = ONE / 5 * 4;

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) replays: ReplayCache,
    /// Completed results longer than this are stored as blobs.
    pub(crate) blob_threshold: usize,
    /// Whether a claim reads before it claims, as the claims lately were answered.
    pub(crate) read_first: ReadFirst,
    /// Whether connections are encrypted, as far as this store knows (see `Store::health`).
    pub(crate) encryption: Encryption,
    /// Whether statements go unnamed (see [`PostgresOptions::transaction_pooler`](crate::PostgresOptions::transaction_pooler)).
    pub(crate) transaction_pooler: bool,
    /// See [`PostgresOptions::response_timeout`](crate::PostgresOptions::response_timeout).
    pub(crate) response_timeout: Duration,
    /// The settlement notices: what wakes the callers waiting for a key.
    pub(crate) listener: Listener,
    /// The sqlx pool of transactional tools that take a sqlx connection
    /// ([`PostgresStore::use_sqlx`]).
    #[cfg(feature = "sqlx")]
    pub(crate) sqlx: std::sync::RwLock<Option<::sqlx::PgPool>>,
}

/// What the store knows of its connections' encryption.
pub(crate) enum Encryption {
    /// `sslmode=disable`.
    Never,
    /// `require` and stronger: no connection exists without TLS.
    Always,
    /// `prefer`: encrypted if the server agreed to TLS, as the connector counts.
    IfOffered(tls::Connector),
    /// A pool handed in by its owner, connected as it chose.
    Unknown,
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
