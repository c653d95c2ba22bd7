//! A small in-process cache of completed records, for the replay path.
//!
//! A completed record never changes until it expires: the store contract lets no claim,
//! completion or release touch it, and purge only removes expired records. So a replay (or a
//! mismatch) found once can be answered again from memory, without a store round trip, until the
//! record expires. Two bounds keep that honest: entries are dropped after [`MAX_AGE`] anyway (so
//! an operator who deletes a record by hand is seen within seconds), and only results up to
//! [`MAX_RESULT`] bytes are kept. Both are judged by the claim's own `now` (the clock the record's
//! expiry is judged by), so that a hit reads no clock of its own.
//!
//! The cache is weighed in bytes (`replay_cache=N` KiB) and evicts by S3-FIFO (quick_cache): a
//! record seen once enters a small probationary queue and leaves it unless it is asked for again,
//! so an agent fleet cycling over more intents than fit never flushes the records asked for
//! again and again. Once it is full, a record comes in only if its key was asked for more often
//! lately than the last one evicted (`admission.rs`, TinyLFU): a replay the cache cannot answer
//! then costs a lookup and a few counters, without copying its result into an entry that would
//! leave before it is asked for again.

mod admission;

use std::sync::Arc;
use std::time::Duration;

use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};

use self::admission::Admission;
use super::{Claim, ClaimRequest, UnixMillis, after};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;

/// How long an entry is trusted at most, whatever the record's own expiry.
pub const MAX_AGE: Duration = Duration::from_secs(10);
/// Largest result kept.
pub const MAX_RESULT: usize = 16 * 1024;
/// Default size, in KiB.
pub const DEFAULT_CAPACITY: usize = 1024;
/// What an entry weighs besides its tenant and result: the key, the fingerprint, the times and
/// the cache's own bookkeeping.
const ENTRY_OVERHEAD: usize = 160;

/// Parses the `replay_cache=N` option every store URL takes.
pub fn parse_capacity(value: &str) -> Result<usize, String> {
    value.parse().map_err(|_| {
        format!("`replay_cache` must be a size in KiB (0 disables the cache), not `{value}`")
    })
}

/// A cached record. Its tenant and result share one buffer, so that caching a record (what
/// every miss does) allocates twice (the buffer, the shared entry), and a hit clones a pointer.
struct Entry {
    /// The tenant's bytes, then the result's.
    bytes: Box<[u8]>,
    tenant_len: usize,
    fingerprint: Fingerprint,
    /// The record's expiry, or [`MAX_AGE`] after the entry was cached if that comes first.
    trusted_until: UnixMillis,
}

impl Entry {
    fn tenant(&self) -> &[u8] {
        &self.bytes[..self.tenant_len]
    }

    fn result(&self) -> &[u8] {
        &self.bytes[self.tenant_len..]
    }
}

/// An entry weighs its bytes.
#[derive(Clone)]
struct Bytes;

impl Weighter<IdempotencyKey, Arc<Entry>> for Bytes {
    fn weight(&self, _key: &IdempotencyKey, entry: &Arc<Entry>) -> u64 {
        (ENTRY_OVERHEAD + entry.bytes.len()) as u64
    }
}

/// Tells the admission policy which keys the cache evicts.
#[derive(Clone)]
struct Evictions(Arc<Admission>);

impl Lifecycle<IdempotencyKey, Arc<Entry>> for Evictions {
    type RequestState = ();

    fn on_evict(&self, _: &mut (), key: IdempotencyKey, _: Arc<Entry>) {
        self.0.evicted(&key);
    }
}

type Entries = Cache<IdempotencyKey, Arc<Entry>, Bytes, DefaultHashBuilder, Evictions>;

/// Completed records a claim may answer from memory (see the module docs); shared by a
/// store's clones.
pub struct ReplayCache {
    entries: Option<(Entries, Arc<Admission>)>,
}

impl ReplayCache {
    /// A cache of `kib` KiB; none at 0.
    pub fn new(kib: usize) -> Self {
        let bytes = kib.saturating_mul(1024);
        ReplayCache {
            entries: (bytes > 0).then(|| {
                // The estimate sizes the table up front: entries of a few hundred bytes.
                let estimate = (bytes / 256).max(16);
                let admission = Arc::new(Admission::new(estimate));
                let entries = Cache::with(
                    estimate,
                    bytes as u64,
                    Bytes,
                    DefaultHashBuilder::default(),
                    Evictions(admission.clone()),
                );
                (entries, admission)
            }),
        }
    }

    /// The answer for `req`, if a live completed record of its tenant + key is cached. Every
    /// question counts towards the key's popularity, answered or not.
    pub fn get(&self, req: &ClaimRequest<'_>) -> Option<Claim> {
        let (entries, admission) = self.entries.as_ref()?;
        admission.count(&req.key);
        let entry = entries.get(&req.key)?;
        if entry.trusted_until <= req.now {
            if entries.remove(&req.key).is_some() {
                admission.removed();
            }
            return None;
        }
        if entry.tenant() != req.tenant.as_bytes() {
            return None;
        }
        Some(if entry.fingerprint == req.fingerprint {
            Claim::Completed {
                result: entry.result().to_vec(),
            }
        } else {
            Claim::Mismatch
        })
    }

    /// Remembers the completed record that answered `req` (a replay: its fingerprint is the
    /// request's) with `result`, until `expires_at`, if the cache admits it: when full, only a
    /// key asked for more often lately than the last one evicted comes in.
    pub fn put(&self, req: &ClaimRequest<'_>, result: &[u8], expires_at: UnixMillis) {
        let Some((entries, admission)) = &self.entries else {
            return;
        };
        if result.len() > MAX_RESULT || !admission.admits(&req.key) {
            return;
        }
        let entry = Entry {
            bytes: [req.tenant.as_bytes(), result].concat().into_boxed_slice(),
            tenant_len: req.tenant.len(),
            fingerprint: req.fingerprint,
            trusted_until: expires_at.min(after(req.now, MAX_AGE)),
        };
        entries.insert(req.key, Arc::new(entry));
    }
}

#[cfg(test)]
mod tests {
    use sha2::Digest as _;

    use super::*;
    use crate::key::derive_key;
    use crate::store::Orphans;

    fn key(n: u8) -> IdempotencyKey {
        IdempotencyKey::from_bytes([n; 32])
    }

    /// The `n`th of many keys spread as derived keys are (a digest), for the admission policy,
    /// which counts a key by its first bytes.
    pub(super) fn spread_key(n: u32) -> IdempotencyKey {
        IdempotencyKey::from_bytes(sha2::Sha256::digest(n.to_le_bytes()).into())
    }

    /// A claim of `key` in `tenant` with fingerprint `fp`, made at `now`.
    fn req(tenant: &str, key: IdempotencyKey, fp: u8, now: UnixMillis) -> ClaimRequest<'_> {
        ClaimRequest {
            tenant,
            key,
            tool: "tool",
            fingerprint: Fingerprint::from_bytes([fp; 32]),
            now,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
            orphans: Orphans::TakeOver,
        }
    }

    #[test]
    fn answers_replays_and_mismatches_only_while_live() {
        let cache = ReplayCache::new(2);
        cache.put(&req("t", key(1), 1, 0), b"r", 100);
        assert_eq!(
            cache.get(&req("t", key(1), 1, 99)),
            Some(Claim::Completed {
                result: b"r".to_vec()
            })
        );
        assert_eq!(cache.get(&req("t", key(1), 2, 99)), Some(Claim::Mismatch));
        assert_eq!(
            cache.get(&req("other", key(1), 1, 99)),
            None,
            "another tenant's record"
        );
        assert_eq!(cache.get(&req("t", key(1), 1, 100)), None, "expired");
        assert_eq!(
            cache.get(&req("t", key(1), 1, 99)),
            None,
            "an expired entry is gone"
        );
    }

    /// A record that lives a day is trusted for [`MAX_AGE`] after it was cached, by the clock
    /// of the claims that ask, then read from the store again.
    #[test]
    fn trusts_an_entry_for_max_age_at_most() {
        let cache = ReplayCache::new(2);
        let day = 86_400_000;
        let cached_at = 1_000;
        cache.put(&req("t", key(1), 1, cached_at), b"r", day);
        let max_age = u64::try_from(MAX_AGE.as_millis()).unwrap();
        assert!(
            cache
                .get(&req("t", key(1), 1, cached_at + max_age - 1))
                .is_some()
        );
        assert_eq!(cache.get(&req("t", key(1), 1, cached_at + max_age)), None);
    }

    #[test]
    fn is_bounded_in_bytes() {
        let cache = ReplayCache::new(1);
        for n in 0..100 {
            cache.put(&req("t", key(n), 1, 0), &[0; 100], 100);
        }
        let kept = (0..100)
            .filter(|n| cache.get(&req("t", key(*n), 1, 1)).is_some())
            .count();
        assert!(
            kept > 0 && kept * (ENTRY_OVERHEAD + 101) <= 1024,
            "{kept} entries kept"
        );
        cache.put(&req("t", key(200), 1, 0), &vec![0; MAX_RESULT + 1], 100);
        assert_eq!(
            cache.get(&req("t", key(200), 1, 1)),
            None,
            "too large to keep"
        );
        let off = ReplayCache::new(0);
        off.put(&req("t", derive_key("t", "x", &[]), 1, 0), b"r", 100);
        assert_eq!(off.get(&req("t", derive_key("t", "x", &[]), 1, 1)), None);
    }

    /// Replays cycling over ten times the intents that fit, as the claims ask the cache (a get,
    /// then a put on a miss): without admission every record enters and leaves before it is asked
    /// for again, and no replay is ever answered from memory. With it, the cache keeps a fixed
    /// part of the cycle and answers it at every turn, and the other misses leave it alone.
    #[test]
    fn a_cycle_over_ten_times_what_fits_keeps_a_part_of_it() {
        let cache = ReplayCache::new(64);
        let fits = 64 * 1024 / (ENTRY_OVERHEAD + 101);
        let keys: Vec<_> = (0..10 * fits as u32).map(spread_key).collect();
        let (entries, _) = cache.entries.as_ref().unwrap();
        let mut per_round = Vec::new();
        for _ in 0..8 {
            let mut hits = 0;
            let mut admitted = 0;
            for k in &keys {
                let r = req("t", *k, 1, 1);
                if cache.get(&r).is_some() {
                    hits += 1;
                } else {
                    cache.put(&r, &[0; 100], 100);
                    admitted += usize::from(entries.peek(k).is_some());
                }
            }
            per_round.push((hits, admitted));
        }
        for &(hits, admitted) in &per_round[3..] {
            assert!(
                hits >= fits / 2 && admitted <= fits / 4,
                "(replays answered from memory, records taken in) per round of {} with {fits} \
                 fitting: {per_round:?}",
                keys.len()
            );
        }
    }

    /// Entries of a full cache are trusted for [`MAX_AGE`], then read from the store again: they
    /// come back in, as popular as ever, instead of leaving the cache empty.
    #[test]
    fn a_full_cache_takes_back_the_records_it_trusted_long_enough() {
        let cache = ReplayCache::new(8);
        let keys: Vec<_> = (0..100u32).map(spread_key).collect();
        for k in &keys {
            let r = req("t", *k, 1, 1);
            if cache.get(&r).is_none() {
                cache.put(&r, &[0; 100], u64::MAX);
            }
        }
        let kept: Vec<_> = keys
            .iter()
            .filter(|k| cache.get(&req("t", **k, 1, 2)).is_some())
            .collect();
        assert!(!kept.is_empty());
        let later = 2 + u64::try_from(MAX_AGE.as_millis()).unwrap();
        for k in &kept {
            let r = req("t", **k, 1, later);
            assert_eq!(cache.get(&r), None, "trusted long enough");
            cache.put(&r, &[0; 100], u64::MAX);
        }
        let back = kept
            .iter()
            .filter(|k| cache.get(&req("t", ***k, 1, later + 1)).is_some())
            .count();
        assert_eq!(back, kept.len());
    }

    /// A working set twice the cache, cycled through over and over (an agent fleet replaying
    /// the intents it just completed): a FIFO or LRU cache keeps none of it when it is asked
    /// again; the records asked for again and again are kept.
    #[test]
    fn a_scan_larger_than_the_cache_does_not_flush_what_is_asked_for_again() {
        let cache = ReplayCache::new(64);
        let hot: Vec<_> = (0..20u8)
            .map(|n| IdempotencyKey::from_bytes([n; 32]))
            .collect();
        for k in &hot {
            cache.put(&req("t", *k, 1, 0), &[0; 100], 100);
            assert!(cache.get(&req("t", *k, 1, 1)).is_some());
        }
        for round in 0..5u32 {
            for n in 0..2000u32 {
                let mut bytes = [0xAB; 32];
                bytes[..4].copy_from_slice(&n.to_le_bytes());
                bytes[4..8].copy_from_slice(&round.to_le_bytes());
                let scanned = req("t", IdempotencyKey::from_bytes(bytes), 1, 1);
                if cache.get(&scanned).is_none() {
                    cache.put(&scanned, &[0; 100], 100);
                }
                if n % 50 == 0 {
                    for k in &hot {
                        let _ = cache.get(&req("t", *k, 1, 1));
                    }
                }
            }
        }
        let kept = hot
            .iter()
            .filter(|k| cache.get(&req("t", **k, 1, 1)).is_some())
            .count();
        assert!(kept >= 18, "{kept} of 20 hot records kept through the scan");
    }
}
