//! Shared helpers of the integration tests: an effect ledger and stores that fail or count.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem::store::memory::MemoryStore;
use idem::store::{
    Claim, ClaimRequest, Completion, Fenced, FencingToken, Record, Renewal, Store, StoreFuture,
    StoreHealth, UnixMillis,
};
use idem::{IdempotencyKey, StoreError, StoreErrorKind};

/// How many times each intent's effect really happened, by a test-unique id.
static LEDGER: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

/// Records one effect for `id`.
pub fn effect(id: &str) {
    let mut guard = LEDGER.lock().unwrap();
    *guard
        .get_or_insert_with(HashMap::new)
        .entry(id.to_owned())
        .or_default() += 1;
}

/// How many effects `id` had.
pub fn effects(id: &str) -> usize {
    LEDGER
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(id).copied())
        .unwrap_or(0)
}

/// A test-unique id.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// A runtime on a memory store with a 30 s lease and a clock the test moves.
pub fn manual_runtime() -> (idem::Idem, idem::clock::ManualClock) {
    let clock = idem::clock::ManualClock::new(1_700_000_000_000);
    let idem = idem::Idem::builder()
        .lease(std::time::Duration::from_secs(30))
        .clock(clock.clone())
        .build(MemoryStore::new());
    (idem, clock)
}

/// A store that fails every operation, as an unreachable server would.
pub struct DownStore;

fn down() -> StoreError {
    StoreError::new("down", StoreErrorKind::Unavailable, "connection refused")
}

impl Store for DownStore {
    fn backend(&self) -> &'static str {
        "down"
    }
    fn claim<'a>(&'a self, _: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async { Err(down()) })
    }
    fn complete<'a>(&'a self, _: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async { Err(down()) })
    }
    fn renew<'a>(&'a self, _: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async { Err(down()) })
    }
    fn release<'a>(
        &'a self,
        _: &'a str,
        _: IdempotencyKey,
        _: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async { Err(down()) })
    }
    fn lookup<'a>(&'a self, _: &'a str, _: IdempotencyKey) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async { Err(down()) })
    }
    fn purge_expired(&self, _: UnixMillis, _: usize) -> StoreFuture<'_, usize> {
        Box::pin(async { Err(down()) })
    }
    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        Box::pin(async { Err(down()) })
    }
}

/// A memory store that counts the operations it is asked for, and can be told to fail
/// completions (a store that goes down while the body runs), renewals, or the next claims of tools
/// (dead-letter writes, of the retry executor, still go through).
#[derive(Default)]
pub struct CountingStore {
    pub inner: MemoryStore,
    pub operations: AtomicUsize,
    pub fail_completions: std::sync::atomic::AtomicBool,
    /// The next this many completions fail (a blip), then they pass again.
    pub fail_completions_left: AtomicUsize,
    pub fail_renewals: std::sync::atomic::AtomicBool,
    pub fail_claims: AtomicUsize,
    /// The longest result the store says it keeps (0: no limit of its own).
    pub result_limit: AtomicUsize,
}

impl CountingStore {
    pub fn count(&self) -> usize {
        self.operations.load(Ordering::SeqCst)
    }
    fn tick(&self) {
        self.operations.fetch_add(1, Ordering::SeqCst);
    }
}

impl Store for CountingStore {
    fn backend(&self) -> &'static str {
        "counting"
    }
    fn result_limit(&self) -> usize {
        match self.result_limit.load(Ordering::SeqCst) {
            0 => usize::MAX,
            limit => limit,
        }
    }
    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        self.tick();
        let failing = req.tool != idem::retry::DEAD_LETTER_TOOL
            && self
                .fail_claims
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if failing {
            return Box::pin(async { Err(down()) });
        }
        self.inner.claim(req)
    }
    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        self.tick();
        let blip = self
            .fail_completions_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if blip || self.fail_completions.load(Ordering::SeqCst) {
            return Box::pin(async { Err(down()) });
        }
        self.inner.complete(c)
    }
    fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        self.tick();
        if self.fail_renewals.load(Ordering::SeqCst) {
            return Box::pin(async { Err(down()) });
        }
        self.inner.renew(r)
    }
    fn release<'a>(
        &'a self,
        t: &'a str,
        k: IdempotencyKey,
        tok: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        self.tick();
        self.inner.release(t, k, tok)
    }
    fn lookup<'a>(&'a self, t: &'a str, k: IdempotencyKey) -> StoreFuture<'a, Option<Record>> {
        self.tick();
        self.inner.lookup(t, k)
    }
    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        self.tick();
        self.inner.purge_expired(now, limit)
    }
    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        self.tick();
        self.inner.health()
    }
}
