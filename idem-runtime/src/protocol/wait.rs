//! Waiting for the holder: a call that finds its key in flight and may wait ([`Intent::wait`])
//! watches the key and claims it again when the holder settles it, instead of answering
//! `InFlight` at once.
//!
//! | the claim again finds | the call |
//! |---|---|
//! | the key completed | replays the stored result (or the stored error) |
//! | the key free (the holder released it) or its lease lapsed | runs as the store decides: one caller takes it over, the others wait on for it |
//! | the key still in flight, the bound not reached | waits on |
//! | the key still in flight at the bound | answers `InFlight`, as a call without `wait` |
//!
//! The store's [`Watch`] wakes the caller when the key settles; it also claims again when the
//! holder's lease lapses by its clock (the store decides whether it did: only its answer lets a
//! body run) and, as a safety net for a lost notice, every [`SAFETY_POLL`]. Where the store
//! announces nothing across processes (SQLite), it polls with a backoff from [`POLL_FIRST`] to
//! [`POLL_MAX`]. Every wait is bounded: a caller never waits past its `wait`.

use std::future::poll_fn;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::{Claiming, Intent, claim};
use crate::runtime::Idem;
use crate::timer::{jitter, sleep_until};
use idem_core::StoreError;
use idem_core::store::Watch;

/// How often a caller whose store announces settlements claims again anyway, in case a notice
/// was lost.
pub const SAFETY_POLL: Duration = Duration::from_secs(1);

/// The first poll of a caller whose store does not announce settlements across processes.
pub const POLL_FIRST: Duration = Duration::from_millis(5);

/// The longest poll interval of such a caller.
pub const POLL_MAX: Duration = Duration::from_millis(100);

/// Claims `intent`'s key; while a live call holds it, waits at most [`Intent::wait`] for that
/// call to settle it (see the module docs). Store errors end the wait as they end a claim.
pub async fn claim_waiting(idem: &Idem, intent: &Intent) -> Result<Claiming, StoreError> {
    let first = claim(idem, intent).await?;
    if !matches!(first, Claiming::InFlight(_)) || intent.wait.is_zero() {
        return Ok(first);
    }
    let deadline = Instant::now() + intent.wait;
    crate::telemetry::waits(intent.tool);
    // A watch that cannot be set up is no reason to fail a call: it polls instead.
    let watch = idem
        .store()
        .watch(&intent.tenant, intent.key)
        .await
        .unwrap_or_else(|_| Watch::unannounced());
    let mut poll = POLL_FIRST;
    loop {
        // Claimed again once the watch is in place: a settlement before it is seen here, one
        // after it wakes the watch.
        let claiming = claim(idem, intent).await?;
        let Claiming::InFlight(lapses_in) = claiming else {
            return Ok(claiming);
        };
        let now = Instant::now();
        if now >= deadline {
            return Ok(claiming);
        }
        let next = if watch.announced() {
            SAFETY_POLL
        } else {
            let next = poll / 2 + jitter(poll / 2);
            poll = (poll * 2).min(POLL_MAX);
            next
        };
        // The holder's lease lapses in `lapses_in` by this caller's clock: claim then (and a
        // millisecond later, so that the store sees it lapsed).
        let wake = deadline
            .min(now + next)
            .min(now + lapses_in + Duration::from_millis(1));
        notified_or(&watch, wake).await;
    }
}

/// Completes at the watch's next notice, or at `deadline`.
async fn notified_or(watch: &Watch, deadline: Instant) {
    let mut notice = pin!(watch.notified());
    let mut timer = pin!(sleep_until(deadline));
    poll_fn(|cx| {
        if notice.as_mut().poll(cx).is_ready() || timer.as_mut().poll(cx).is_ready() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use super::claim_waiting;
    use crate::protocol::{Claiming, Intent, claim};
    use crate::runtime::Idem;
    use idem_core::fingerprint::Fingerprint;
    use idem_core::key::{KeyPart, derive_key};
    use idem_core::store::memory::MemoryStore;
    use idem_core::store::{
        Claim, ClaimRequest, Completion, Fenced, FencingToken, Orphans, Record, RecordStatus,
        Renewal, Store, StoreFuture, StoreHealth, UnixMillis,
    };
    use idem_core::{IdempotencyKey, StoreError};

    fn intent(lease_ms: u64, wait_ms: u64) -> Intent {
        Intent {
            tenant: "tenant-w".into(),
            key: derive_key("tenant-w", "wait.test", &[KeyPart::new("k").unwrap()]),
            tool: "wait.test",
            fingerprint: Fingerprint::from_bytes([1; 32]),
            lease: Duration::from_millis(lease_ms),
            ttl: Duration::from_secs(60),
            orphans: Orphans::TakeOver,
            wait: Duration::from_millis(wait_ms),
        }
    }

    #[tokio::test]
    async fn a_waiting_claim_replays_what_the_holder_completes() {
        let idem = Idem::with_store(MemoryStore::new());
        let Claiming::Acquired(holder) = claim(&idem, &intent(30_000, 0)).await.unwrap() else {
            panic!("acquired");
        };
        let waiter = tokio::spawn({
            let idem = idem.clone();
            async move { claim_waiting(&idem, &intent(30_000, 10_000)).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished(), "waits for the holder");
        let started = Instant::now();
        assert_eq!(
            holder
                .complete(RecordStatus::Completed, b"{\"ok\":1}")
                .await
                .unwrap(),
            Fenced::Applied
        );
        match waiter.await.unwrap().unwrap() {
            Claiming::Completed(bytes) => assert_eq!(bytes, b"{\"ok\":1}"),
            other => panic!("the holder's result: {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_released_key_goes_to_one_waiter_and_the_others_wait_for_it() {
        let idem = Idem::with_store(MemoryStore::new());
        let Claiming::Acquired(holder) = claim(&idem, &intent(30_000, 0)).await.unwrap() else {
            panic!("acquired");
        };
        let mut waiters: Vec<_> = (0..8)
            .map(|_| {
                let idem = idem.clone();
                tokio::spawn(async move { claim_waiting(&idem, &intent(30_000, 10_000)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(30)).await;
        holder.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (finished, waiting): (Vec<_>, Vec<_>) =
            waiters.drain(..).partition(|w| w.is_finished());
        assert_eq!(
            finished.len(),
            1,
            "one waiter holds the key, the others wait on"
        );
        let Ok(Ok(Claiming::Acquired(next))) = finished.into_iter().next().unwrap().await else {
            panic!("the key released goes to a waiter");
        };
        next.complete(RecordStatus::Completed, b"2").await.unwrap();
        for waiter in waiting {
            let answer = waiter.await.unwrap().unwrap();
            assert!(matches!(answer, Claiming::Completed(_)), "{answer:?}");
        }
    }

    #[tokio::test]
    async fn past_its_bound_a_waiting_claim_answers_in_flight() {
        let idem = Idem::with_store(MemoryStore::new());
        let Claiming::Acquired(_holder) = claim(&idem, &intent(30_000, 0)).await.unwrap() else {
            panic!("acquired");
        };
        let started = Instant::now();
        let answer = claim_waiting(&idem, &intent(30_000, 80)).await.unwrap();
        assert!(matches!(answer, Claiming::InFlight(_)), "{answer:?}");
        assert!(started.elapsed() >= Duration::from_millis(80));
    }

    #[tokio::test]
    async fn a_lapsed_holder_is_taken_over_by_a_waiter_when_its_lease_ends() {
        let idem = Idem::with_store(MemoryStore::new());
        let Claiming::Acquired(_dead) = claim(&idem, &intent(150, 0)).await.unwrap() else {
            panic!("acquired");
        };
        match claim_waiting(&idem, &intent(150, 5_000)).await.unwrap() {
            Claiming::Acquired(claimed) => assert!(claimed.takeover()),
            other => panic!("taken over once the lease lapsed: {other:?}"),
        }
    }

    /// A store that announces nothing and counts claims: the waiter polls, with a backoff.
    struct Polled {
        inner: MemoryStore,
        claims: Arc<AtomicUsize>,
    }

    impl Store for Polled {
        fn backend(&self) -> &'static str {
            "polled"
        }
        fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
            self.claims.fetch_add(1, Ordering::SeqCst);
            self.inner.claim(req)
        }
        fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
            self.inner.complete(c)
        }
        fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
            self.inner.renew(r)
        }
        fn release<'a>(
            &'a self,
            tenant: &'a str,
            key: IdempotencyKey,
            token: FencingToken,
        ) -> StoreFuture<'a, Fenced> {
            self.inner.release(tenant, key, token)
        }
        fn lookup<'a>(
            &'a self,
            tenant: &'a str,
            key: IdempotencyKey,
        ) -> StoreFuture<'a, Option<Record>> {
            self.inner.lookup(tenant, key)
        }
        fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
            self.inner.purge_expired(now, limit)
        }
        fn health(&self) -> StoreFuture<'_, StoreHealth> {
            self.inner.health()
        }
    }

    #[tokio::test]
    async fn without_notices_a_waiter_polls_with_a_bounded_backoff() {
        let claims = Arc::new(AtomicUsize::new(0));
        let idem = Idem::with_store(Polled {
            inner: MemoryStore::new(),
            claims: claims.clone(),
        });
        let Claiming::Acquired(holder) = claim(&idem, &intent(30_000, 0)).await.unwrap() else {
            panic!("acquired");
        };
        let waiter = tokio::spawn({
            let idem = idem.clone();
            async move { claim_waiting(&idem, &intent(30_000, 10_000)).await }
        });
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        holder
            .complete(RecordStatus::Completed, b"7")
            .await
            .unwrap();
        let answer: Result<Claiming, StoreError> = waiter.await.unwrap();
        assert!(matches!(answer, Ok(Claiming::Completed(_))), "{answer:?}");
        // A second at 5 ms doubling to 100 ms: a dozen claims, not two hundred.
        let polls = claims.load(Ordering::SeqCst);
        assert!((5..=25).contains(&polls), "{polls} claims");
    }
}
