//! The agent loop's side of retries: [`retry`] calls a tool again, with the same arguments and
//! so the same key, while that can help, and dead-letters the step when it cannot.
//!
//! ```no_run
//! # async fn charge(run: String) -> Result<idem_core::Outcome<u64>, idem_core::Error<String>> { todo!() }
//! # async fn f(idem: idem_runtime::Idem) {
//! use idem_runtime::retry::{RetryPolicy, retry};
//!
//! let tenant = idem.scope("tenant-a");
//! let out = tenant
//!     .run(retry(&RetryPolicy::default(), || charge("run-9".into())))
//!     .await;
//! # }
//! ```
//!
//! | the call answers | [`retry`] |
//! |---|---|
//! | `Fresh`, `Replayed`, `Unprotected` | returns it |
//! | `Mismatch`, `Unknown` | returns it at once: a retry would not change it |
//! | `InFlight` | waits (the backoff, or the time left on the lease) and calls again |
//! | a store error (unreachable, timeout, closed) | waits and calls again |
//! | the tool's own error, any other error | returns it: the tool's `on_error` policy decided |
//!
//! When the budget runs out on `InFlight` or a store error, the step goes to the dead-letter
//! queue of the tenant, in the same store, with its reason (`idempotency_in_flight`,
//! `store_unavailable`), the tool and the key's short hash (never the key), and [`retry`]
//! answers [`RetryError::DeadLettered`]. [`crate::Idem::dead_letters`] lists the queue and
//! [`crate::Idem::acknowledge`] removes an entry.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::protocol::{Claiming, Intent, claim};
use crate::runtime::{Idem, Scope};
use crate::timer::jitter;
use idem_core::Outcome;
use idem_core::key::{IdempotencyKey, KeyHash, KeyPart, derive_key};
use idem_core::store::{Orphans, RecordStatus, UnixMillis};
use idem_core::{Error, StoreError, StoreErrorKind};

/// How calls are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// At most this many attempts in all (default 8).
    pub max_attempts: u32,
    /// The first backoff (default 100 ms); it doubles on each retry, with full jitter.
    pub base_delay: Duration,
    /// No wait is longer than this (default 5 s).
    pub max_delay: Duration,
    /// No retry starts after this much time since the first attempt (default 60 s).
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            budget: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1`: exponential with full jitter, at most
    /// `max_delay`; `hint` (an upper bound on the wait that helps, such as the time left on an
    /// in-flight call's lease) replaces the backoff.
    pub fn delay(&self, attempt: u32, hint: Option<Duration>) -> Duration {
        let backoff = jitter(
            self.base_delay
                .saturating_mul(1 << attempt.saturating_sub(1).min(16)),
        );
        hint.unwrap_or(backoff).min(self.max_delay)
    }

    /// The wait before attempt `attempt + 1` when the server said how long to wait (an HTTP
    /// `Retry-After`): the backoff, but never less than the server's wait. The server's wait is a
    /// floor, not capped by `max_delay`; a caller whose budget cannot cover it gives up instead
    /// of retrying early.
    pub fn delay_at_least(&self, attempt: u32, floor: Duration) -> Duration {
        self.delay(attempt, None).max(floor)
    }
}

/// Why a step went to the dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// Another call held the key for the whole budget.
    IdempotencyInFlight,
    /// The store failed for the whole budget.
    StoreUnavailable,
}

impl DeadLetterReason {
    /// The reason as the queue stores it: `idempotency_in_flight`, `store_unavailable`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::IdempotencyInFlight => "idempotency_in_flight",
            DeadLetterReason::StoreUnavailable => "store_unavailable",
        }
    }
}

/// One entry of the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// What to acknowledge it by (a short hash of the entry).
    pub id: String,
    /// The tenant.
    pub tenant: String,
    /// The tool's stable name.
    pub tool: String,
    /// The short hash of the step's key.
    pub key: String,
    /// Why it was given up on.
    pub reason: DeadLetterReason,
    /// Attempts made.
    pub attempts: u32,
    /// When it was given up on (Unix milliseconds).
    pub at: UnixMillis,
}

/// What [`retry`] answers when it gives up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError<E> {
    /// The call failed in a way a retry would not change (see the module docs).
    #[error(transparent)]
    Call(Error<E>),
    /// The budget ran out; the step is in the dead-letter queue.
    #[error(
        "tool `{tool}` (key {key}): given up after {attempts} attempt(s) ({}); the step is in the dead-letter queue",
        reason.as_str()
    )]
    DeadLettered {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
        /// Why.
        reason: DeadLetterReason,
        /// Attempts made.
        attempts: u32,
        /// The last error, when the reason is a store failure.
        #[source]
        last: Option<StoreError>,
    },
    /// The budget ran out and the dead-letter entry could not be written either (the store is
    /// down): the step is lost to the queue, the caller must keep it.
    #[error(
        "tool `{tool}` (key {key}): given up after {attempts} attempt(s), and the dead-letter queue could not be written"
    )]
    DeadLetterFailed {
        /// The tool's stable name.
        tool: &'static str,
        /// Short hash of the key.
        key: KeyHash,
        /// Attempts made.
        attempts: u32,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

/// The tool name dead-letter records are kept under.
pub const DEAD_LETTER_TOOL: &str = "idem.dead_letter";

/// How long a dead-letter entry is kept.
const DEAD_LETTER_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Calls `call` until it answers something a retry would not change, as the module docs say.
pub async fn retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    mut call: F,
) -> Result<Outcome<T>, RetryError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let started = Instant::now();
    let mut attempt = 0;
    // Each attempt is the same call: inside a durable run's step, it keeps its step id.
    let mark = crate::run::Mark::now();
    crate::current::recording_calls(async move {
        loop {
            attempt += 1;
            mark.rewind();
            let answer = call().await;
            let (reason, hint, last) = match answer {
                Ok(Outcome::InFlight(ref i)) => (
                    DeadLetterReason::IdempotencyInFlight,
                    Some(i.retry_after),
                    None,
                ),
                Err(Error::Store(e)) if transient(&e) => {
                    (DeadLetterReason::StoreUnavailable, None, Some(e))
                }
                Ok(out) => return Ok(out),
                Err(e) => return Err(RetryError::Call(e)),
            };
            let delay = policy.delay(attempt, hint);
            let exhausted =
                attempt >= policy.max_attempts || started.elapsed() + delay > policy.budget;
            if !exhausted {
                tokio::time::sleep(delay).await;
                continue;
            }
            let Some((tool, key)) = crate::current::last_call() else {
                // No keyed call ran (the store failed before the key was known).
                return Err(RetryError::Call(Error::Store(last.unwrap_or_else(|| {
                    StoreError::new("retry", StoreErrorKind::Other, "no call was made")
                }))));
            };
            return match dead_letter(tool, key, reason, attempt).await {
                Ok(()) => Err(RetryError::DeadLettered {
                    tool,
                    key: key.short_hash(),
                    reason,
                    attempts: attempt,
                    last,
                }),
                Err(source) => Err(RetryError::DeadLetterFailed {
                    tool,
                    key: key.short_hash(),
                    attempts: attempt,
                    source,
                }),
            };
        }
    })
    .await
}

fn transient(e: &StoreError) -> bool {
    matches!(
        e.kind(),
        StoreErrorKind::Unavailable | StoreErrorKind::Timeout | StoreErrorKind::Closed
    )
}

/// The key of the dead-letter entry of a step: one per step, so writing it twice is harmless.
fn dead_letter_key(tenant: &str, key: &IdempotencyKey) -> IdempotencyKey {
    let part = KeyPart::new(&idem_core::hex::encode(key.as_bytes())).expect("64 hex digits");
    derive_key(tenant, DEAD_LETTER_TOOL, &[part])
}

async fn dead_letter(
    tool: &'static str,
    key: IdempotencyKey,
    reason: DeadLetterReason,
    attempts: u32,
) -> Result<(), StoreError> {
    let Some(scope) = Scope::current() else {
        return Err(StoreError::new(
            "retry",
            StoreErrorKind::Other,
            "no idem runtime in scope to write the dead-letter queue",
        ));
    };
    let (tenant, idem) = (scope.tenant(), scope.idem());
    let now = idem.clock().now();
    let entry_key = dead_letter_key(tenant, &key);
    let entry = DeadLetter {
        id: entry_key.short_hash().to_string(),
        tenant: tenant.to_owned(),
        tool: tool.to_owned(),
        key: key.short_hash().to_string(),
        reason,
        attempts,
        at: now,
    };
    let bytes = serde_json::to_vec(&entry).expect("a dead letter serializes");
    let intent = Intent {
        tenant: scope.shared_tenant(),
        key: entry_key,
        tool: DEAD_LETTER_TOOL,
        fingerprint: idem_core::fingerprint::Fingerprint::from_bytes([0; 32]),
        lease: Duration::from_secs(30),
        ttl: DEAD_LETTER_TTL,
        orphans: Orphans::TakeOver,
        wait: Duration::ZERO,
    };
    match claim(idem, &intent).await? {
        Claiming::Acquired(claimed) => {
            claimed.complete(RecordStatus::Completed, &bytes).await?;
            Ok(())
        }
        // Already dead-lettered (or being written by another retry of the same step).
        _ => Ok(()),
    }
}

/// The dead-letter queue, kept in the runtime's store.
impl Idem {
    /// The dead-letter queue of `tenant`: the steps [`retry`] gave up on.
    ///
    /// Needs a store opened by URL ([`Idem::open`]); a store built by hand has no admin side
    /// and answers an error.
    pub async fn dead_letters(&self, tenant: &str) -> Result<Vec<DeadLetter>, StoreError> {
        let admin = self.admin()?;
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = admin.scan(Some(tenant), cursor.as_deref(), 500).await?;
            out.extend(page.records.iter().filter_map(decode));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        out.sort_by(|a, b| (a.at, &a.id).cmp(&(b.at, &b.id)));
        out.dedup_by(|a, b| a.id == b.id);
        Ok(out)
    }

    /// Removes the entry `id` (as [`dead_letters`](Idem::dead_letters) shows it) from the
    /// dead-letter queue of `tenant`; `false` when there was none.
    pub async fn acknowledge(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        let admin = self.admin()?;
        let mut cursor: Option<String> = None;
        loop {
            let page = admin.scan(Some(tenant), cursor.as_deref(), 500).await?;
            if let Some(record) = page
                .records
                .iter()
                .find(|r| r.tool == DEAD_LETTER_TOOL && r.key.short_hash().to_string() == id)
            {
                let deleted = admin.delete(tenant, record.key).await?;
                return Ok(deleted == idem_core::store::Fenced::Applied);
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => return Ok(false),
            }
        }
    }
}

/// Decodes a dead-letter record.
fn decode(record: &idem_core::store::Record) -> Option<DeadLetter> {
    (record.tool == DEAD_LETTER_TOOL && record.status == RecordStatus::Completed)
        .then(|| serde_json::from_slice(record.result.as_deref()?).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_with_jitter_and_respect_hints_and_the_cap() {
        let p = RetryPolicy::default();
        for attempt in 1..10 {
            let d = p.delay(attempt, None);
            assert!(d <= p.max_delay);
            assert!(d < p.base_delay.saturating_mul(1 << (attempt - 1)) + Duration::from_nanos(1));
        }
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(p.delay(1, Some(Duration::from_secs(60))), p.max_delay);
    }

    #[test]
    fn a_servers_wait_is_a_floor_never_shortened_nor_capped() {
        let p = RetryPolicy::default();
        for attempt in 1..10 {
            assert_eq!(
                p.delay_at_least(attempt, Duration::from_secs(30)),
                Duration::from_secs(30),
                "above max_delay, the server's wait stands"
            );
            let d = p.delay_at_least(attempt, Duration::from_millis(1));
            assert!(d >= Duration::from_millis(1) && d <= p.max_delay);
        }
    }
}
