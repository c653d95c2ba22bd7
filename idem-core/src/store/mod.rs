//! Stores: where claims and results live.
//!
//! [`Store`] is the small async trait every backend implements: claim, complete, renew,
//! release, lookup, purge and a health check (and, for [`batch`]es, the claims and the
//! settlements of many keys in one round trip, item by item unless a backend does better; for
//! [`stream`]s, the chunks of a call recorded and read back). Results past a threshold are
//! stored once, as [`blob`]s. The decision of a claim is made by one function,
//! [`decide`], that every backend calls on the record it holds, inside its own atomic section,
//! so the table below is written once:
//!
//! | store holds | and | claim answers |
//! |---|---|---|
//! | nothing, or a record past its TTL | | [`Claim::Acquired`], new `in_flight` record |
//! | a record | fingerprint differs | [`Claim::Mismatch`] (checked first) |
//! | `completed` | same fingerprint | [`Claim::Completed`] with the stored result |
//! | `in_flight`, lease live | same fingerprint | [`Claim::InFlight`] |
//! | `in_flight`, lease lapsed | same fingerprint | by [`Orphans`]: [`Claim::Acquired`] with `takeover` and a new token, or marked `unknown` and [`Claim::Unknown`] |
//! | `unknown` | same fingerprint | by [`Orphans`]: taken over for the tool's state check, or [`Claim::Unknown`] |
//!
//! Completion, renewal and release are fenced: they apply only while the record still carries
//! the caller's [`FencingToken`] and is `in_flight`. A completion settles the record as
//! `completed` (its result replays) or `unknown` (the effect may have happened; the key stays
//! blocked until a state check or an operator decides).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::StoreError;
use crate::key::IdempotencyKey;

pub mod admin;
pub mod batch;
pub mod blob;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
mod decide;
pub mod faulty;
pub mod listener;
pub mod memory;
pub mod read_first;
mod record;
#[cfg(feature = "replay-cache")]
pub mod replay_cache;
pub mod stream;
#[cfg(feature = "rustls")]
pub mod tls;
pub mod watch;

pub use crate::clock::{UnixMillis, after};
pub use batch::{
    BatchClaim, BatchItem, BatchRenewal, BatchSettlement, ClaimedItem, Settle, Settlement,
};
pub use decide::{Decision, Held, decide};
pub use record::{
    Claim, ClaimRequest, Completion, Fenced, FencingToken, Orphans, Record, RecordStatus, Renewal,
    StoreHealth,
};
pub use stream::{ChunkAppend, ChunkRead, StreamPage};
pub use watch::{Watch, Watchers};

/// The future every store operation returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The core store: what every idempotent call needs, and nothing else.
///
/// Implementations must make [`Store::claim`] atomic per tenant + key and durable before they
/// answer [`Claim::Acquired`], and must pass the conformance suite
/// (the `conformance` module, behind the `conformance` feature).
pub trait Store: Send + Sync {
    /// The backend's name (`memory`, `sqlite`, …), for errors and reports.
    fn backend(&self) -> &'static str;

    /// Whether the store deletes expired records by itself (Redis key expiry), so that
    /// [`Store::purge_expired`] has nothing to do.
    fn expires_on_its_own(&self) -> bool {
        false
    }

    /// The longest result the store can keep, in bytes (`usize::MAX`, the default: no limit of
    /// its own). The runtime keeps no result longer than this, whatever its own limit: a longer
    /// one is refused with a clear error, never stored truncated.
    fn result_limit(&self) -> usize {
        usize::MAX
    }

    /// Claims a key (see the module docs for the decision table).
    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim>;

    /// Stores the result of a claimed key, if the token still owns it.
    fn complete<'a>(&'a self, completion: Completion<'a>) -> StoreFuture<'a, Fenced>;

    /// Claims every item of a batch (see [`batch`]): one answer per item, in order, each as
    /// [`Store::claim`] of that item alone would answer. The default claims them one by one;
    /// a backend answers in one round trip.
    fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
        Box::pin(batch::claim_each(self, batch))
    }

    /// Completes or releases every item of a batch, each fenced by its own token: one answer
    /// per item, in order. The default settles them one by one; a backend answers in one round
    /// trip.
    fn settle_batch<'a>(&'a self, batch: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(batch::settle_each(self, batch))
    }

    /// Extends the lease of a claimed `in_flight` record, if the token still owns it: the lease
    /// lapses at `now + lease`, and the record expires no earlier than that.
    fn renew<'a>(&'a self, renewal: Renewal<'a>) -> StoreFuture<'a, Fenced>;

    /// Renews the leases of a batch's items, each fenced by its own token: one answer per
    /// item, in order, each as [`Store::renew`] of that item would answer. The default renews
    /// them one by one; a backend answers in one round trip.
    fn renew_batch<'a>(&'a self, batch: BatchRenewal<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(batch::renew_each(self, batch))
    }

    /// Appends chunks to the stream of a claimed `in_flight` key, if the token still owns it
    /// (see [`stream`]). The default answers [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported).
    fn append_chunks<'a>(&'a self, append: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
        let _ = append;
        let error = stream::unsupported(self, "append_chunks");
        Box::pin(async move { Err(error) })
    }

    /// Reads a key's record and chunks of its stream, in one atomic read (see [`stream`]). The
    /// default answers [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported).
    fn read_chunks<'a>(&'a self, read: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
        let _ = read;
        let error = stream::unsupported(self, "read_chunks");
        Box::pin(async move { Err(error) })
    }

    /// Deletes a claimed record, if the token still owns it, so the key is new again.
    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced>;

    /// Reads the record of a key, expired or not.
    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>>;

    /// Deletes at most `limit` records that expired at or before `now`; returns how many.
    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize>;

    /// Checks that the store answers and its schema is the one this build writes.
    fn health(&self) -> StoreFuture<'_, StoreHealth>;

    /// Watches `key` for its settlement (see [`watch`]): the answer comes once the watch is in
    /// place, so a settlement after it wakes the watch, and a claim made after it sees any
    /// settlement before. The default announces nothing: the caller polls.
    fn watch<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
        let _ = (tenant, key);
        Box::pin(async { Ok(Watch::unannounced()) })
    }

    /// The backend's own store under any wrappers, for what only that backend can do: the
    /// runtime finds the Postgres store of transactional tools by it. `None` (the default) for
    /// a store that offers nothing of its own; a backend answers `Some(self)`, and a wrapper
    /// forwards its inner store's answer.
    fn as_any(&self) -> Option<&(dyn Any + Send + Sync)> {
        None
    }
}

macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        impl<S: Store + ?Sized> Store for $ty {
            fn backend(&self) -> &'static str {
                (**self).backend()
            }
            fn expires_on_its_own(&self) -> bool {
                (**self).expires_on_its_own()
            }
            fn result_limit(&self) -> usize {
                (**self).result_limit()
            }
            fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
                (**self).claim(req)
            }
            fn complete<'a>(&'a self, completion: Completion<'a>) -> StoreFuture<'a, Fenced> {
                (**self).complete(completion)
            }
            fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
                (**self).claim_batch(batch)
            }
            fn settle_batch<'a>(
                &'a self,
                batch: BatchSettlement<'a>,
            ) -> StoreFuture<'a, Vec<Fenced>> {
                (**self).settle_batch(batch)
            }
            fn renew<'a>(&'a self, renewal: Renewal<'a>) -> StoreFuture<'a, Fenced> {
                (**self).renew(renewal)
            }
            fn renew_batch<'a>(&'a self, batch: BatchRenewal<'a>) -> StoreFuture<'a, Vec<Fenced>> {
                (**self).renew_batch(batch)
            }
            fn append_chunks<'a>(&'a self, append: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
                (**self).append_chunks(append)
            }
            fn read_chunks<'a>(
                &'a self,
                read: ChunkRead<'a>,
            ) -> StoreFuture<'a, Option<StreamPage>> {
                (**self).read_chunks(read)
            }
            fn release<'a>(
                &'a self,
                tenant: &'a str,
                key: IdempotencyKey,
                token: FencingToken,
            ) -> StoreFuture<'a, Fenced> {
                (**self).release(tenant, key, token)
            }
            fn lookup<'a>(
                &'a self,
                tenant: &'a str,
                key: IdempotencyKey,
            ) -> StoreFuture<'a, Option<Record>> {
                (**self).lookup(tenant, key)
            }
            fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
                (**self).purge_expired(now, limit)
            }
            fn health(&self) -> StoreFuture<'_, StoreHealth> {
                (**self).health()
            }
            fn watch<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
                (**self).watch(tenant, key)
            }
            fn as_any(&self) -> Option<&(dyn Any + Send + Sync)> {
                (**self).as_any()
            }
        }
    )*};
}

forward_store!(&S, Arc<S>, Box<S>);
