//! The store of a runtime, as [`Idem::store`](crate::Idem::store) lends it.

use std::any::Any;
use std::ops::Deref;
use std::sync::Arc;

use idem_core::IdempotencyKey;
use idem_core::store::{
    BatchClaim, BatchRenewal, BatchSettlement, ChunkAppend, ChunkRead, Claim, ClaimRequest,
    Completion, Fenced, FencingToken, Record, Renewal, Store, StoreFuture, StoreHealth, StreamPage,
    UnixMillis, Watch,
};

/// The store an [`Idem`](crate::Idem) runtime calls: every [`Store`] operation (it derefs to
/// `dyn Store` and implements the trait), and what only a backend offers, found under any
/// wrapper.
#[derive(Clone)]
pub struct IdemStore(Arc<dyn Store>);

impl IdemStore {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        IdemStore(store)
    }

    /// The PostgreSQL store this is, or wraps (feature `postgres`): transactional tools
    /// (`#[idempotent(…, transactional)]`) run their transactions on its database, and a sqlx
    /// pool is handed to it (`PostgresStore::use_sqlx`). `None` for every other store.
    #[cfg(feature = "postgres")]
    pub fn postgres(&self) -> Option<&idem_postgres::PostgresStore> {
        self.0.as_any()?.downcast_ref()
    }
}

impl std::fmt::Debug for IdemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("IdemStore").field(&self.0.backend()).finish()
    }
}

impl Deref for IdemStore {
    type Target = dyn Store;

    fn deref(&self) -> &(dyn Store + 'static) {
        &*self.0
    }
}

impl Store for IdemStore {
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn expires_on_its_own(&self) -> bool {
        self.0.expires_on_its_own()
    }
    fn result_limit(&self) -> usize {
        self.0.result_limit()
    }
    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        self.0.claim(req)
    }
    fn complete<'a>(&'a self, completion: Completion<'a>) -> StoreFuture<'a, Fenced> {
        self.0.complete(completion)
    }
    fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
        self.0.claim_batch(batch)
    }
    fn settle_batch<'a>(&'a self, batch: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        self.0.settle_batch(batch)
    }
    fn renew<'a>(&'a self, renewal: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        self.0.renew(renewal)
    }
    fn renew_batch<'a>(&'a self, batch: BatchRenewal<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        self.0.renew_batch(batch)
    }
    fn append_chunks<'a>(&'a self, append: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
        self.0.append_chunks(append)
    }
    fn read_chunks<'a>(&'a self, read: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
        self.0.read_chunks(read)
    }
    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        self.0.release(tenant, key, token)
    }
    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>> {
        self.0.lookup(tenant, key)
    }
    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        self.0.purge_expired(now, limit)
    }
    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        self.0.health()
    }
    fn as_any(&self) -> Option<&(dyn Any + Send + Sync)> {
        self.0.as_any()
    }
    fn watch<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
        self.0.watch(tenant, key)
    }
}
