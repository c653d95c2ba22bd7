//! The decision table of the contract, in one place: what a claim does to the record it finds.
//! Every backend calls [`decide`] inside its own atomic section (or mirrors it in SQL or Lua,
//! held to it by the conformance suite).

use crate::clock::UnixMillis;
use crate::fingerprint::Fingerprint;
use crate::store::record::{Claim, Orphans, Record, RecordStatus};

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
    pub fn answer_without_writing(self, result: impl FnOnce() -> Vec<u8>) -> Option<Claim> {
        match self {
            Decision::Replay => Some(Claim::Completed { result: result() }),
            Decision::Mismatch => Some(Claim::Mismatch),
            Decision::InFlight { lease_expires_at } => Some(Claim::InFlight { lease_expires_at }),
            Decision::Blocked => Some(Claim::Unknown),
            Decision::Insert | Decision::Takeover | Decision::MarkUnknown => None,
        }
    }
}

impl Record {
    /// The fields a claim decision reads ([`decide`]).
    pub fn held(&self) -> Held {
        Held {
            fingerprint: self.fingerprint,
            status: self.status,
            lease_expires_at: self.lease_expires_at,
            expires_at: self.expires_at,
        }
    }
}

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
}
