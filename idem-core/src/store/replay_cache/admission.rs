//! Which records the replay cache takes in, once it is full: TinyLFU's admission.
//!
//! A full cache takes a record in only by evicting another, and S3-FIFO alone (quick_cache) takes
//! every new record into its probationary queue. When an agent fleet cycles over more intents
//! than fit, every replay is then a miss that still pays for an entry (a copy, two allocations, an
//! eviction) which leaves before it is asked for again. TinyLFU keeps out the records that are no
//! more popular than the ones they would push out: a small [`Sketch`] counts how often each key
//! was asked for lately, and a record comes in only when its count beats the count of the last
//! record evicted. A cycle over ten times what fits then keeps a fixed tenth of it, answered from
//! memory at every turn, and the other replays cost a few counter reads, no allocation.
//!
//! Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy" (ACM TOS,
//! 2017); the sketch follows Caffeine's `FrequencySketch` (four counters of a key in one cache
//! line, every counter halved after ten accesses per entry the cache holds).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::key::IdempotencyKey;

/// A count no counter exceeds: halving forgets old popularity fast.
const SATURATED: u64 = 15;

/// How many keys a sketch counts per entry the cache is expected to hold, before halving.
const PERIOD_PER_ENTRY: usize = 10;

/// The counters of one cache line: 64 counters of one byte, in 8 words.
#[repr(align(64))]
#[derive(Default)]
struct Block([AtomicU64; 8]);

/// How often each key was asked for lately: a count-min sketch of 4 counters per key, halved
/// every [`PERIOD_PER_ENTRY`] accesses per expected entry.
///
/// Counters are read and written with relaxed atomics, without a lock: a count made while the
/// counters are being halved may be lost, and two counts of a key at its saturation may both
/// pass it; either moves an estimate by one and nothing else.
pub struct Sketch {
    blocks: Box<[Block]>,
    /// Counted since the last halving.
    counted: AtomicUsize,
    /// Counts after which every counter is halved.
    period: usize,
}

impl Sketch {
    /// A sketch for a cache of about `entries` entries: 16 counters per entry.
    pub fn new(entries: usize) -> Self {
        let blocks = (entries.max(1) / 4).max(1).next_power_of_two();
        Sketch {
            blocks: (0..blocks).map(|_| Block::default()).collect(),
            counted: AtomicUsize::new(0),
            period: entries.max(1).saturating_mul(PERIOD_PER_ENTRY),
        }
    }

    /// The block of `hash` and its four counters (word, shift) in it.
    fn counters(&self, hash: u64) -> (&Block, [(usize, u32); 4]) {
        let block = &self.blocks[(hash >> 32) as usize & (self.blocks.len() - 1)];
        let counter = |i: u32| {
            let index = (hash >> (6 * i)) as usize & 63;
            (index / 8, (index % 8) as u32 * 8)
        };
        (block, [counter(0), counter(1), counter(2), counter(3)])
    }

    /// Counts one access to the key of `hash`.
    pub fn count(&self, hash: u64) {
        let (block, counters) = self.counters(hash);
        for (word, shift) in counters {
            let word = &block.0[word];
            if (word.load(Relaxed) >> shift) & 0xff < SATURATED {
                word.fetch_add(1 << shift, Relaxed);
            }
        }
        if self.counted.fetch_add(1, Relaxed) + 1 >= self.period {
            self.age();
        }
    }

    /// How often the key of `hash` was asked for lately (an overestimate when other keys share
    /// all four of its counters; never an underestimate, but for a lost race).
    pub fn frequency(&self, hash: u64) -> u64 {
        let (block, counters) = self.counters(hash);
        counters
            .iter()
            .map(|&(word, shift)| (block.0[word].load(Relaxed) >> shift) & 0xff)
            .min()
            .expect("four counters")
    }

    /// Halves every counter, by the one thread that finds the period over.
    fn age(&self) {
        let over = self.counted.load(Relaxed);
        if over < self.period
            || self
                .counted
                .compare_exchange(over, over - self.period / 2, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        for word in self.blocks.iter().flat_map(|b| &b.0) {
            let halved = (word.load(Relaxed) >> 1) & 0x7f7f_7f7f_7f7f_7f7f;
            word.store(halved, Relaxed);
        }
    }
}

/// What the sketch counts a key by. A key is already a SHA-256 digest: its first bytes are
/// spread as evenly as any hash would spread them.
pub fn hash(key: &IdempotencyKey) -> u64 {
    u64::from_le_bytes(key.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// The admission policy of a full cache: a record comes in when there is room for it, or when
/// its key was asked for more often lately than the last key evicted.
pub struct Admission {
    sketch: Sketch,
    /// The [`hash`] of the last key evicted.
    victim: AtomicU64,
    /// Whether the cache has evicted anything yet: until it has, it has room for every record.
    full: AtomicBool,
    /// Entries removed from a full cache since its last eviction (records trusted long enough):
    /// room for as many records, whatever their count.
    room: AtomicUsize,
}

impl Admission {
    /// The policy of a cache of about `entries` entries.
    pub fn new(entries: usize) -> Self {
        Admission {
            sketch: Sketch::new(entries),
            victim: AtomicU64::new(0),
            full: AtomicBool::new(false),
            room: AtomicUsize::new(0),
        }
    }

    /// Counts an access to `key` (every claim that asks the cache).
    pub fn count(&self, key: &IdempotencyKey) {
        self.sketch.count(hash(key));
    }

    /// Whether a record of `key` comes in, once [`count`](Admission::count)ed for the access
    /// that asks. Its count is compared without that access: a key of a cycle was asked for as
    /// often as the victim, also of the cycle, and the one access more would let it push the
    /// victim out at every turn.
    pub fn admits(&self, key: &IdempotencyKey) -> bool {
        !self.full.load(Relaxed)
            || self
                .room
                .fetch_update(Relaxed, Relaxed, |room| room.checked_sub(1))
                .is_ok()
            || self.sketch.frequency(hash(key)).saturating_sub(1)
                > self.sketch.frequency(self.victim.load(Relaxed))
    }

    /// Notes that the cache evicted `key` to make room: it is full.
    pub fn evicted(&self, key: &IdempotencyKey) {
        self.victim.store(hash(key), Relaxed);
        self.room.store(0, Relaxed);
        self.full.store(true, Relaxed);
    }

    /// Notes that an entry was removed (not evicted): room for one record.
    pub fn removed(&self) {
        self.room.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::spread_key as key;
    use super::*;

    #[test]
    fn counts_saturate_and_fade_by_halves() {
        let sketch = Sketch::new(1_000);
        for _ in 0..3 {
            sketch.count(hash(&key(1)));
        }
        assert_eq!(sketch.frequency(hash(&key(1))), 3);
        assert_eq!(sketch.frequency(hash(&key(2))), 0);
        for _ in 0..40 {
            sketch.count(hash(&key(2)));
        }
        assert_eq!(sketch.frequency(hash(&key(2))), SATURATED);
        // The rest of a period, spread over other keys: every counter is halved once.
        for n in 0..(sketch.period - 43) as u32 {
            sketch.count(hash(&key(1_000 + n % 997)));
        }
        assert_eq!(sketch.frequency(hash(&key(2))), SATURATED / 2);
        assert!(sketch.frequency(hash(&key(1))) <= 2);
    }

    #[test]
    fn a_full_cache_takes_in_only_keys_asked_for_more_than_its_last_victim() {
        let admission = Admission::new(100);
        assert!(
            admission.admits(&key(1)),
            "room for everything until an eviction"
        );
        admission.count(&key(1));
        admission.count(&key(1));
        admission.evicted(&key(1));
        admission.count(&key(2));
        assert!(
            !admission.admits(&key(2)),
            "asked once, as often as nothing"
        );
        for _ in 0..3 {
            admission.count(&key(3));
        }
        assert!(
            !admission.admits(&key(3)),
            "asked as often as the victim before the access that asks"
        );
        admission.count(&key(3));
        assert!(
            admission.admits(&key(3)),
            "asked more often than the victim"
        );
        admission.removed();
        assert!(admission.admits(&key(4)), "room left by an entry removed");
        assert!(!admission.admits(&key(4)), "taken by the record admitted");
    }
}
