//! Recording what ran: once a body has returned, its result is in memory and its effect has
//! happened, so a completion that meets a store error (a reset, a timeout, a failover, a
//! restart) is tried again rather than given up at once.
//!
//! | an attempt answers | then |
//! |---|---|
//! | applied | recorded: the call answers `Fresh` (a retried one counts as landed late) |
//! | fenced out, at the first attempt | another claim owns the key: `LeaseLost` |
//! | fenced out, after an attempt that failed | the failed attempt may have landed with its answer lost: the record is read (again through store errors, while the window lasts), and if it holds this claim's token, status and result, it was this completion; if it holds anything else, `LeaseLost`; if it cannot be read, `CompletionFailed` |
//! | a store error that may pass (unavailable, timeout, an answer that could not be read, other) | tried again after a backoff, while the window lasts |
//! | a store error that will not pass (a schema this build cannot write to, a store shutting down) | given up: `CompletionFailed` |
//!
//! The window is the tool's lease (or [`IdemBuilder::completion_retry`](crate::IdemBuilder::completion_retry),
//! never longer than the lease), counted from the first failed attempt; every attempt is cut
//! off at its end, so no call waits longer than the window past its first failure. Renewals
//! go on meanwhile (the loop runs under [`Claimed::hold`]), and the retries stop as soon as the
//! store refuses one: another caller took the key over. They go on past the moment the lease
//! the store last confirmed lapses by this caller's clock: a completion is fenced by its
//! token, so it lands only while no other claim has taken the key over, and is refused after.
//! An outage shorter than the window is ridden out unless another caller took the key over in
//! the meantime (which the store allows only once the lease has lapsed there).
//!
//! The backoff starts at 20 ms and doubles, each wait half fixed and half random (so that the
//! completions an outage held back do not reach the store in one burst), up to an eighth of the
//! window and at most 500 ms. An attempt that hangs does not hold the next one back: the next
//! starts beside it when its wait is over, up to eight in flight, none dropped before the
//! store's own timeout ends it (which is how a store finds a dead connection and replaces it).

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::Claimed;
use idem_core::store::{Fenced, RecordStatus, StoreFuture};
use idem_core::{StoreError, StoreErrorKind};

/// The first wait before a completion is tried again.
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// The longest wait between two attempts, whatever the window.
const LONGEST_BACKOFF: Duration = Duration::from_millis(500);
/// The most attempts in flight at once (a store that hangs holds them until its timeout).
const MOST_IN_FLIGHT: usize = 8;

/// How a completion ([`Claimed::complete_retrying`]) ended, and how hard it was.
#[derive(Debug)]
#[non_exhaustive]
pub struct Recorded {
    /// What the store answered last: applied (now or by an attempt whose answer was lost),
    /// fenced out (another claim owns the key), or the error it was given up on.
    pub answer: Result<Fenced, StoreError>,
    /// The attempts after the first.
    pub retries: u32,
}

/// Whether a store error may pass if the same write is sent again: all but a schema this build
/// cannot write to and a store that is shutting down. (An answer that could not be read, which
/// a cut or garbled reply gives, may pass; a record that is not laid out as this build writes it
/// fences the completion out rather than failing it.)
pub(super) fn may_pass(error: &StoreError) -> bool {
    !matches!(
        error.kind(),
        StoreErrorKind::Schema | StoreErrorKind::Closed | StoreErrorKind::Unsupported
    )
}

/// The waits between attempts: `FIRST_BACKOFF`, doubling, up to `ceiling`.
pub(super) fn backoff(retry: u32, ceiling: Duration) -> Duration {
    let full = FIRST_BACKOFF
        .saturating_mul(1 << retry.min(16))
        .min(ceiling);
    full / 2 + crate::timer::jitter(full / 2)
}

/// The longest wait between two attempts within `window`.
pub(super) fn ceiling(window: Duration) -> Duration {
    (window / 8).clamp(Duration::from_millis(1), LONGEST_BACKOFF)
}

/// Runs `step` until `deadline`: `None` if the deadline came first.
async fn until<F: Future>(deadline: Instant, step: F) -> Option<F::Output> {
    let mut step = pin!(step);
    let mut timer = pin!(crate::timer::sleep_until(deadline));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = step.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

impl Claimed {
    /// Records the key as `status` with `result`, trying again through store errors for at
    /// most the completion window after the first failure (see the module docs), the lease
    /// renewed meanwhile; reports the retries, and the completions that landed late or not at
    /// all, in the tool's metrics.
    pub async fn complete_retrying(&self, status: RecordStatus, result: &[u8]) -> Recorded {
        let first = self.complete(status, result).await;
        let recorded = match first {
            Err(error) if may_pass(&error) => {
                let window = self.idem.completion_retry(self.lease);
                let deadline = Instant::now() + window;
                // Boxed: the retries and the lease held meanwhile are a future of kilobytes,
                // which every completion's future would otherwise carry (and copy).
                Box::pin(self.hold(self.retry_completion(status, result, error, deadline))).await
            }
            answer => Recorded { answer, retries: 0 },
        };
        let lost = match recorded.answer {
            Ok(Fenced::Applied) => false,
            // Fenced out at once: another claim owned the key; the store never failed.
            Ok(Fenced::Lost) => recorded.retries > 0,
            Err(_) => true,
        };
        if recorded.retries > 0 || lost {
            crate::telemetry::completion(self.tool, recorded.retries, lost);
        }
        recorded
    }

    /// The attempts after the first failed one, until one is answered, the store refuses a
    /// renewal, or `deadline`.
    ///
    /// An attempt that hangs (a reply swallowed, a server stalled) does not hold the next one
    /// back: when the backoff is over a new attempt starts beside it, up to
    /// [`MOST_IN_FLIGHT`]. None is dropped before it ends (the store's own timeout ends it, and
    /// replaces the connection it hung on) or the window closes. Sent twice, a completion is
    /// still fenced by its token, and the store or [`Claimed::landed`] recognises its own.
    async fn retry_completion(
        &self,
        status: RecordStatus,
        result: &[u8],
        mut error: StoreError,
        deadline: Instant,
    ) -> Recorded {
        let ceiling = ceiling(deadline.saturating_duration_since(Instant::now()));
        let mut retries = 0;
        let mut next = Instant::now() + backoff(0, ceiling);
        let mut in_flight: Vec<StoreFuture<'_, Fenced>> = Vec::new();
        let answer = loop {
            if self.lease_state.is_refused() {
                // A renewal was refused: another claim owns the key, unless one of the
                // attempts landed with its answer lost (the renewal then finds a completed
                // record).
                break self.confirm(status, result, error, deadline).await;
            }
            let mut timer = pin!(crate::timer::sleep_until(next.min(deadline)));
            let event = std::future::poll_fn(|cx| {
                for (i, attempt) in in_flight.iter_mut().enumerate() {
                    if let Poll::Ready(answer) = attempt.as_mut().poll(cx) {
                        drop(in_flight.swap_remove(i));
                        return Poll::Ready(Some(answer));
                    }
                }
                timer.as_mut().poll(cx).map(|()| None)
            })
            .await;
            match event {
                Some(Ok(Fenced::Applied)) => break Ok(Fenced::Applied),
                Some(Ok(Fenced::Lost)) => {
                    break self.confirm(status, result, error, deadline).await;
                }
                Some(Err(e)) if may_pass(&e) => error = e,
                Some(Err(e)) => break Err(e),
                None if Instant::now() >= deadline => break Err(error),
                None if in_flight.len() >= MOST_IN_FLIGHT => next = Instant::now() + ceiling,
                None => {
                    retries += 1;
                    in_flight.push(self.completion(status, result));
                    next = Instant::now() + backoff(retries, ceiling);
                }
            }
        };
        Recorded { answer, retries }
    }

    /// Reads the record, trying again through store errors until `deadline`, to learn whether
    /// an attempt landed: applied if the record holds this completion, fenced out if it holds
    /// anything else; `error` (not confirmed) if the store never answered.
    async fn confirm(
        &self,
        status: RecordStatus,
        result: &[u8],
        mut error: StoreError,
        deadline: Instant,
    ) -> Result<Fenced, StoreError> {
        let ceiling = ceiling(deadline.saturating_duration_since(Instant::now()));
        for retry in 0.. {
            match until(deadline, self.landed(status, result)).await {
                Some(Ok(true)) => return Ok(Fenced::Applied),
                Some(Ok(false)) => return Ok(Fenced::Lost),
                Some(Err(e)) if may_pass(&e) => error = e,
                Some(Err(e)) => return Err(e),
                None => return Err(error),
            }
            let wait = backoff(retry, ceiling);
            if Instant::now() + wait >= deadline {
                break;
            }
            crate::timer::sleep(wait).await;
        }
        Err(error)
    }

    /// Whether the record holds this claim's completion: its token, `status` and `result`.
    async fn landed(&self, status: RecordStatus, result: &[u8]) -> Result<bool, StoreError> {
        let record = self.idem.store().lookup(&self.tenant, self.key).await?;
        Ok(record.is_some_and(|r| {
            r.token == self.token
                && r.status == status
                && r.result.as_deref().unwrap_or_default() == result
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use super::{LONGEST_BACKOFF, backoff, ceiling};
    use crate::protocol::call::{KeyParts, NoCheck, run};
    use crate::protocol::policy::ReleaseErrors;
    use crate::registry::ToolInfo;
    use crate::runtime::Idem;
    use idem_core::key::{IdempotencyKey, KeyPart};
    use idem_core::store::memory::MemoryStore;
    use idem_core::store::{
        Claim, ClaimRequest, Completion, Fenced, FencingToken, Record, Renewal, Store, StoreFuture,
        StoreHealth, UnixMillis,
    };
    use idem_core::{Error, Outcome, StoreError, StoreErrorKind};

    /// What the store does to the next completions and renewals.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Blip {
        /// Lets them through.
        None,
        /// Fails this many completions (not applied) with this kind of error; renewals fail
        /// while they do.
        Fail(usize, StoreErrorKind),
        /// Applies the next completion, then fails it: its answer is lost.
        LoseAnswer,
    }

    /// A memory store whose completions blip as told.
    struct Blipping {
        inner: MemoryStore,
        blip: Mutex<Blip>,
        completions: AtomicUsize,
    }

    impl Blipping {
        fn new(blip: Blip) -> Self {
            Blipping {
                inner: MemoryStore::new(),
                blip: Mutex::new(blip),
                completions: AtomicUsize::new(0),
            }
        }

        fn failing(&self) -> bool {
            matches!(*self.blip.lock().unwrap(), Blip::Fail(..))
        }
    }

    fn down(kind: StoreErrorKind) -> StoreError {
        StoreError::new("blipping", kind, "the store blipped")
    }

    impl Store for Blipping {
        fn backend(&self) -> &'static str {
            "blipping"
        }
        fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
            self.inner.claim(req)
        }
        fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
            Box::pin(async move {
                self.completions.fetch_add(1, Ordering::SeqCst);
                let blip = *self.blip.lock().unwrap();
                match blip {
                    Blip::None => self.inner.complete(c).await,
                    Blip::Fail(left, kind) => {
                        *self.blip.lock().unwrap() = match left {
                            0 | 1 => Blip::None,
                            n => Blip::Fail(n - 1, kind),
                        };
                        Err(down(kind))
                    }
                    Blip::LoseAnswer => {
                        *self.blip.lock().unwrap() = Blip::None;
                        self.inner.complete(c).await?;
                        Err(down(StoreErrorKind::Unavailable))
                    }
                }
            })
        }
        fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
            if self.failing() {
                return Box::pin(async { Err(down(StoreErrorKind::Unavailable)) });
            }
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

    static TOOL: ToolInfo = ToolInfo::new("completion.test", "charge", "m", "f.rs", 1)
        .stable_name()
        .key(&["run"], false)
        .lease_ms(600);

    /// One call of a counting tool on `idem`.
    async fn charge(
        idem: &Idem,
        runs: &AtomicUsize,
        run_id: &str,
    ) -> Result<Outcome<u32>, Error<String>> {
        charge_then(idem, runs, run_id, Duration::ZERO, async {}).await
    }

    /// One call of a counting tool on `idem` whose body takes `takes`, then does `then`.
    async fn charge_then(
        idem: &Idem,
        runs: &AtomicUsize,
        run_id: &str,
        takes: Duration,
        then: impl Future<Output = ()>,
    ) -> Result<Outcome<u32>, Error<String>> {
        let key = KeyParts::new().part("run", KeyPart::new(run_id).map(Some));
        let fingerprint = Ok(idem_core::fingerprint::Fingerprint::from_bytes([1; 32]));
        let body = move |()| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if !takes.is_zero() {
                tokio::time::sleep(takes).await;
            }
            then.await;
            Ok::<_, String>(7)
        };
        // The call's refusals are decided as its future is made: inside the scope.
        idem.scope("t")
            .run(async {
                run::<_, _, ReleaseErrors, _, _, _, _>(&TOOL, key, fingerprint, (), NoCheck, body)
                    .await
            })
            .await
    }

    #[tokio::test]
    async fn a_completion_that_meets_a_blip_lands_late_and_the_call_is_fresh() {
        let store = std::sync::Arc::new(Blipping::new(Blip::Fail(4, StoreErrorKind::Timeout)));
        let idem = Idem::with_store(store.clone());
        let runs = AtomicUsize::new(0);
        let first = charge(&idem, &runs, "blip").await;
        assert!(matches!(first, Ok(Outcome::Fresh(7))), "{first:?}");
        assert_eq!(
            store.completions.load(Ordering::SeqCst),
            5,
            "four failed, the fifth landed"
        );
        let again = charge(&idem, &runs, "blip").await;
        assert!(matches!(again, Ok(Outcome::Replayed(7))), "{again:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_completion_whose_answer_was_lost_is_recognised_as_its_own() {
        let store = std::sync::Arc::new(Blipping::new(Blip::LoseAnswer));
        let idem = Idem::with_store(store.clone());
        let runs = AtomicUsize::new(0);
        // The memory store refuses a second completion of a completed record: the runtime
        // reads the record and finds its own token, status and result.
        let first = charge(&idem, &runs, "lost-answer").await;
        assert!(matches!(first, Ok(Outcome::Fresh(7))), "{first:?}");
        assert_eq!(store.completions.load(Ordering::SeqCst), 2);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_outage_longer_than_the_window_says_the_body_ran_within_the_window() {
        let store = std::sync::Arc::new(Blipping::new(Blip::Fail(
            usize::MAX,
            StoreErrorKind::Unavailable,
        )));
        let idem = Idem::with_store(store.clone());
        let runs = AtomicUsize::new(0);
        let started = Instant::now();
        let answer = charge(&idem, &runs, "long").await;
        let took = started.elapsed();
        let Err(Error::CompletionFailed { attempts, .. }) = answer else {
            panic!("{answer:?}");
        };
        assert!(attempts > 3, "tried again: {attempts}");
        assert_eq!(attempts as usize, store.completions.load(Ordering::SeqCst));
        // The window is the tool's lease (600 ms); the bound leaves the scheduler room.
        assert!(
            took >= Duration::from_millis(550) && took < Duration::from_millis(1500),
            "{took:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_shorter_window_set_on_the_runtime_bounds_the_wait() {
        let store = std::sync::Arc::new(Blipping::new(Blip::Fail(
            usize::MAX,
            StoreErrorKind::Unavailable,
        )));
        let idem = Idem::builder()
            .completion_retry(Duration::from_millis(100))
            .build(store.clone());
        assert_eq!(
            idem.completion_retry(Duration::from_millis(600)),
            Duration::from_millis(100)
        );
        assert_eq!(
            idem.completion_retry(Duration::from_millis(50)),
            Duration::from_millis(50)
        );
        let runs = AtomicUsize::new(0);
        let started = Instant::now();
        let answer = charge(&idem, &runs, "short").await;
        assert!(
            matches!(answer, Err(Error::CompletionFailed { .. })),
            "{answer:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn an_error_that_will_not_pass_is_not_tried_again() {
        let store = std::sync::Arc::new(Blipping::new(Blip::Fail(
            usize::MAX,
            StoreErrorKind::Schema,
        )));
        let idem = Idem::with_store(store.clone());
        let runs = AtomicUsize::new(0);
        let answer = charge(&idem, &runs, "schema").await;
        assert!(
            matches!(answer, Err(Error::CompletionFailed { attempts: 1, .. })),
            "{answer:?}"
        );
        assert_eq!(store.completions.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_key_taken_over_while_the_completion_waits_is_never_overwritten() {
        // The body runs 350 ms (a renewal at 200 ms keeps its 600 ms lease to 800 ms); then
        // completions and renewals fail. The lease lapses in the store while the completion is
        // tried again; at 850 ms a retry takes the key over (the store is back) and runs the
        // body again (no check); the first call's next attempt finds another claim's record:
        // fenced out, the owner's record untouched.
        let store = std::sync::Arc::new(Blipping::new(Blip::None));
        let idem = Idem::with_store(store.clone());
        let runs = AtomicUsize::new(0);
        let started = Instant::now();
        let blip = async {
            *store.blip.lock().unwrap() = Blip::Fail(usize::MAX, StoreErrorKind::Unavailable);
        };
        let first = charge_then(&idem, &runs, "taken", Duration::from_millis(350), blip);
        let takeover = async {
            tokio::time::sleep(Duration::from_millis(850)).await;
            *store.blip.lock().unwrap() = Blip::None;
            charge(&idem, &runs, "taken").await
        };
        let (first, second) = tokio::join!(first, takeover);
        assert!(matches!(second, Ok(Outcome::Fresh(7))), "{second:?}");
        assert!(matches!(first, Err(Error::LeaseLost { .. })), "{first:?}");
        assert!(started.elapsed() < Duration::from_millis(350 + 600 + 500));
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "no check: the takeover ran the body again"
        );
        let again = charge(&idem, &runs, "taken").await;
        assert!(
            matches!(again, Ok(Outcome::Replayed(7))),
            "the owner's result: {again:?}"
        );
    }

    #[test]
    fn the_backoff_doubles_up_to_its_ceiling_half_fixed_half_random() {
        let ceiling = ceiling(Duration::from_secs(30));
        assert_eq!(ceiling, LONGEST_BACKOFF);
        for retry in 0..40 {
            let full = (Duration::from_millis(20) * 2u32.pow(retry.min(16))).min(ceiling);
            let wait = backoff(retry, ceiling);
            assert!(wait >= full / 2 && wait <= full, "{retry}: {wait:?}");
        }
        assert_eq!(
            super::ceiling(Duration::from_millis(800)),
            Duration::from_millis(100)
        );
        assert_eq!(super::ceiling(Duration::ZERO), Duration::from_millis(1));
    }
}
