//! Whether a claim still holds its lease: told by the renewals (`protocol::lease`) to the body
//! ([`Current`](crate::Current)).

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Whether a claim still holds its lease, as the body may ask.
#[derive(Debug, Default)]
pub(crate) struct LeaseState {
    lost: AtomicBool,
    /// The store refused a renewal: another claim owns the key, or it was settled or purged.
    refused: AtomicBool,
    notify: Notify,
}

impl LeaseState {
    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Completes once the lease is lost.
    pub async fn lost(&self) {
        let mut notified = pin!(self.notify.notified());
        loop {
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            notified.as_mut().await;
            notified.set(self.notify.notified());
        }
    }

    /// Whether the store refused a renewal (the lease is lost for sure, not only lapsed by
    /// this caller's clock).
    pub fn is_refused(&self) -> bool {
        self.refused.load(Ordering::Acquire)
    }

    /// The store refused a renewal: the lease is lost.
    pub(crate) fn refuse(&self) {
        self.refused.store(true, Ordering::Release);
        self.lose();
    }

    pub(crate) fn lose(&self) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            self.notify.notify_waiters();
        }
    }
}
