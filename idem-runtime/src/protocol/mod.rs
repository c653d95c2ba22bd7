//! The call protocol: claim → (replay | refuse | check | run) → settle, written once and used by
//! every entry point (the `#[idempotent]` macro's `__private::run_*` and the HTTP layer).
//!
//! | step | what happens | in |
//! |---|---|---|
//! | prepare | no scope, an unfingerprintable argument, a malformed or missing key part, a bad tenant: refused before the store is touched | `call.rs` |
//! | claim | one atomic store call decides the key by the store's decision table ([`decide`](idem_core::store::decide)) | [`claim`] |
//! | replay | a completed record: its value, or its stored error, decoded | `call.rs`, `record.rs` |
//! | wait | a key in flight, for a call that may wait: watched, claimed again when it settles | [`claim_waiting`] |
//! | refuse | `Mismatch`, `InFlight` (with how long to wait), `Unknown` | [`Claiming`] |
//! | check | an orphan or `unknown` record taken over: the tool's state check decides first | `call.rs` (`Check`) |
//! | run | the body, as [`current()`](crate::current()) call, its lease renewed while it runs | `call.rs`, `lease.rs` |
//! | settle | complete (fenced by the claim's token, tried again through store errors while the lease lasts) or release, as the tool's `on_error` policy says | [`Claimed`], `completion.rs`, `policy.rs` |
//!
//! A transactional tool (`transactional.rs`, feature `postgres`) takes the same steps inside one
//! transaction of the store's database: claim, body and settlement commit together.
//!
//! A key is only ever settled through the [`Claimed`] its claim returned: the fencing token
//! never leaves it, so a settlement cannot name another claim's token.

pub(crate) mod batch;
pub(crate) mod call;
pub(crate) mod checked;
pub(crate) mod completion;
pub(crate) mod follower;
pub(crate) mod lease;
pub(crate) mod policy;
pub(crate) mod record;
pub(crate) mod stream;
#[cfg(feature = "postgres")]
pub(crate) mod transactional;
pub(crate) mod wait;

use std::sync::Arc;
use std::time::Duration;

pub use completion::Recorded;
pub use follower::{Followed, Follower, PAGE};
pub use wait::claim_waiting;

use crate::lease_state::LeaseState;
use crate::runtime::Idem;
use idem_core::StoreError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::IdempotencyKey;
use idem_core::store::{
    Claim, ClaimRequest, Completion, Fenced, FencingToken, Orphans, RecordStatus, StoreFuture,
    UnixMillis, after,
};

/// What one call means to claim: the key of an intent, under a tenant.
#[derive(Debug, Clone)]
pub struct Intent {
    /// The tenant (for HTTP, the principal); shared, so that a claim that takes the key keeps it
    /// without a copy.
    pub tenant: Arc<str>,
    /// The derived key.
    pub key: IdempotencyKey,
    /// The tool's stable name.
    pub tool: &'static str,
    /// The fingerprint of the arguments.
    pub fingerprint: Fingerprint,
    /// How long a new claim blocks other callers.
    pub lease: Duration,
    /// How long the record lives.
    pub ttl: Duration,
    /// What a claim does with an orphan or an `unknown` record.
    pub orphans: Orphans,
    /// How long a call that finds the key held by a live call waits for it to settle
    /// ([`claim_waiting`]); not zero, it also asks the store to announce this call's own
    /// completion to the callers waiting for it.
    pub wait: Duration,
}

impl Intent {
    /// The intent of a call of `tool` under `idem`: its lease, TTL and wait as the tool and the
    /// runtime set them, and `orphans` as the call treats them.
    pub(crate) fn of_tool(
        tool: &crate::registry::ToolInfo,
        idem: &Idem,
        tenant: Arc<str>,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
        orphans: Orphans,
    ) -> Self {
        Intent {
            tenant,
            key,
            tool: tool.name,
            fingerprint,
            lease: tool.effective_lease(idem),
            ttl: tool.effective_ttl(idem),
            orphans,
            wait: tool.effective_wait(idem.default_wait()),
        }
    }
}

/// What a claim found, decided.
#[derive(Debug)]
pub enum Claiming {
    /// The key is this call's: run (or check), then settle through [`Claimed`].
    Acquired(Claimed),
    /// Completed with the same fingerprint: the stored bytes, to replay.
    Completed(Vec<u8>),
    /// Used with other arguments.
    Mismatch,
    /// Held by a live call: wait this long, then retry with the same key.
    InFlight(Duration),
    /// Blocked as unknown: an earlier call may have had its effect.
    Unknown,
}

/// Claims `intent`'s key in `idem`'s store, reading the time once from `idem`'s clock.
pub async fn claim(idem: &Idem, intent: &Intent) -> Result<Claiming, StoreError> {
    let now = idem.clock().now();
    let claim = idem
        .store()
        .claim(ClaimRequest {
            tenant: &intent.tenant,
            key: intent.key,
            tool: intent.tool,
            fingerprint: intent.fingerprint,
            now,
            lease: intent.lease,
            ttl: intent.ttl,
            orphans: intent.orphans,
        })
        .await?;
    Ok(Claiming::of(idem, intent, claim, now))
}

impl Claiming {
    /// What the store's answer `claim` to `intent`'s claim at `now` means for the call.
    pub(crate) fn of(idem: &Idem, intent: &Intent, claim: Claim, now: UnixMillis) -> Claiming {
        match claim {
            Claim::Acquired { token, takeover } => {
                Claiming::Acquired(Claimed::new(idem, intent, token, takeover, now))
            }
            Claim::Completed { result } => Claiming::Completed(result),
            Claim::Mismatch => Claiming::Mismatch,
            Claim::InFlight { lease_expires_at } => {
                Claiming::InFlight(retry_after(lease_expires_at, now, intent.lease))
            }
            Claim::Unknown => Claiming::Unknown,
        }
    }
}

/// How long to wait for an in-flight call: until its lease lapses by this caller's clock, and
/// never more than one lease (the owner read its clock a little later than this caller, or runs
/// slightly ahead).
pub fn retry_after(lease_expires_at: UnixMillis, now: UnixMillis, lease: Duration) -> Duration {
    Duration::from_millis(lease_expires_at.saturating_sub(now)).min(lease)
}

/// A key this call holds. Settling it is fenced by the claim's token: after a takeover by
/// another caller, [`complete`](Claimed::complete) answers [`Fenced::Lost`] and changes nothing.
#[derive(Debug)]
pub struct Claimed {
    idem: Idem,
    /// The tool's stable name (for its metrics).
    tool: &'static str,
    tenant: Arc<str>,
    key: IdempotencyKey,
    token: FencingToken,
    ttl: Duration,
    takeover: bool,
    /// The lease each renewal asks for.
    lease: Duration,
    /// When the lease the claim got lapses (by the caller's clock when it claimed).
    held_until: UnixMillis,
    /// Whether the lease is still held, for the body to ask.
    lease_state: Arc<LeaseState>,
    /// Whether the completion is announced to waiting callers (the tool declares `wait`).
    notify: bool,
}

impl Claimed {
    /// The claim of `intent`'s key that the store acquired at `now` with `token`.
    fn new(
        idem: &Idem,
        intent: &Intent,
        token: FencingToken,
        takeover: bool,
        now: UnixMillis,
    ) -> Self {
        Claimed {
            idem: idem.clone(),
            tool: intent.tool,
            tenant: intent.tenant.clone(),
            key: intent.key,
            token,
            ttl: intent.ttl,
            takeover,
            lease: intent.lease,
            held_until: after(now, intent.lease),
            lease_state: Arc::default(),
            notify: !intent.wait.is_zero(),
        }
    }

    /// The fencing token (for the call's span).
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Whether the claim took over an orphan or an `unknown` record: an earlier owner may have
    /// had the effect.
    pub fn takeover(&self) -> bool {
        self.takeover
    }

    /// What the body may learn of this claim's lease.
    pub(crate) fn lease_state(&self) -> &Arc<LeaseState> {
        &self.lease_state
    }

    /// Records the key as `status` with `result`, if this claim still owns it: one attempt
    /// (see [`Claimed::complete_retrying`] for the attempts a call makes).
    pub async fn complete(
        &self,
        status: RecordStatus,
        result: &[u8],
    ) -> Result<Fenced, StoreError> {
        self.completion(status, result).await
    }

    /// The store's completion of this claim, as `status` with `result`.
    fn completion<'a>(&'a self, status: RecordStatus, result: &'a [u8]) -> StoreFuture<'a, Fenced> {
        self.idem.store().complete(Completion {
            tenant: &self.tenant,
            key: self.key,
            token: self.token,
            status,
            result,
            now: self.idem.clock().now(),
            ttl: self.ttl,
            notify: self.notify,
        })
    }

    /// Deletes the claim, so that the next call runs: nothing happened.
    pub async fn release(self) -> Result<Fenced, StoreError> {
        self.idem
            .store()
            .release(&self.tenant, self.key, self.token)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Claiming, Intent, claim, retry_after};
    use crate::runtime::Idem;
    use idem_core::fingerprint::Fingerprint;
    use idem_core::key::{KeyPart, derive_key};
    use idem_core::store::faulty::{Faults, FaultyStore};
    use idem_core::store::memory::MemoryStore;
    use idem_core::store::{Fenced, Orphans, RecordStatus};

    fn intent(fingerprint: u8, lease_ms: u64) -> Intent {
        Intent {
            tenant: "tenant-p".into(),
            key: derive_key(
                "tenant-p",
                "protocol.test",
                &[KeyPart::new("run-1").unwrap()],
            ),
            tool: "protocol.test",
            fingerprint: Fingerprint::from_bytes([fingerprint; 32]),
            lease: Duration::from_millis(lease_ms),
            ttl: Duration::from_secs(60),
            orphans: Orphans::TakeOver,
            wait: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn a_new_key_is_acquired_then_replayed_once_completed() {
        let idem = Idem::with_store(MemoryStore::new());
        let Claiming::Acquired(claimed) = claim(&idem, &intent(1, 30_000)).await.unwrap() else {
            panic!("a new key is acquired");
        };
        assert!(!claimed.takeover());
        assert_eq!(
            claimed
                .complete(RecordStatus::Completed, b"{\"ok\":7}")
                .await
                .unwrap(),
            Fenced::Applied
        );
        match claim(&idem, &intent(1, 30_000)).await.unwrap() {
            Claiming::Completed(bytes) => assert_eq!(bytes, b"{\"ok\":7}"),
            other => panic!("a completed key replays: {other:?}"),
        }
    }

    #[tokio::test]
    async fn other_arguments_are_a_mismatch_and_a_held_key_says_how_long_to_wait() {
        let idem = Idem::with_store(MemoryStore::new());
        let Claiming::Acquired(_held) = claim(&idem, &intent(1, 30_000)).await.unwrap() else {
            panic!("acquired");
        };
        assert!(matches!(
            claim(&idem, &intent(2, 30_000)).await.unwrap(),
            Claiming::Mismatch
        ));
        match claim(&idem, &intent(1, 30_000)).await.unwrap() {
            Claiming::InFlight(wait) => {
                assert!(wait <= Duration::from_secs(30) && wait > Duration::from_secs(25));
            }
            other => panic!("held: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_released_key_runs_again_and_a_taken_over_claim_cannot_settle() {
        let idem = Idem::with_store(MemoryStore::new());
        let Claiming::Acquired(first) = claim(&idem, &intent(1, 30_000)).await.unwrap() else {
            panic!("acquired");
        };
        assert_eq!(first.release().await.unwrap(), Fenced::Applied);
        let Claiming::Acquired(zombie) = claim(&idem, &intent(1, 1)).await.unwrap() else {
            panic!("released keys are free");
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let Claiming::Acquired(owner) = claim(&idem, &intent(1, 30_000)).await.unwrap() else {
            panic!("a lapsed lease is taken over");
        };
        assert!(owner.takeover());
        assert_ne!(owner.token(), zombie.token());
        assert_eq!(
            zombie
                .complete(RecordStatus::Completed, b"{}")
                .await
                .unwrap(),
            Fenced::Lost,
            "the zombie's completion is fenced out"
        );
        assert_eq!(
            owner
                .complete(RecordStatus::Completed, b"{}")
                .await
                .unwrap(),
            Fenced::Applied
        );
    }

    #[tokio::test]
    async fn a_failing_store_is_an_error_never_a_claim() {
        let faults = Faults::seeded(1).fail_before(1.0);
        let idem = Idem::with_store(FaultyStore::new(MemoryStore::new(), faults));
        assert!(claim(&idem, &intent(1, 30_000)).await.is_err());
    }

    #[test]
    fn the_wait_is_the_rest_of_the_lease_and_never_more_than_a_lease() {
        let lease = Duration::from_secs(30);
        assert_eq!(
            retry_after(1_000 + 12_000, 1_000, lease),
            Duration::from_secs(12)
        );
        assert_eq!(
            retry_after(1_000, 5_000, lease),
            Duration::ZERO,
            "already lapsed"
        );
        assert_eq!(
            retry_after(100_000, 0, lease),
            lease,
            "a clock behind the owner's"
        );
    }
}
