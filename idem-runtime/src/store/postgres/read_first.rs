//! Whether a claim reads before it claims: learned from how the claims lately were answered.
//!
//! The claim statement answers a new key in one round trip by reading and inserting under one
//! snapshot; but a statement that may insert costs the server more than a plain `SELECT` even
//! when it inserts nothing (it locks the table and its indexes for writing and plans the
//! insert). When most claims find a record and answer without writing (a replay, a mismatch, a
//! call in flight: a fleet retrying after an outage), a plain read decides them for less, and the
//! few new keys pay one round trip more. When most claims write, they go straight to the claim
//! statement. [`ReadFirst`] keeps a moving share of the claims that were answered without
//! writing, and asks for the read first while that share is at least [`THRESHOLD`].
//!
//! Either way the answers are the same: the read decides, by [`decide`](crate::store::decide),
//! only what the claim statement would decide without writing (from a snapshot as fresh as the
//! claim's own), and leaves everything else to it.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// The share (out of [`ONE`]) of claims answered without writing, from which a claim reads
/// first. Over a claim statement, a read saves about a quarter of a round trip to a claim it
/// answers and costs a whole one to a claim it does not: it pays from about four in five.
const THRESHOLD: u32 = ONE / 5 * 4;
/// The whole share, in fixed point.
const ONE: u32 = 1 << 16;
/// How much of the share each claim moves: about the last sixteen claims count.
const WEIGHT_SHIFT: u32 = 4;

/// A moving share of the claims answered without writing.
#[derive(Debug)]
pub(super) struct ReadFirst {
    /// Out of [`ONE`].
    share: AtomicU32,
    /// From which share a claim reads first ([`THRESHOLD`]; 0 makes every claim read first).
    threshold: u32,
}

impl Default for ReadFirst {
    fn default() -> Self {
        ReadFirst {
            share: AtomicU32::new(0),
            threshold: THRESHOLD,
        }
    }
}

impl ReadFirst {
    /// A policy under which every claim reads first (tests hold the read to the contract).
    #[cfg(test)]
    pub(super) fn always() -> Self {
        ReadFirst {
            share: AtomicU32::new(0),
            threshold: 0,
        }
    }

    /// Whether the next claim reads first.
    pub(super) fn wanted(&self) -> bool {
        self.share.load(Relaxed) >= self.threshold
    }

    /// Notes how a claim was answered: without writing (`true`), or by the claim statement
    /// writing or needing to.
    ///
    /// Relaxed load and store: two claims noted at the same instant may count as one, which
    /// moves the share by a sixteenth and nothing else.
    pub(super) fn note(&self, answered_without_writing: bool) {
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

    #[test]
    fn reads_first_through_a_run_of_replays_and_stops_when_claims_write_again() {
        let policy = ReadFirst::default();
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
        let policy = ReadFirst::default();
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
}
