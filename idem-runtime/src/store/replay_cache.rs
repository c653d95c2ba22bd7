//! A small in-process cache of completed records, for the replay path.
//!
//! A completed record never changes until it expires: the store contract lets no claim,
//! completion or release touch it, and purge only removes expired records. So a replay (or a
//! mismatch) found once can be answered again from memory, without a store round trip, until the
//! record expires. Two bounds keep that honest: entries are dropped after [`MAX_AGE`] anyway (so
//! an operator who deletes a record by hand is seen within seconds), and only results up to
//! [`MAX_RESULT`] bytes are kept, at most `capacity` of them (oldest evicted first).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Claim, UnixMillis};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;

/// How long an entry is trusted at most, whatever the record's own expiry.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(10);
/// Largest result kept.
pub(crate) const MAX_RESULT: usize = 16 * 1024;
/// Default number of entries.
pub(crate) const DEFAULT_CAPACITY: usize = 1024;

/// Parses the `replay_cache=N` option every store URL takes.
pub(crate) fn parse_capacity(value: &str) -> Result<usize, String> {
    value.parse().map_err(|_| {
        format!("`replay_cache` must be a number of entries (0 disables it), not `{value}`")
    })
}

struct Entry {
    tenant: Box<str>,
    fingerprint: Fingerprint,
    result: Arc<[u8]>,
    expires_at: UnixMillis,
    cached_at: Instant,
}

#[derive(Default)]
struct Entries {
    map: HashMap<IdempotencyKey, Entry>,
    order: VecDeque<IdempotencyKey>,
}

pub(crate) struct ReplayCache {
    capacity: usize,
    entries: Mutex<Entries>,
}

impl ReplayCache {
    pub(crate) fn new(capacity: usize) -> Self {
        ReplayCache {
            capacity,
            entries: Mutex::new(Entries::default()),
        }
    }

    /// The answer for a claim, if a live completed record of this tenant + key is cached.
    pub(crate) fn get(
        &self,
        tenant: &str,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        now: UnixMillis,
    ) -> Option<Claim> {
        if self.capacity == 0 {
            return None;
        }
        let entries = self.entries.lock().ok()?;
        let entry = entries.map.get(key)?;
        let live = entry.expires_at > now && entry.cached_at.elapsed() < MAX_AGE;
        if !live || &*entry.tenant != tenant {
            return None;
        }
        Some(if entry.fingerprint == fingerprint {
            Claim::Completed {
                result: entry.result.to_vec(),
            }
        } else {
            Claim::Mismatch
        })
    }

    /// Remembers a completed record.
    pub(crate) fn put(
        &self,
        tenant: &str,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
        result: &[u8],
        expires_at: UnixMillis,
    ) {
        if self.capacity == 0 || result.len() > MAX_RESULT {
            return;
        }
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let entry = Entry {
            tenant: tenant.into(),
            fingerprint,
            result: result.into(),
            expires_at,
            cached_at: Instant::now(),
        };
        if entries.map.insert(key, entry).is_none() {
            entries.order.push_back(key);
        }
        while entries.map.len() > self.capacity {
            match entries.order.pop_front() {
                Some(oldest) => {
                    entries.map.remove(&oldest);
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::derive_key;

    fn key(n: u8) -> IdempotencyKey {
        IdempotencyKey::from_bytes([n; 32])
    }

    #[test]
    fn answers_replays_and_mismatches_only_while_live() {
        let cache = ReplayCache::new(2);
        let fp = Fingerprint::from_bytes([1; 32]);
        cache.put("t", key(1), fp, b"r", 100);
        assert_eq!(
            cache.get("t", &key(1), fp, 99),
            Some(Claim::Completed {
                result: b"r".to_vec()
            })
        );
        assert_eq!(
            cache.get("t", &key(1), Fingerprint::from_bytes([2; 32]), 99),
            Some(Claim::Mismatch)
        );
        assert_eq!(cache.get("t", &key(1), fp, 100), None, "expired");
        assert_eq!(
            cache.get("other", &key(1), fp, 99),
            None,
            "another tenant's record"
        );
    }

    #[test]
    fn is_bounded() {
        let cache = ReplayCache::new(2);
        let fp = Fingerprint::from_bytes([1; 32]);
        for n in 0..3 {
            cache.put("t", key(n), fp, b"r", 100);
        }
        assert_eq!(cache.get("t", &key(0), fp, 1), None, "oldest evicted");
        assert!(cache.get("t", &key(2), fp, 1).is_some());
        cache.put("t", key(9), fp, &vec![0; MAX_RESULT + 1], 100);
        assert_eq!(cache.get("t", &key(9), fp, 1), None, "too large to keep");
        let off = ReplayCache::new(0);
        off.put("t", derive_key("t", "x", &[]), fp, b"r", 100);
        assert_eq!(off.get("t", &derive_key("t", "x", &[]), fp, 1), None);
    }
}
