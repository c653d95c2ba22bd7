//! Stores: where claims and results live.
//!
//! [`Store`] is the small async trait every backend implements: claim, complete, renew,
//! release, lookup, purge and a health check. The decision of a claim is made by one function,
//! [`decide`], that every backend calls on the record it holds, inside its own atomic section,
//! so the table below is written once:
//!
//! | store holds | and | claim answers |
//! |---|---|---|
//! | nothing, or a record past its TTL | | [`Claim::Acquired`], new `in_flight` record |
//! | a record | fingerprint differs | [`Claim::Mismatch`] (checked first) |
//! | `completed` | same fingerprint | [`Claim::Completed`] with the stored result |
//! | `in_flight`, lease live | same fingerprint | [`Claim::InFlight`] |
//! | `in_flight`, lease lapsed | same fingerprint | by [`Orphans`]: [`Claim::Acquired`] with `takeover` and a new token, or marked `unknown` and [`Claim::Unknown`] |
//! | `unknown` | same fingerprint | by [`Orphans`]: taken over for the tool's state check, or [`Claim::Unknown`] |
//!
//! Completion, renewal and release are fenced: they apply only while the record still carries
//! the caller's [`FencingToken`] and is `in_flight`. A completion settles the record as
//! `completed` (its result replays) or `unknown` (the effect may have happened; the key stays
//! blocked until a state check or an operator decides).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;

pub mod admin;
pub mod faulty;
pub mod memory;
pub(crate) mod open;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod read_first;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod replay_cache;
#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

/// The future every store operation returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Milliseconds since the Unix epoch, the time unit of records.
pub type UnixMillis = u64;

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

impl Record {
    /// The fields a claim decision reads ([`decide`]).
    pub(crate) fn held(&self) -> Held {
        Held {
            fingerprint: self.fingerprint,
            status: self.status,
            lease_expires_at: self.lease_expires_at,
            expires_at: self.expires_at,
        }
    }
}

/// What [`Store::health`] reports.
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
}

/// What a claim does to the record it finds: the decision table of the contract, in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No live record: insert a new `in_flight` one.
    Insert,
    /// An orphan (lapsed lease, or `unknown` under [`Orphans::Reconcile`]; same fingerprint):
    /// take it over with a new token, `in_flight` again.
    Takeover,
    /// A lapsed `in_flight` record under [`Orphans::Block`]: mark it `unknown`, answer
    /// [`Claim::Unknown`].
    MarkUnknown,
    /// An `unknown` record the policy does not reconcile: answer [`Claim::Unknown`], write nothing.
    Blocked,
    /// Same fingerprint, completed: replay.
    Replay,
    /// Different fingerprint.
    Mismatch,
    /// Same fingerprint, live lease.
    InFlight {
        /// When the lease lapses.
        lease_expires_at: UnixMillis,
    },
}

/// The fields of a record that a claim decision reads.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    /// The stored fingerprint.
    pub fingerprint: Fingerprint,
    /// The stored status.
    pub status: RecordStatus,
    /// The stored lease expiry.
    pub lease_expires_at: UnixMillis,
    /// The stored record expiry.
    pub expires_at: UnixMillis,
}

/// Decides a claim against the record a store holds for the key (if any).
///
/// Backends call this inside their atomic section (a transaction, a lock, a script); SQL and
/// Lua backends that cannot call Rust mirror it and are held to it by the conformance suite.
pub fn decide(
    held: Option<Held>,
    fingerprint: Fingerprint,
    now: UnixMillis,
    orphans: Orphans,
) -> Decision {
    let Some(held) = held.filter(|h| h.expires_at > now) else {
        return Decision::Insert;
    };
    if held.fingerprint != fingerprint {
        return Decision::Mismatch;
    }
    match (held.status, orphans) {
        (RecordStatus::Completed, _) => Decision::Replay,
        (RecordStatus::InFlight, _) if held.lease_expires_at > now => Decision::InFlight {
            lease_expires_at: held.lease_expires_at,
        },
        (RecordStatus::InFlight, Orphans::Block) => Decision::MarkUnknown,
        (RecordStatus::InFlight, _) | (RecordStatus::Unknown, Orphans::Reconcile) => {
            Decision::Takeover
        }
        (RecordStatus::Unknown, _) => Decision::Blocked,
    }
}

impl Decision {
    /// The claim's answer when the decision writes nothing (a replay answers with `result`), or
    /// `None` when it writes (an insert, a takeover, an orphan marked `unknown`): what a store
    /// that reads before it claims may answer from the read alone.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
    pub(crate) fn answer_without_writing(self, result: impl FnOnce() -> Vec<u8>) -> Option<Claim> {
        match self {
            Decision::Replay => Some(Claim::Completed { result: result() }),
            Decision::Mismatch => Some(Claim::Mismatch),
            Decision::InFlight { lease_expires_at } => Some(Claim::InFlight { lease_expires_at }),
            Decision::Blocked => Some(Claim::Unknown),
            Decision::Insert | Decision::Takeover | Decision::MarkUnknown => None,
        }
    }
}

/// The TLS error under a driver's error, if a TLS handshake is what failed: a `rustls::Error`
/// in the chain of sources (itself, or inside an `io::Error`), or, where a driver kept only its
/// text, a rustls message.
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(e);
    while let Some(error) = source {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(tls) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls.to_string());
        }
        let text = error.to_string();
        if [
            "invalid peer certificate",
            "received fatal alert",
            "peer is incompatible",
            "peer misbehaved",
        ]
        .iter()
        .any(|tls| text.contains(tls))
        {
            return Some(text);
        }
        source = error.source();
    }
    None
}

/// A URL query value with its `%XX` escapes decoded (a file name may hold any character).
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) fn percent_decoded(value: &str) -> String {
    percent_encoding::percent_decode_str(value)
        .decode_utf8_lossy()
        .into_owned()
}

/// `now + d` in milliseconds, saturating.
pub fn after(now: UnixMillis, d: Duration) -> UnixMillis {
    now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The core store: what every idempotent call needs, and nothing else.
///
/// Implementations must make [`Store::claim`] atomic per tenant + key and durable before they
/// answer [`Claim::Acquired`], and must pass the conformance suite
/// (the `conformance` module, behind the `conformance` feature).
pub trait Store: Send + Sync {
    /// The backend's name (`memory`, `sqlite`, …), for errors and reports.
    fn backend(&self) -> &'static str;

    /// Whether the store deletes expired records by itself (Redis key expiry), so that
    /// [`Store::purge_expired`] has nothing to do.
    fn expires_on_its_own(&self) -> bool {
        false
    }

    /// Claims a key (see the module docs for the decision table).
    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim>;

    /// Stores the result of a claimed key, if the token still owns it.
    fn complete<'a>(&'a self, completion: Completion<'a>) -> StoreFuture<'a, Fenced>;

    /// Extends the lease of a claimed `in_flight` record, if the token still owns it: the lease
    /// lapses at `now + lease`, and the record expires no earlier than that.
    fn renew<'a>(&'a self, renewal: Renewal<'a>) -> StoreFuture<'a, Fenced>;

    /// Deletes a claimed record, if the token still owns it, so the key is new again.
    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced>;

    /// Reads the record of a key, expired or not.
    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>>;

    /// Deletes at most `limit` records that expired at or before `now`; returns how many.
    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize>;

    /// Checks that the store answers and its schema is the one this build writes.
    fn health(&self) -> StoreFuture<'_, StoreHealth>;

    /// The PostgreSQL store this is, or wraps: transactional tools
    /// (`#[idempotent(…, transactional)]`) run their transactions on its database. `None` (the
    /// default) for every other store; a wrapper forwards its inner store's answer.
    #[cfg(feature = "postgres")]
    fn postgres(&self) -> Option<&postgres::PostgresStore> {
        None
    }
}

macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        impl<S: Store + ?Sized> Store for $ty {
            fn backend(&self) -> &'static str {
                (**self).backend()
            }
            fn expires_on_its_own(&self) -> bool {
                (**self).expires_on_its_own()
            }
            fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
                (**self).claim(req)
            }
            fn complete<'a>(&'a self, completion: Completion<'a>) -> StoreFuture<'a, Fenced> {
                (**self).complete(completion)
            }
            fn renew<'a>(&'a self, renewal: Renewal<'a>) -> StoreFuture<'a, Fenced> {
                (**self).renew(renewal)
            }
            fn release<'a>(
                &'a self,
                tenant: &'a str,
                key: IdempotencyKey,
                token: FencingToken,
            ) -> StoreFuture<'a, Fenced> {
                (**self).release(tenant, key, token)
            }
            fn lookup<'a>(
                &'a self,
                tenant: &'a str,
                key: IdempotencyKey,
            ) -> StoreFuture<'a, Option<Record>> {
                (**self).lookup(tenant, key)
            }
            fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
                (**self).purge_expired(now, limit)
            }
            fn health(&self) -> StoreFuture<'_, StoreHealth> {
                (**self).health()
            }
            #[cfg(feature = "postgres")]
            fn postgres(&self) -> Option<&postgres::PostgresStore> {
                (**self).postgres()
            }
        }
    )*};
}

forward_store!(&S, Arc<S>, Box<S>);

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(b: u8) -> Fingerprint {
        Fingerprint::from_bytes([b; 32])
    }

    fn held(status: RecordStatus, lease: UnixMillis, expires: UnixMillis) -> Option<Held> {
        Some(Held {
            fingerprint: fp(1),
            status,
            lease_expires_at: lease,
            expires_at: expires,
        })
    }

    #[test]
    fn the_decision_table() {
        use RecordStatus::*;
        let decide = |held, fp, now| super::decide(held, fp, now, Orphans::TakeOver);
        assert_eq!(decide(None, fp(1), 100), Decision::Insert);
        assert_eq!(
            decide(held(Completed, 0, 100), fp(1), 100),
            Decision::Insert,
            "expired"
        );
        assert_eq!(
            decide(held(Completed, 0, 200), fp(2), 100),
            Decision::Mismatch
        );
        assert_eq!(
            decide(held(InFlight, 150, 200), fp(2), 100),
            Decision::Mismatch
        );
        assert_eq!(
            decide(held(InFlight, 50, 200), fp(2), 100),
            Decision::Mismatch
        );
        assert_eq!(
            decide(held(Completed, 0, 200), fp(1), 100),
            Decision::Replay
        );
        assert_eq!(
            decide(held(InFlight, 150, 200), fp(1), 100),
            Decision::InFlight {
                lease_expires_at: 150
            }
        );
        assert_eq!(
            decide(held(InFlight, 100, 200), fp(1), 100),
            Decision::Takeover
        );
    }

    #[test]
    fn orphans_and_unknown_records_follow_the_policy() {
        use Orphans::*;
        use RecordStatus::*;
        let lapsed = held(InFlight, 100, 200);
        let unknown = held(Unknown, 0, 200);
        for (orphans, on_lapsed, on_unknown) in [
            (TakeOver, Decision::Takeover, Decision::Blocked),
            (Reconcile, Decision::Takeover, Decision::Takeover),
            (Block, Decision::MarkUnknown, Decision::Blocked),
        ] {
            assert_eq!(
                decide(lapsed, fp(1), 100, orphans),
                on_lapsed,
                "{orphans:?}"
            );
            assert_eq!(
                decide(unknown, fp(1), 100, orphans),
                on_unknown,
                "{orphans:?}"
            );
            // Whatever the policy: other arguments are a mismatch, a live lease is in flight,
            // and an expired record is a new intent.
            assert_eq!(
                decide(unknown, fp(2), 100, orphans),
                Decision::Mismatch,
                "{orphans:?}"
            );
            assert_eq!(
                decide(held(InFlight, 150, 200), fp(1), 100, orphans),
                Decision::InFlight {
                    lease_expires_at: 150
                }
            );
            assert_eq!(
                decide(held(Unknown, 0, 100), fp(1), 100, orphans),
                Decision::Insert
            );
        }
    }

    #[test]
    fn tokens_are_positive_and_distinct() {
        let a = FencingToken::generate();
        let b = FencingToken::generate();
        assert_ne!(a, b);
        assert!(a.get() > 0 && a.get() <= i64::MAX as u64);
    }
}
