//! Where the runtime reads the time: leases and TTLs are measured with a [`Clock`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, the time unit of records.
pub type UnixMillis = u64;

/// `now + d` in milliseconds, saturating.
pub fn after(now: UnixMillis, d: Duration) -> UnixMillis {
    now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> UnixMillis;
}

/// The system clock (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixMillis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to: for testing leases and TTLs without sleeping.
///
/// ```
/// # use idem_core::clock::{Clock, ManualClock};
/// # use std::time::Duration;
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now(), 3_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `now`.
    pub fn new(now: UnixMillis) -> Self {
        ManualClock(Arc::new(AtomicU64::new(now)))
    }

    /// Moves the clock forward (every clone sees it).
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(
            u64::try_from(by.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixMillis {
        self.0.load(Ordering::SeqCst)
    }
}
