//! Whether a claim reads before it claims: learned from how the claims lately were answered.
//!
//! A store whose claim can write answers a claim that finds a record (a replay, a mismatch, a
//! call in flight) either by a plain read first or by the statement or transaction that may
//! write, which decides from the same record but costs more: on Postgres a statement that may
//! insert (it locks the table for writing and plans the insert), on SQLite a place in the group
//! commit behind other callers' `fsync`s. A read first, on the other hand, is wasted on a new
//! key, which the write reads again. Which costs less depends on the load: [`ReadFirst`] keeps a
//! moving share of the claims that were answered without writing, and asks for the read first
//! while that share is at least the backend's threshold.
//!
//! Either way the answers are the same: the read decides, by [`decide`](crate::store::decide),
//! only what the write would decide without writing (from a snapshot as fresh as the write's
//! own), and leaves everything else to it.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// The whole share, in fixed point: a threshold is a part of it.
pub const ONE: u32 = 1 << 16;
/// How much of the share each claim moves: about the last sixteen claims count.
const WEIGHT_SHIFT: u32 = 4;

/// A moving share of the claims answered without writing.
#[derive(Debug)]
pub struct ReadFirst {
    /// Out of [`ONE`].
    share: AtomicU32,
    /// From which share a claim reads first (0 makes every claim read first).
    threshold: u32,
}

impl ReadFirst {
    /// A policy under which claims read first while at least `threshold` (out of [`ONE`]) of
    /// the claims lately were answered without writing; until claims are seen, they write.
    pub const fn new(threshold: u32) -> Self {
        ReadFirst {
            share: AtomicU32::new(0),
            threshold,
        }
    }

    /// A policy under which every claim reads first (tests hold the read to the contract).
    pub fn always() -> Self {
        ReadFirst {
            share: AtomicU32::new(0),
            threshold: 0,
        }
    }

    /// Whether the next claim reads first.
    pub fn wanted(&self) -> bool {
        self.share.load(Relaxed) >= self.threshold
    }

    /// Notes how a claim was answered: without writing (`true`), or by the claim statement
    /// writing or needing to.
    ///
    /// Relaxed load and store: two claims noted at the same instant may count as one, which
    /// moves the share by a sixteenth and nothing else.
    pub fn note(&self, answered_without_writing: bool) {
        let share = self.share.load(Relaxed);
        let moved = share - (share >> WEIGHT_SHIFT)
            + if answered_without_writing {
                ONE >> WEIGHT_SHIFT
            } else {
                0
            };
        self.share.store(moved.min(ONE), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Postgres's threshold: four claims in five.
    const FOUR_IN_FIVE: u32 = ONE / 5 * 4;

    #[test]
    fn reads_first_through_a_run_of_replays_and_stops_when_claims_write_again() {
        let policy = ReadFirst::new(FOUR_IN_FIVE);
        assert!(!policy.wanted(), "claims write until shown otherwise");
        let mut answered = 0;
        while !policy.wanted() {
            policy.note(true);
            answered += 1;
        }
        assert!((20..=30).contains(&answered), "{answered} replays");
        for _ in 0..1_000 {
            policy.note(true);
        }
        let mut wrote = 0;
        while policy.wanted() {
            policy.note(false);
            wrote += 1;
        }
        assert!((3..=5).contains(&wrote), "{wrote} new keys");
    }

    #[test]
    fn keeps_reading_first_when_nine_claims_in_ten_find_a_record() {
        let policy = ReadFirst::new(FOUR_IN_FIVE);
        for _ in 0..100 {
            policy.note(true);
        }
        let mut read_first = 0;
        for n in 0..10_000 {
            read_first += usize::from(policy.wanted());
            policy.note(n % 10 != 0);
        }
        assert!(read_first > 9_000, "{read_first} of 10,000 read first");
        for n in 0..10_000 {
            policy.note(n % 2 == 0);
        }
        assert!(!policy.wanted(), "half the claims write");
    }

    /// SQLite's threshold: one claim in eight. A run of new keys stops the reads; two or three
    /// claims that find a record bring them back.
    #[test]
    fn stops_reading_first_through_new_keys_and_resumes_at_the_first_replays() {
        let policy = ReadFirst::new(ONE / 8);
        assert!(!policy.wanted(), "claims write until shown otherwise");
        policy.note(true);
        policy.note(true);
        policy.note(true);
        assert!(policy.wanted(), "three replays");
        let mut wrote = 0;
        while policy.wanted() {
            policy.note(false);
            wrote += 1;
        }
        assert!((1..=10).contains(&wrote), "{wrote} new keys");
        for _ in 0..1_000 {
            policy.note(false);
        }
        let mut answered = 0;
        while !policy.wanted() {
            policy.note(true);
            answered += 1;
        }
        assert!((2..=3).contains(&answered), "{answered} replays");
    }
}
