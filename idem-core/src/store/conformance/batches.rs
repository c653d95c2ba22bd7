//! The checks of batches: one answer per item, in the items' order, each as the claim,
//! settlement or renewal of that item alone would answer.

use std::sync::Arc;

use super::support::{LEASE, T0, TTL, acquire, claim, completion, fp, key, ms, tenant};
use crate::store::{
    BatchClaim, BatchItem, BatchRenewal, BatchSettlement, Claim, ClaimedItem, Fenced, FencingToken,
    Orphans, RecordStatus, Settle, Settlement, Store,
};

/// A batch over keys in every state answers item by item in its own order (new, replay,
/// mismatch, in flight, a lapsed lease taken over, an expired record new again); its
/// settlements complete, mark `unknown` and release each item under its own token, refuse a
/// stranger's token without touching the others, and recognise themselves when sent again.
pub async fn batches_answer_item_by_item(store: Arc<dyn Store>) {
    let t = tenant();
    let k = |n| key(&t, n);
    let now = T0 + ms(LEASE) + 1;
    // 1 completed; 2 held live; 3 completed, asked with other arguments; 4 held, lease lapsed;
    // 5 new; 6 completed long ago, expired.
    let done = acquire(&*store, claim(&t, k(1), fp(1), T0)).await;
    let settled = store.complete(completion(&t, k(1), done, b"one", T0 + 1));
    assert_eq!(settled.await.expect("complete"), Fenced::Applied);
    let held = acquire(&*store, claim(&t, k(2), fp(1), now - 1)).await;
    let other = acquire(&*store, claim(&t, k(3), fp(1), T0)).await;
    let settled = store.complete(completion(&t, k(3), other, b"three", T0 + 1));
    assert_eq!(settled.await.expect("complete"), Fenced::Applied);
    let zombie = acquire(&*store, claim(&t, k(4), fp(1), T0)).await;
    let long_ago = T0 - ms(TTL) - 10_000;
    let old = acquire(&*store, claim(&t, k(6), fp(1), long_ago)).await;
    let settled = store.complete(completion(&t, k(6), old, b"old", long_ago + 1));
    assert_eq!(settled.await.expect("complete"), Fenced::Applied);

    let items: Vec<BatchItem> = [(5, 1), (1, 1), (2, 1), (3, 2), (4, 1), (6, 1)]
        .map(|(n, f)| BatchItem {
            key: k(n),
            fingerprint: fp(f),
        })
        .to_vec();
    let batch = BatchClaim {
        tenant: &t,
        tool: "conformance.tool",
        now,
        lease: LEASE,
        ttl: TTL,
        orphans: Orphans::TakeOver,
        items: &items,
    };
    let answers = store.claim_batch(batch).await.expect("claim_batch");
    assert_eq!(answers.len(), 6, "one answer per item: {answers:?}");
    let token = |i: usize, takeover: bool| match answers[i] {
        Claim::Acquired { token, takeover: t } if t == takeover => token,
        ref other => panic!("item {i}: expected acquired (takeover {takeover}), got {other:?}"),
    };
    let new = token(0, false);
    assert_eq!(
        answers[1],
        Claim::Completed {
            result: b"one".to_vec()
        }
    );
    assert!(
        matches!(answers[2], Claim::InFlight { lease_expires_at } if lease_expires_at == now - 1 + ms(LEASE)),
        "a live lease: {:?}",
        answers[2]
    );
    assert_eq!(answers[3], Claim::Mismatch, "other arguments");
    let taken = token(4, true);
    assert_ne!(taken, zombie, "a takeover gets a new token");
    let renewed = token(5, false);
    assert_ne!(renewed, old);

    let items = [
        Settlement {
            key: k(5),
            token: new,
            settle: Settle::Complete {
                status: RecordStatus::Completed,
                result: b"five",
            },
        },
        Settlement {
            key: k(4),
            token: taken,
            settle: Settle::Release,
        },
        Settlement {
            key: k(6),
            token: renewed,
            settle: Settle::Complete {
                status: RecordStatus::Unknown,
                result: b"",
            },
        },
        Settlement {
            key: k(2),
            token: FencingToken::from_raw(held.get() ^ 1),
            settle: Settle::Release,
        },
        Settlement {
            key: k(1),
            token: zombie,
            settle: Settle::Complete {
                status: RecordStatus::Completed,
                result: b"stranger",
            },
        },
    ];
    let settlement = BatchSettlement {
        tenant: &t,
        now: now + 1,
        ttl: TTL,
        items: &items,
    };
    let fenced = store.settle_batch(settlement).await.expect("settle_batch");
    use Fenced::{Applied, Lost};
    assert_eq!(fenced, [Applied, Applied, Applied, Lost, Lost]);
    // Sent again after its answer was lost: the completions recognise themselves; the release
    // has nothing left to delete.
    let again = store.settle_batch(settlement).await.expect("settle_batch");
    assert_eq!(again, [Applied, Lost, Applied, Lost, Lost]);

    let answer = |n, f| store.claim(claim(&t, k(n), fp(f), now + 2));
    assert_eq!(
        answer(5, 1).await.expect("claim"),
        Claim::Completed {
            result: b"five".to_vec()
        }
    );
    assert!(matches!(
        answer(4, 1).await.expect("claim"),
        Claim::Acquired {
            takeover: false,
            ..
        }
    ));
    assert_eq!(answer(6, 1).await.expect("claim"), Claim::Unknown);
    assert!(matches!(
        answer(2, 1).await.expect("claim"),
        Claim::InFlight { .. }
    ));
    assert_eq!(
        answer(1, 1).await.expect("claim"),
        Claim::Completed {
            result: b"one".to_vec()
        }
    );

    let empty = BatchClaim {
        items: &[],
        ..batch
    };
    assert_eq!(store.claim_batch(empty).await.expect("empty"), []);
    let nothing = BatchSettlement {
        items: &[],
        ..settlement
    };
    assert_eq!(store.settle_batch(nothing).await.expect("empty"), []);
}

/// A batch's renewals move each lease its token still owns to `now + lease`, as a renewal of
/// that item alone would; a stranger's token and a settled record are lost, without touching
/// the others.
pub async fn batch_renewals_are_fenced_item_by_item(store: Arc<dyn Store>) {
    let t = tenant();
    let k = |n| key(&t, n);
    let tokens: Vec<FencingToken> = {
        let mut tokens = Vec::new();
        for n in 1..=4 {
            tokens.push(acquire(&*store, claim(&t, k(n), fp(1), T0)).await);
        }
        tokens
    };
    let settled = store.complete(completion(&t, k(4), tokens[3], b"four", T0 + 1));
    assert_eq!(settled.await.expect("complete"), Fenced::Applied);
    let renewed_at = T0 + 1_000;
    let items = [
        ClaimedItem {
            key: k(1),
            token: tokens[0],
        },
        ClaimedItem {
            key: k(2),
            token: tokens[1],
        },
        ClaimedItem {
            key: k(3),
            token: FencingToken::from_raw(tokens[2].get() ^ 1),
        },
        ClaimedItem {
            key: k(4),
            token: tokens[3],
        },
    ];
    let batch = BatchRenewal {
        tenant: &t,
        now: renewed_at,
        lease: LEASE,
        items: &items,
    };
    use Fenced::{Applied, Lost};
    let answers = store.renew_batch(batch).await.expect("renew_batch");
    assert_eq!(answers, [Applied, Applied, Lost, Lost]);
    // Past the first lease, within the renewed one.
    let later = T0 + ms(LEASE) + 500;
    for n in [1, 2] {
        assert_eq!(
            store
                .claim(claim(&t, k(n), fp(1), later))
                .await
                .expect("claim"),
            Claim::InFlight {
                lease_expires_at: renewed_at + ms(LEASE)
            },
            "item {n} renewed"
        );
    }
    assert!(
        matches!(
            store
                .claim(claim(&t, k(3), fp(1), later))
                .await
                .expect("claim"),
            Claim::Acquired { takeover: true, .. }
        ),
        "a stranger's renewal left the lease to lapse"
    );
    let empty = BatchRenewal {
        items: &[],
        ..batch
    };
    assert_eq!(store.renew_batch(empty).await.expect("empty"), []);
}
