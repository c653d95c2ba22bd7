//! Keeping a claim while its body runs: the lease is renewed in the store every third of the
//! lease, fenced by the claim's token, so a body that runs many times its lease is never taken
//! over while its process lives. When the process dies, renewals stop and the lease lapses one
//! lease later, as without renewal.
//!
//! | renewal answers | then |
//! |---|---|
//! | applied | the lease runs one more lease from now |
//! | lost (the key was taken over, settled or purged) | the lease is lost: renewals stop |
//! | a store error | tried again soon; once the last lease the store confirmed has lapsed by this caller's clock, the lease is lost (another caller may have taken over), and renewals go on |
//!
//! A lost lease is told to the body ([`Current::is_lease_lost`](crate::Current::is_lease_lost),
//! [`Current::lease_lost`](crate::Current::lease_lost)); its completion is fenced by the store
//! as always: refused when another claim took the key over.
//!
//! The renewals run inside the call's own future, next to the body (no task is spawned), and
//! wait on idem's own timer (one keeper thread per process, see `timer.rs`): a call needs
//! nothing more of its runtime than before, not even tokio's time driver.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use super::Claimed;
use idem_core::store::{BatchRenewal, ClaimedItem, Fenced, Renewal, UnixMillis, after};

/// How often a lease is renewed: a third of it, so that two renewals in a row may fail before
/// it lapses.
pub(crate) fn renewal_period(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

impl Claimed {
    /// Runs `body` while this claim's lease is renewed, and answers what `body` answers.
    ///
    /// The body is polled first; the renewals only when it is pending, so a body that finishes
    /// without waiting never starts a timer.
    pub async fn hold<F: Future>(&self, body: F) -> F::Output {
        hold_all(&[self], body).await
    }
}

/// Runs `body` while the leases of `claims` (of one tenant and one lease, as a batch's are) are
/// renewed, and answers what `body` answers: as [`Claimed::hold`], with one round trip a period
/// for all of them ([`Store::renew_batch`](idem_core::store::Store::renew_batch)).
pub(super) async fn hold_all<F: Future>(claims: &[&Claimed], body: F) -> F::Output {
    if !claims.first().is_some_and(|c| c.idem.renews_leases()) {
        return body.await;
    }
    let mut body = pin!(body);
    let mut renewals = pin!(renew_until_lost(claims));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = body.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        let _ = renewals.as_mut().poll(cx);
        Poll::Pending
    })
    .await
}

/// Renews the leases of `claims` every [`renewal_period`] until the store says each is lost;
/// never completes. One claim is renewed by [`Store::renew`](idem_core::store::Store::renew),
/// several in one [`Store::renew_batch`](idem_core::store::Store::renew_batch).
async fn renew_until_lost(claims: &[&Claimed]) {
    let Some(first) = claims.first() else {
        return std::future::pending().await;
    };
    let (idem, lease) = (&first.idem, first.lease);
    let period = renewal_period(lease);
    // Each claim still held, and when the lease the store last confirmed for it lapses.
    let mut held: Vec<(&Claimed, UnixMillis)> = claims.iter().map(|c| (*c, c.held_until)).collect();
    let mut wait = period;
    loop {
        crate::timer::sleep(wait).await;
        let now = idem.clock().now();
        let renewed = match held.as_slice() {
            [(claimed, _)] => idem
                .store()
                .renew(Renewal {
                    tenant: &claimed.tenant,
                    key: claimed.key,
                    token: claimed.token,
                    now,
                    lease,
                })
                .await
                .map(|answer| vec![answer]),
            _ => {
                let items: Vec<ClaimedItem> = held
                    .iter()
                    .map(|(claimed, _)| ClaimedItem {
                        key: claimed.key,
                        token: claimed.token,
                    })
                    .collect();
                let batch = BatchRenewal {
                    tenant: &first.tenant,
                    now,
                    lease,
                    items: &items,
                };
                idem.store().renew_batch(batch).await
            }
        };
        wait = period;
        match renewed {
            Ok(answers) if answers.len() == held.len() => {
                let mut still = Vec::with_capacity(held.len());
                for ((claimed, _), answer) in held.into_iter().zip(answers) {
                    match answer {
                        Fenced::Applied => still.push((claimed, after(now, lease))),
                        Fenced::Lost => claimed.lease_state.refuse(),
                    }
                }
                held = still;
                if held.is_empty() {
                    return std::future::pending().await;
                }
            }
            // A store error (or an answer that does not match): tried again soon; a lease the
            // store last confirmed that has lapsed by this caller's clock is lost.
            _ => {
                let now = idem.clock().now();
                for (claimed, held_until) in &held {
                    if now >= *held_until {
                        claimed.lease_state.lose();
                    }
                }
                wait = period / 3;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::renewal_period;
    use crate::lease_state::LeaseState;

    #[test]
    fn a_lease_is_renewed_every_third_of_it_and_never_in_a_busy_loop() {
        assert_eq!(
            renewal_period(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        assert_eq!(
            renewal_period(Duration::from_millis(1)),
            Duration::from_millis(1)
        );
    }

    #[tokio::test]
    async fn waiters_learn_of_a_lost_lease_once_and_for_all() {
        let state = Arc::new(LeaseState::default());
        assert!(!state.is_lost());
        let waiter = tokio::spawn({
            let state = state.clone();
            async move { state.lost().await }
        });
        tokio::task::yield_now().await;
        state.lose();
        state.lose();
        waiter.await.unwrap();
        assert!(state.is_lost());
        state.lost().await;
    }
}
