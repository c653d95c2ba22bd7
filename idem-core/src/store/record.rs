//! The records of a store and what its operations carry: the [`FencingToken`] of a claim,
//! the requests ([`ClaimRequest`], [`Completion`], [`Renewal`]) and the answers ([`Claim`],
//! [`Fenced`]), a stored [`Record`] and its [`RecordStatus`], and what [`StoreHealth`] reports.

use std::time::Duration;

use crate::clock::UnixMillis;
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;

/// Proof of ownership of a claimed key: a fresh random 63-bit value for every claim.
///
/// A completion or release carrying an older token (a "zombie" owner whose lease lapsed and was
/// taken over) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A new, unpredictable token (never zero, fits a signed 64-bit column): 63 bits of a
    /// random UUID, from the operating system's generator, or with the `postgres` and `redis`
    /// features from `rand`'s thread-local generator seeded by it (no system call per token).
    pub fn generate() -> Self {
        let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
        FencingToken(((hi ^ lo) & (i64::MAX as u64)).max(1))
    }

    /// Rebuilds a token a store kept.
    pub const fn from_raw(raw: u64) -> Self {
        FencingToken(raw)
    }

    /// The raw value, for storing.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// What a claim asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The tenant; every lookup is by tenant + key.
    pub tenant: &'a str,
    /// The derived key.
    pub key: IdempotencyKey,
    /// The tool's stable name (kept for operators; the key already depends on it).
    pub tool: &'a str,
    /// The fingerprint of the arguments.
    pub fingerprint: Fingerprint,
    /// The caller's clock.
    pub now: UnixMillis,
    /// How long a new `in_flight` record blocks other callers.
    pub lease: Duration,
    /// How long the record lives (from creation while in flight, from completion after).
    pub ttl: Duration,
    /// What to do with a record whose owner may have died before it finished.
    pub orphans: Orphans,
}

/// What a claim does with a record whose outcome is not known: an `in_flight` record whose
/// lease lapsed (its owner probably crashed, maybe after the effect) or an `unknown` one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orphans {
    /// Take a lapsed `in_flight` record over with a new token (the body runs again: the
    /// default for tools without a state check). An `unknown` record stays blocked.
    TakeOver,
    /// The tool has a state check that decides: lapsed `in_flight` **and** `unknown` records
    /// are taken over, and the caller runs the check before anything else.
    Reconcile,
    /// Never run the body again blindly: a lapsed `in_flight` record is marked `unknown`, and
    /// `unknown` records stay blocked until an operator resolves them.
    Block,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller owns the key now and must run the body, then complete or release.
    Acquired {
        /// The token that fences the completion.
        token: FencingToken,
        /// Whether an orphaned `in_flight` record (lapsed lease) was taken over.
        takeover: bool,
    },
    /// The key is completed with the same fingerprint: here is the stored result.
    Completed {
        /// The stored result, as the runtime encoded it.
        result: Vec<u8>,
    },
    /// The key is held with a different fingerprint.
    Mismatch,
    /// The key is held by a live call with the same fingerprint.
    InFlight {
        /// When that call's lease lapses.
        lease_expires_at: UnixMillis,
    },
    /// The key is `unknown` (same fingerprint): an earlier call may have had its effect, and
    /// the claim's [`Orphans`] policy does not allow running the body again.
    Unknown,
}

/// A fenced completion: settle the key as `status` with `result` if `token` still owns it.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The key.
    pub key: IdempotencyKey,
    /// The token the claim returned.
    pub token: FencingToken,
    /// How the record settles: [`RecordStatus::Completed`] (the result replays) or
    /// [`RecordStatus::Unknown`] (the effect may have happened; the key is blocked).
    pub status: RecordStatus,
    /// The encoded result (empty for `unknown`).
    pub result: &'a [u8],
    /// The caller's clock.
    pub now: UnixMillis,
    /// The record lives this long after completion.
    pub ttl: Duration,
    /// Whether callers may be waiting for this key (its tool declares `wait`): the store then
    /// announces the settlement to the [`Watch`](super::Watch)es of every process.
    pub notify: bool,
}

/// A fenced renewal: extend the lease of `key` to `now + lease` if `token` still owns it and
/// it is still `in_flight`.
///
/// The runtime renews the lease of a running body every third of its lease, so a body that runs
/// longer than its lease is never taken over while its process lives. A renewal also keeps the
/// record alive at least as long as its lease (a body running past its TTL is not forgotten).
#[derive(Debug, Clone, Copy)]
pub struct Renewal<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The key.
    pub key: IdempotencyKey,
    /// The token the claim returned.
    pub token: FencingToken,
    /// The caller's clock.
    pub now: UnixMillis,
    /// The lease from `now`.
    pub lease: Duration,
}

/// Whether a fenced write applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The token still owned the record: the write is done.
    Applied,
    /// The record is gone or owned by another token: nothing was written.
    Lost,
}

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStatus {
    /// Claimed; the body is running (or its owner died and the lease will lapse).
    InFlight,
    /// The body finished and its result is stored.
    Completed,
    /// The effect may have happened and nobody knows: the body failed with an error classified
    /// unknown, or its owner died and the tool never runs orphans again blindly. Blocked until
    /// the tool's state check or an operator decides.
    Unknown,
}

impl RecordStatus {
    /// The name stores write: `in_flight`, `completed` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::InFlight => "in_flight",
            RecordStatus::Completed => "completed",
            RecordStatus::Unknown => "unknown",
        }
    }

    /// Parses [`RecordStatus::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "in_flight" => Some(RecordStatus::InFlight),
            "completed" => Some(RecordStatus::Completed),
            "unknown" => Some(RecordStatus::Unknown),
            _ => None,
        }
    }
}

/// One stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The tenant.
    pub tenant: String,
    /// The key.
    pub key: IdempotencyKey,
    /// The tool's stable name.
    pub tool: String,
    /// The fingerprint of the first call's arguments.
    pub fingerprint: Fingerprint,
    /// In flight or completed.
    pub status: RecordStatus,
    /// The current owner's token.
    pub token: FencingToken,
    /// When the lease of an `in_flight` record lapses.
    pub lease_expires_at: UnixMillis,
    /// When the record was created.
    pub created_at: UnixMillis,
    /// When the record expires; after this the key is new again.
    pub expires_at: UnixMillis,
    /// The stored result of a completed record.
    pub result: Option<Vec<u8>>,
    /// Why an operator resolved the record, if one did.
    pub note: Option<String>,
}

/// What [`Store::health`](crate::store::Store::health) reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreHealth {
    /// The backend's name.
    pub backend: &'static str,
    /// The schema version found in the store.
    pub schema_version: u32,
    /// The schema version this build writes.
    pub expected_schema_version: u32,
    /// Whether a claim is durable (survives a crash of the process and of the machine) before
    /// the body runs.
    pub durable: bool,
    /// Why the store is not durable, in the operator's terms (`None` when it is, or when the
    /// backend has nothing to add).
    pub detail: Option<String>,
    /// Whether the connections to the store are encrypted (TLS); `None` for a store without a
    /// network connection, or one that cannot tell (a connection handed in by its owner).
    pub encrypted: Option<bool>,
    /// How a completion, a renewal and a release are fenced against a claim that lost its key,
    /// where the backend can do it more than one way (Redis: the server's own compare-and-set,
    /// or Lua scripts); `None` where one transaction or script always does it.
    pub fencing: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_positive_and_distinct() {
        let a = FencingToken::generate();
        let b = FencingToken::generate();
        assert_ne!(a, b);
        assert!(a.get() > 0 && a.get() <= i64::MAX as u64);
    }
}
