//! A store that fails on purpose: test your tools against a store that goes away.
//!
//! [`FaultyStore`] wraps any [`Store`] and, for each operation, draws from a seeded generator
//! whether to let it through, to fail it before it reaches the store (the request was lost), to
//! fail it after the store applied it (the answer was lost: the store changed, the caller hears an
//! error), to answer with a timeout, or to delay it. The same seed gives the same faults for the
//! same sequence of operations, so a failing seed can be replayed.
//!
//! ```
//! use idem_core::store::faulty::{Faults, FaultyStore};
//! use idem_core::store::memory::MemoryStore;
//!
//! let store = FaultyStore::new(MemoryStore::new(), Faults::seeded(7).fail_before(0.1).fail_after(0.1));
//! // let idem = Idem::with_store(store);
//! // idem.scope("t").run(my_tool(…)): every answer is an outcome or a documented error.
//! # drop(store);
//! ```

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{
    BatchClaim, BatchRenewal, BatchSettlement, ChunkAppend, ChunkRead, Claim, ClaimRequest,
    Completion, Fenced, FencingToken, Record, Renewal, Store, StoreFuture, StoreHealth, StreamPage,
    UnixMillis, Watch,
};
use crate::error::{StoreError, StoreErrorKind};
use crate::key::IdempotencyKey;

/// Which faults to inject, and how often (probabilities per operation, from 0 to 1).
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    seed: u64,
    fail_before: f64,
    fail_after: f64,
    timeout: f64,
    delay: f64,
    delay_for: Duration,
}

impl Faults {
    /// No faults yet, from this seed.
    pub fn seeded(seed: u64) -> Self {
        Faults {
            seed,
            fail_before: 0.0,
            fail_after: 0.0,
            timeout: 0.0,
            delay: 0.0,
            delay_for: Duration::from_millis(1),
        }
    }

    /// Fails operations before they reach the store (`StoreErrorKind::Unavailable`).
    pub fn fail_before(mut self, probability: f64) -> Self {
        self.fail_before = probability;
        self
    }

    /// Applies operations, then fails them (`StoreErrorKind::Unavailable`): the answer was lost.
    pub fn fail_after(mut self, probability: f64) -> Self {
        self.fail_after = probability;
        self
    }

    /// Answers operations with a timeout (`StoreErrorKind::Timeout`) without applying them.
    pub fn timeout(mut self, probability: f64) -> Self {
        self.timeout = probability;
        self
    }

    /// Delays operations by `by` (with tokio's timer) before letting them through.
    pub fn delay(mut self, probability: f64, by: Duration) -> Self {
        self.delay = probability;
        self.delay_for = by;
        self
    }
}

/// What happened to one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Let through untouched.
    None,
    /// Failed before the store saw it.
    FailedBefore,
    /// Applied by the store, then failed.
    FailedAfter,
    /// Answered with a timeout, not applied.
    TimedOut,
    /// Delayed, then let through.
    Delayed,
}

/// A [`Store`] that injects [`Faults`] into another.
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    faults: Faults,
    state: Mutex<u64>,
    injected: AtomicUsize,
}

impl<S: Store> FaultyStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, faults: Faults) -> Self {
        FaultyStore {
            inner,
            faults,
            state: Mutex::new(faults.seed),
            injected: AtomicUsize::new(0),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many faults (other than delays) were injected so far.
    pub fn injected(&self) -> usize {
        self.injected.load(Ordering::Relaxed)
    }

    /// The next draw in [0, 1) (splitmix64).
    fn draw(&self) -> f64 {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn next_fault(&self) -> Fault {
        let f = &self.faults;
        let mut x = self.draw();
        for (p, fault) in [
            (f.fail_before, Fault::FailedBefore),
            (f.fail_after, Fault::FailedAfter),
            (f.timeout, Fault::TimedOut),
            (f.delay, Fault::Delayed),
        ] {
            if x < p {
                if fault != Fault::Delayed {
                    self.injected.fetch_add(1, Ordering::Relaxed);
                }
                return fault;
            }
            x -= p;
        }
        Fault::None
    }

    async fn inject<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        run: StoreFuture<'a, T>,
    ) -> Result<T, StoreError> {
        let injected = |kind, when: &str| {
            StoreError::new("faulty", kind, format!("{op}: fault injected {when}"))
        };
        match self.next_fault() {
            Fault::None => run.await,
            Fault::FailedBefore => Err(injected(StoreErrorKind::Unavailable, "before the store")),
            Fault::TimedOut => Err(injected(StoreErrorKind::Timeout, "as a timeout")),
            Fault::FailedAfter => {
                let _applied = run.await;
                Err(injected(
                    StoreErrorKind::Unavailable,
                    "after the store applied it",
                ))
            }
            Fault::Delayed => {
                tokio::time::sleep(self.faults.delay_for).await;
                run.await
            }
        }
    }
}

impl<S: Store> Store for FaultyStore<S> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn result_limit(&self) -> usize {
        self.inner.result_limit()
    }

    fn expires_on_its_own(&self) -> bool {
        self.inner.expires_on_its_own()
    }

    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(self.inject("claim", self.inner.claim(req)))
    }

    fn complete<'a>(&'a self, completion: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(self.inject("complete", self.inner.complete(completion)))
    }

    /// One fault draw for the whole batch, as for one round trip.
    fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
        Box::pin(self.inject("claim", self.inner.claim_batch(batch)))
    }

    fn settle_batch<'a>(&'a self, batch: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(self.inject("complete", self.inner.settle_batch(batch)))
    }

    fn renew<'a>(&'a self, renewal: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(self.inject("renew", self.inner.renew(renewal)))
    }

    fn renew_batch<'a>(&'a self, batch: BatchRenewal<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(self.inject("renew", self.inner.renew_batch(batch)))
    }

    fn append_chunks<'a>(&'a self, append: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(self.inject("append_chunks", self.inner.append_chunks(append)))
    }

    fn read_chunks<'a>(&'a self, read: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
        Box::pin(self.inject("read_chunks", self.inner.read_chunks(read)))
    }

    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(self.inject("release", self.inner.release(tenant, key, token)))
    }

    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(self.inject("lookup", self.inner.lookup(tenant, key)))
    }

    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        Box::pin(self.inject("purge", self.inner.purge_expired(now, limit)))
    }

    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        Box::pin(self.inject("health check", self.inner.health()))
    }

    /// Forwarded without faults: a watch is a hint, and the claims after it meet the faults.
    fn watch<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
        self.inner.watch(tenant, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    #[test]
    fn the_same_seed_injects_the_same_faults() {
        let faults = Faults::seeded(42)
            .fail_before(0.2)
            .fail_after(0.2)
            .timeout(0.1);
        let draws = |seed| {
            let store = FaultyStore::new(MemoryStore::new(), Faults { seed, ..faults });
            (0..200).map(|_| store.next_fault()).collect::<Vec<_>>()
        };
        assert_eq!(draws(42), draws(42));
        assert_ne!(draws(42), draws(43));
        let faults = draws(42);
        let share = |f| faults.iter().filter(|x| **x == f).count() as f64 / 200.0;
        assert!(
            (0.1..0.3).contains(&share(Fault::FailedBefore)),
            "{}",
            share(Fault::FailedBefore)
        );
        assert!((0.1..0.3).contains(&share(Fault::FailedAfter)));
        assert!((0.03..0.2).contains(&share(Fault::TimedOut)));
    }

    #[tokio::test]
    async fn failing_after_applies_then_errs() {
        let store = FaultyStore::new(MemoryStore::new(), Faults::seeded(1).fail_after(1.0));
        let key = crate::key::derive_key("t", "tool", &[]);
        let req = ClaimRequest {
            tenant: "t",
            key,
            tool: "tool",
            fingerprint: crate::Fingerprint::from_bytes([1; 32]),
            now: 1,
            lease: Duration::from_secs(1),
            ttl: Duration::from_secs(10),
            orphans: crate::store::Orphans::TakeOver,
        };
        let err = store.claim(req).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable);
        assert!(err.to_string().contains("after the store applied it"));
        assert!(
            store.inner().lookup("t", key).await.unwrap().is_some(),
            "applied"
        );
        assert_eq!(store.injected(), 1);
    }
}
