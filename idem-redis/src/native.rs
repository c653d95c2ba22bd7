//! Fenced writes as one compare-and-set of the whole record: by the server's own command where
//! it has one, `SET … IFEQ` (Valkey 8.1 and later, Redis 8.4 and later) and `DELIFEQ` (Valkey
//! 9), else by a four-line script that does the same (`COMPARE_AND_SET`). The record's value
//! carries its token, so comparing it with the one the claim wrote fences the write exactly as
//! the full scripts do, and costs the server a plain `SET` (or the script's `GET` and `SET`)
//! instead of the full script's upkeep of streams and blobs.
//!
//! | operation | compare-and-set, when | else |
//! |---|---|---|
//! | completion | the store holds the record's value as its claim (or its last renewal) wrote it, the call appended no chunks, the result is not a blob: `SET KEY NEW IFEQ OLD PX TTL`, and the `PUBLISH` of an announced completion in the same pipeline | the full completion script |
//! | renewal | the same, and the record outlives the new lease: `SET KEY NEW IFEQ OLD KEEPTTL` | the full renewal script |
//! | release | the same: `DELIFEQ KEY OLD`, and the `PUBLISH` | the full release script |
//! | a compare-and-set that finds another value | | the full script decides, on the record as it is |
//!
//! The store knows a record's exact value only when its claim wrote it whole: a new key's
//! record (a takeover keeps the orphan's expiry and creation time, which the claim did not
//! read). It keeps that value, per key and token, from the claim to the settlement
//! ([`Written`]); a claim taken over, a batch's, a call that streams, or a value the store let go
//! of settle by the full scripts. A compare-and-set that does not apply hands over to the full
//! script, which tells a second delivery of this very write (applied), a token that lost the
//! key, and a record an operator or a blocked claim changed meanwhile, as it always has.
//!
//! The server is probed once, when the store opens (never by its name or version: Valkey
//! reports `redis_version:7.2.4`): `SET PREFIX:probe x IFEQ x` and `DELIFEQ PREFIX:probe x` on
//! a key that does not exist, so nothing is written. `fencing=script` in the URL keeps the
//! scripts on a server that has both.

use std::collections::HashMap;
use std::sync::Mutex;

use idem_core::key::IdempotencyKey;
use idem_core::store::{FencingToken, UnixMillis};

use super::connection::Connection;
use super::layout;

/// Probes what the server compares and sets on its own, on a key under `prefix` that does not
/// exist (so nothing is written): a server without the command answers an error.
pub(crate) async fn probe(conn: &Connection, prefix: &str) -> Fencing {
    let key = format!("{prefix}:probe");
    let set: redis::RedisResult<Option<Vec<u8>>> = redis::cmd("SET")
        .arg(&key)
        .arg("x")
        .arg("IFEQ")
        .arg("x")
        .query_async(&mut conn.clone())
        .await;
    let set = matches!(set, Ok(None));
    let delete = set && {
        let deleted: redis::RedisResult<i64> = redis::cmd("DELIFEQ")
            .arg(&key)
            .arg("x")
            .query_async(&mut conn.clone())
            .await;
        matches!(deleted, Ok(0))
    };
    Fencing { set, delete }
}

/// What the server compares and sets on its own (see the module docs); the rest is the
/// compare-and-set script's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Fencing {
    /// `SET … IFEQ`: completions and renewals.
    pub(crate) set: bool,
    /// `DELIFEQ`: releases.
    pub(crate) delete: bool,
}

impl Fencing {
    /// How the store fences its writes, as the health check says it.
    pub(crate) fn describe(self) -> String {
        match (self.set, self.delete) {
            (true, true) => "the server's compare-and-set (SET … IFEQ, DELIFEQ)".into(),
            (true, false) => {
                "the server's compare-and-set (SET … IFEQ); releases by Lua script".into()
            }
            _ => "Lua scripts (a compare-and-set script for a new key's claim)".into(),
        }
    }
}

/// The most records [`Written`] holds: past it, new claims settle by script.
const MOST_HELD: usize = 65_536;

/// Past this many, a new entry first drops those whose lease lapsed.
const PRUNE_FROM: usize = 4_096;

/// The values the store wrote for the claims it holds, by key and token (see the module docs).
#[derive(Default)]
pub(crate) struct Written {
    held: Mutex<Kept>,
}

/// The values, and the size at which [`Written::keep`] next drops those whose lease lapsed.
#[derive(Default)]
struct Kept {
    values: HashMap<(IdempotencyKey, FencingToken), Held>,
    /// [`PRUNE_FROM`], or twice what a pruning left (0 before the first): each entry pays for
    /// at most a couple of scans, however many claims are live at once.
    prune_at: usize,
}

/// A record's value as the store last wrote it, and when that value's lease lapses.
struct Held {
    value: Vec<u8>,
    lease_expires_at: UnixMillis,
}

impl Written {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `value`, the record of `key` as the claim of `token` wrote it. An entry that is
    /// never settled (a caller dropped mid-call) goes once its lease lapsed and the map grew.
    pub(crate) fn keep(
        &self,
        key: IdempotencyKey,
        token: FencingToken,
        value: Vec<u8>,
        now: UnixMillis,
    ) {
        let lease_expires_at = lease_of(&value);
        let mut kept = self.kept();
        if kept.values.len() >= kept.prune_at.max(PRUNE_FROM) {
            kept.values.retain(|_, h| h.lease_expires_at > now);
            kept.prune_at = kept.values.len() * 2;
        }
        if kept.values.len() < MOST_HELD {
            kept.values.insert(
                (key, token),
                Held {
                    value,
                    lease_expires_at,
                },
            );
        }
    }

    /// The value of `key` under `token`, let go of: its settlement is under way.
    pub(crate) fn take(&self, key: IdempotencyKey, token: FencingToken) -> Option<Vec<u8>> {
        self.kept().values.remove(&(key, token)).map(|h| h.value)
    }

    /// Lets go of the value of `key` under `token`: it is no longer the record's, or the
    /// record's settlement must be a script's (chunks were appended).
    pub(crate) fn forget(&self, key: IdempotencyKey, token: FencingToken) {
        self.kept().values.remove(&(key, token));
    }

    /// How many values are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kept().values.len()
    }
}

/// The lease's expiry a record's value carries (0 when unreadable: the first to be pruned).
fn lease_of(value: &[u8]) -> UnixMillis {
    value
        .get(layout::LEASE)
        .and_then(layout::digits)
        .unwrap_or(0)
}

/// The completed record a native completion writes over `held` (an in-flight record, which
/// ends with its tool name): the script's `complete` on the same bytes.
pub(crate) fn completed(held: &[u8], status: &[u8], expires_at: &str, result: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(held.len() + result.len());
    out.extend_from_slice(&held[layout::FINGERPRINT]);
    out.extend_from_slice(status);
    out.extend_from_slice(expires_at.as_bytes());
    out.extend_from_slice(&held[layout::LEASE.start..]);
    out.extend_from_slice(result);
    out
}

/// The record a native renewal writes over `held`: the lease's expiry replaced, as the
/// script's `renew` does for a record that outlives the lease. `None` when the record would
/// expire first (the script then lengthens its life too).
pub(crate) fn renewed(held: &[u8], lease_expires_at: &str) -> Option<Vec<u8>> {
    let expires_at: UnixMillis = layout::digits(held.get(layout::EXPIRES)?)?;
    if expires_at < lease_expires_at.parse().ok()? {
        return None;
    }
    let mut out = held.to_vec();
    out.get_mut(layout::LEASE)?
        .copy_from_slice(lease_expires_at.as_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::decode_record;
    use idem_core::store::RecordStatus;

    fn in_flight(lease: u64, expires: u64) -> Vec<u8> {
        let mut v = vec![7u8; 32];
        v.push(b'i');
        v.extend(format!("{expires:016}{lease:016}{:016}{:019}{:04}tool", 5, 42, 4).bytes());
        v
    }

    /// The values written natively read back as the scripts' would: the same record, its
    /// status, expiry, lease and result changed and nothing else.
    #[test]
    fn native_values_are_the_scripts_records() {
        let key = IdempotencyKey::from_bytes([1; 32]);
        let held = in_flight(1_000, 9_000);
        let done = completed(&held, b"c", &format!("{:016}", 20_000), b"{\"ok\":1}");
        let record = decode_record("test", "t", key, done.clone()).expect("a record");
        assert_eq!(record.status, RecordStatus::Completed);
        assert_eq!(record.expires_at, 20_000);
        assert_eq!(record.lease_expires_at, 1_000);
        assert_eq!(record.created_at, 5);
        assert_eq!(record.token, FencingToken::from_raw(42));
        assert_eq!(record.tool, "tool");
        assert_eq!(record.result.as_deref(), Some(&b"{\"ok\":1}"[..]));

        let later = renewed(&held, &format!("{:016}", 4_000)).expect("outlives the lease");
        let record = decode_record("test", "t", key, later.clone()).expect("a record");
        assert_eq!(record.lease_expires_at, 4_000);
        assert_eq!(record.expires_at, 9_000);
        assert_eq!(record.status, RecordStatus::InFlight);
        assert_eq!(
            renewed(&held, &format!("{:016}", 9_001)),
            None,
            "the script lengthens its life"
        );
    }

    /// Values are kept per key and token, let go of at settlement, and the map never grows
    /// past its bound with values whose leases lapsed.
    #[test]
    fn values_are_kept_per_claim_and_pruned_once_their_leases_lapse() {
        let written = Written::default();
        let key = |n: u32| {
            let mut bytes = [0u8; 32];
            bytes[..4].copy_from_slice(&n.to_be_bytes());
            IdempotencyKey::from_bytes(bytes)
        };
        let (mine, theirs) = (FencingToken::from_raw(1), FencingToken::from_raw(2));
        written.keep(key(0), mine, in_flight(100, 900), 0);
        assert_eq!(written.take(key(0), theirs), None);
        assert_eq!(written.take(key(0), mine), Some(in_flight(100, 900)));
        assert_eq!(written.take(key(0), mine), None);

        for n in 0..PRUNE_FROM as u32 {
            written.keep(key(n), mine, in_flight(100, 900), 0);
        }
        assert_eq!(written.len(), PRUNE_FROM);
        // At 200, every lease above has lapsed: the next claim's entry is the only one left.
        written.keep(key(u32::MAX), mine, in_flight(300, 900), 200);
        assert_eq!(written.len(), 1);
        written.forget(key(u32::MAX), mine);
        assert_eq!(written.len(), 0);
    }
}
