//! The store's handle and what it holds: the connection, the key prefix, the scripts, the replay
//! cache, and what it knows of the server. Each role adds its methods in its own file (opening
//! in `lib.rs`, the claim and the `Store` operations, records, admin); this file holds the state
//! they share.

use std::time::Duration;

use idem_core::store::read_first::{ONE, ReadFirst};
use idem_core::store::replay_cache::ReplayCache;
use redis::Script;

use crate::connection::Connection;
use idem_core::store::listener::Listener;

/// The shared Redis [`Store`](idem_core::store::Store). Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: Connection,
    pub(crate) prefix: std::sync::Arc<str>,
    pub(crate) scripts: std::sync::Arc<Scripts>,
    pub(crate) replays: std::sync::Arc<ReplayCache>,
    /// Completed results longer than this are stored as blobs.
    pub(crate) blob_threshold: usize,
    /// Whether the server takes `SET … NX GET` (Redis 7.0 and later): then a claim tries the
    /// plain command first (see the module docs).
    pub(crate) set_nx_get: bool,
    /// Whether a claim reads its record (`GET`) before it may write one (see
    /// [`READ_FIRST_FROM`]).
    pub(crate) read_first: std::sync::Arc<ReadFirst>,
    /// What the server compares and sets on its own (see `native.rs`), probed at open.
    pub(crate) fencing: crate::native::Fencing,
    /// The values of the records this store's claims wrote, for the native fenced writes.
    pub(crate) written: std::sync::Arc<crate::native::Written>,
    pub(crate) wait: Wait,
    /// Whether the connection is encrypted, when the store made it.
    pub(crate) encrypted: Option<bool>,
    /// The settlement notices: what wakes the callers waiting for a key.
    pub(crate) notices: std::sync::Arc<Listener>,
    /// The channel the scripts announce settlements on (see `RedisStore::announcement`).
    pub(crate) channel: std::sync::Arc<str>,
}

/// From which share of claims answered without writing a claim reads first: fifteen in
/// sixteen. A read first saves a replay a few microseconds (a `GET` where the claim would send
/// the whole new record in a `SET … NX GET`) and costs a new key a round trip, so only a run
/// of retries (replays from another process, say) earns it: from one new key in sixteen, claims
/// write first again.
pub(crate) const READ_FIRST_FROM: u32 = ONE / 16 * 15;

/// The replicas a claim and a completion wait for (`wait_replicas`, `wait_timeout_ms`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) claim_batch: Script,
    pub(crate) complete: Script,
    pub(crate) compare_and_set: Script,
    pub(crate) settle_batch: Script,
    pub(crate) renew: Script,
    pub(crate) renew_batch: Script,
    pub(crate) release: Script,
    pub(crate) resolve: Script,
    pub(crate) append_chunks: Script,
    pub(crate) read_chunks: Script,
    pub(crate) lookup: Script,
    pub(crate) delete: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
