//! Batches: the claims of many keys of one tool in one store round trip, and their
//! settlements in one more.
//!
//! | operation | answers | one round trip on |
//! |---|---|---|
//! | [`Store::claim_batch`] | one [`Claim`] per item, in the items' order, each decided by the one decision table as a claim of that key alone would be | SQLite: one job of the group commit; Postgres: one statement; Redis: one script |
//! | [`Store::settle_batch`] | one [`Fenced`] per item, in order: each completion or release fenced by its own token | likewise |
//! | [`Store::renew_batch`] | one [`Fenced`] per item, in order: each lease renewed as [`Store::renew`] would | likewise |
//!
//! Items are independent: one item's mismatch or lost fence never changes another's answer. A
//! batch is not a transaction over its items: a failure of the round trip itself is an error
//! for the whole batch, and the items it reached may have been claimed (their leases lapse as
//! any unsettled claim's do). The keys of one batch are distinct; the runtime refuses an item
//! whose key repeats an earlier one before the store is asked.
//!
//! The defaults claim and settle the items one by one through [`Store::claim`],
//! [`Store::complete`] and [`Store::release`]:
//! correct for any store, one round trip per item. The backends of this workspace override them.

use std::time::Duration;

use super::{
    Claim, ClaimRequest, Completion, Fenced, FencingToken, Orphans, RecordStatus, Renewal, Store,
};
use crate::clock::UnixMillis;
use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;

/// One item of a [`BatchClaim`]: its key and the fingerprint of its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchItem {
    /// The item's key.
    pub key: IdempotencyKey,
    /// The fingerprint of the item's arguments (the tool's other arguments and the item).
    pub fingerprint: Fingerprint,
}

/// The claims of a batch: every item of one tool, under one tenant, at one time.
#[derive(Debug, Clone, Copy)]
pub struct BatchClaim<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The tool's stable name.
    pub tool: &'a str,
    /// The caller's clock.
    pub now: UnixMillis,
    /// How long a new `in_flight` record blocks other callers.
    pub lease: Duration,
    /// How long the records live.
    pub ttl: Duration,
    /// What to do with orphans and `unknown` records.
    pub orphans: Orphans,
    /// The items, with distinct keys.
    pub items: &'a [BatchItem],
}

impl<'a> BatchClaim<'a> {
    /// The claim of item `item` alone.
    pub fn request(&self, item: &BatchItem) -> ClaimRequest<'a> {
        ClaimRequest {
            tenant: self.tenant,
            key: item.key,
            tool: self.tool,
            fingerprint: item.fingerprint,
            now: self.now,
            lease: self.lease,
            ttl: self.ttl,
            orphans: self.orphans,
        }
    }
}

/// How one claimed item settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle<'a> {
    /// Settle as `status` ([`RecordStatus::Completed`] or [`RecordStatus::Unknown`]) with
    /// `result`, as [`Completion`] does.
    Complete {
        /// `completed` or `unknown`.
        status: RecordStatus,
        /// The encoded result (empty for `unknown`).
        result: &'a [u8],
    },
    /// Delete the record, as a release does: nothing happened, the key is new again.
    Release,
}

/// One item of a [`BatchSettlement`]: a key, the token its claim returned, and how it settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement<'a> {
    /// The key.
    pub key: IdempotencyKey,
    /// The token of the item's claim.
    pub token: FencingToken,
    /// Complete or release.
    pub settle: Settle<'a>,
}

/// The settlements of a batch's claimed items, each fenced by its own token.
#[derive(Debug, Clone, Copy)]
pub struct BatchSettlement<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The caller's clock.
    pub now: UnixMillis,
    /// Completed records live this long after completion.
    pub ttl: Duration,
    /// The items.
    pub items: &'a [Settlement<'a>],
}

impl<'a> BatchSettlement<'a> {
    /// The completion of `item`, when it completes (`None` for a release). Batches never wait,
    /// so their completions announce nothing.
    pub fn completion(&self, item: &Settlement<'a>) -> Option<Completion<'a>> {
        match item.settle {
            Settle::Complete { status, result } => Some(Completion {
                tenant: self.tenant,
                key: item.key,
                token: item.token,
                status,
                result,
                now: self.now,
                ttl: self.ttl,
                notify: false,
            }),
            Settle::Release => None,
        }
    }
}

/// One claimed item of a [`BatchRenewal`]: its key and the token its claim returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimedItem {
    /// The key.
    pub key: IdempotencyKey,
    /// The token of the item's claim.
    pub token: FencingToken,
}

/// The renewals of a batch's claimed items, each as a [`Renewal`] fenced by its own token:
/// the lease of each still `in_flight` record its token owns lapses at `now + lease`.
#[derive(Debug, Clone, Copy)]
pub struct BatchRenewal<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The caller's clock.
    pub now: UnixMillis,
    /// The lease from `now`.
    pub lease: Duration,
    /// The items.
    pub items: &'a [ClaimedItem],
}

impl<'a> BatchRenewal<'a> {
    /// The renewal of `item` alone.
    pub fn renewal(&self, item: &ClaimedItem) -> Renewal<'a> {
        Renewal {
            tenant: self.tenant,
            key: item.key,
            token: item.token,
            now: self.now,
            lease: self.lease,
        }
    }
}

/// The renewals of `batch` one by one: the default of [`Store::renew_batch`].
pub async fn renew_each<S: Store + ?Sized>(
    store: &S,
    batch: BatchRenewal<'_>,
) -> Result<Vec<Fenced>, StoreError> {
    let mut answers = Vec::with_capacity(batch.items.len());
    for item in batch.items {
        answers.push(store.renew(batch.renewal(item)).await?);
    }
    Ok(answers)
}

/// The claims of `batch` one by one: the default of
/// [`Store::claim_batch`].
pub async fn claim_each<S: Store + ?Sized>(
    store: &S,
    batch: BatchClaim<'_>,
) -> Result<Vec<Claim>, StoreError> {
    let mut claims = Vec::with_capacity(batch.items.len());
    for item in batch.items {
        claims.push(store.claim(batch.request(item)).await?);
    }
    Ok(claims)
}

/// The settlements of `batch` one by one: the default of
/// [`Store::settle_batch`].
pub async fn settle_each<S: Store + ?Sized>(
    store: &S,
    batch: BatchSettlement<'_>,
) -> Result<Vec<Fenced>, StoreError> {
    let mut answers = Vec::with_capacity(batch.items.len());
    for item in batch.items {
        let answer = match batch.completion(item) {
            Some(completion) => store.complete(completion).await?,
            None => store.release(batch.tenant, item.key, item.token).await?,
        };
        answers.push(answer);
    }
    Ok(answers)
}

/// The items' positions sorted by key: stores that lock records take them in this order, so
/// that two batches over the same keys never wait for each other in a cycle.
pub fn by_key<T>(items: &[T], key: impl Fn(&T) -> IdempotencyKey) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| key(&items[i]).as_bytes().to_owned());
    order
}

/// A backend's answers, one per item in `order` (see [`by_key`]), put back in the items' order.
pub fn in_item_order<T>(order: &[usize], answers: Vec<T>) -> Vec<T> {
    let mut slots: Vec<Option<T>> = (0..order.len()).map(|_| None).collect();
    for (&i, answer) in order.iter().zip(answers) {
        slots[i] = Some(answer);
    }
    slots
        .into_iter()
        .map(|a| a.expect("one answer per item"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{by_key, in_item_order};
    use crate::key::IdempotencyKey;

    #[test]
    fn answers_in_key_order_come_back_in_item_order() {
        let keys = [3u8, 1, 2].map(|b| IdempotencyKey::from_bytes([b; 32]));
        let order = by_key(&keys, |k| *k);
        assert_eq!(order, [1, 2, 0]);
        let answers: Vec<u8> = order.iter().map(|&i| keys[i].as_bytes()[0]).collect();
        assert_eq!(in_item_order(&order, answers), [3, 1, 2]);
    }
}
