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
use idem_core::store::{Fenced, Renewal, UnixMillis, after};

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
        if !self.idem.renews_leases() {
            return body.await;
        }
        let mut body = pin!(body);
        let mut renewals = pin!(self.renew_until_lost());
        std::future::poll_fn(|cx| {
            if let Poll::Ready(output) = body.as_mut().poll(cx) {
                return Poll::Ready(output);
            }
            let _ = renewals.as_mut().poll(cx);
            Poll::Pending
        })
        .await
    }

    /// Renews the lease every [`renewal_period`] until the store says it is lost; never
    /// completes.
    pub(super) async fn renew_until_lost(&self) {
        let period = renewal_period(self.lease);
        let mut held_until: UnixMillis = self.held_until;
        let mut wait = period;
        loop {
            crate::timer::sleep(wait).await;
            let now = self.idem.clock().now();
            let renewed = self
                .idem
                .store()
                .renew(Renewal {
                    tenant: &self.tenant,
                    key: self.key,
                    token: self.token,
                    now,
                    lease: self.lease,
                })
                .await;
            wait = period;
            match renewed {
                Ok(Fenced::Applied) => held_until = after(now, self.lease),
                Ok(Fenced::Lost) => {
                    self.lease_state.refuse();
                    return std::future::pending().await;
                }
                Err(_) => {
                    if self.idem.clock().now() >= held_until {
                        self.lease_state.lose();
                    }
                    wait = period / 3;
                }
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
