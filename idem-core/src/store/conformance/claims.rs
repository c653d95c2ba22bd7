//! The checks of the claim itself: acquire, replay, mismatch first, lapsed leases, orphans and
//! `unknown` records.

use std::sync::Arc;

use super::support::{
    LEASE, T0, TTL, acquire, claim, completion, fp, key, ms, renewal, status_of, tenant,
    with_orphans,
};
use crate::store::{
    Claim, ClaimRequest, Completion, Fenced, FencingToken, Orphans, RecordStatus, Store,
};

/// A new key is acquired; the same call meanwhile is in flight; completion makes it a replay.
pub async fn acquire_complete_replay(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let first = store.claim(claim(&t, k, fp(1), T0)).await.expect("claim");
    let Claim::Acquired { token, takeover } = first else {
        panic!("a new key must be acquired, got {first:?}");
    };
    assert!(!takeover, "a new key is not a takeover");
    assert_eq!(
        store
            .claim(claim(&t, k, fp(1), T0 + 1))
            .await
            .expect("claim"),
        Claim::InFlight {
            lease_expires_at: T0 + ms(LEASE)
        },
        "a live claim blocks the same call until its lease lapses"
    );
    let done_at = T0 + 500;
    assert_eq!(
        store
            .complete(completion(&t, k, token, b"{\"ok\":1}", done_at))
            .await
            .expect("complete"),
        Fenced::Applied
    );
    assert_eq!(
        store
            .claim(claim(&t, k, fp(1), T0 + ms(LEASE) * 2))
            .await
            .expect("claim"),
        Claim::Completed {
            result: b"{\"ok\":1}".to_vec()
        },
        "a completed key replays, even after its lease"
    );
    let record = store
        .lookup(&t, k)
        .await
        .expect("lookup")
        .expect("record exists");
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.tenant, t);
    assert_eq!(record.tool, "conformance.tool");
    assert_eq!(record.token, token);
    assert_eq!(record.fingerprint, fp(1));
    assert_eq!(record.created_at, T0);
    assert_eq!(
        record.expires_at,
        done_at + ms(TTL),
        "TTL counts from completion"
    );
    assert_eq!(
        store
            .complete(completion(&t, k, token, b"again", done_at))
            .await
            .expect("complete"),
        Fenced::Lost,
        "a completed record is never overwritten"
    );
    assert!(
        store
            .lookup(&t, key(&t, 2))
            .await
            .expect("lookup")
            .is_none()
    );
}

/// A different fingerprint is a mismatch whatever the record's state.
pub async fn mismatch_is_checked_first(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    assert_eq!(
        store
            .claim(claim(&t, k, fp(2), T0 + 1))
            .await
            .expect("claim"),
        Claim::Mismatch,
        "in flight, live lease"
    );
    assert_eq!(
        store
            .claim(claim(&t, k, fp(2), T0 + ms(LEASE) + 1))
            .await
            .expect("claim"),
        Claim::Mismatch,
        "in flight, lapsed lease: no takeover with other arguments"
    );
    store
        .complete(completion(&t, k, token, b"r", T0 + 2))
        .await
        .expect("complete");
    assert_eq!(
        store
            .claim(claim(&t, k, fp(2), T0 + 3))
            .await
            .expect("claim"),
        Claim::Mismatch,
        "completed"
    );
}

/// After the lease lapses exactly one caller takes over; the old owner is fenced out.
pub async fn lapsed_lease_is_taken_over_and_fenced(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let zombie = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let lapse = T0 + ms(LEASE);
    let taken = store
        .claim(claim(&t, k, fp(1), lapse))
        .await
        .expect("claim");
    let Claim::Acquired {
        token: owner,
        takeover: true,
    } = taken
    else {
        panic!("a lapsed lease must be taken over, got {taken:?}");
    };
    assert_ne!(owner, zombie, "a takeover gets a new fencing token");
    assert_eq!(
        store
            .claim(claim(&t, k, fp(1), lapse + 1))
            .await
            .expect("claim"),
        Claim::InFlight {
            lease_expires_at: lapse + ms(LEASE)
        },
        "the new owner holds a new lease"
    );
    assert_eq!(
        store
            .complete(completion(&t, k, zombie, b"zombie", lapse + 2))
            .await
            .expect("complete"),
        Fenced::Lost,
        "the zombie's completion is refused"
    );
    assert_eq!(
        store.release(&t, k, zombie).await.expect("release"),
        Fenced::Lost,
        "the zombie's release is refused"
    );
    assert_eq!(
        store
            .complete(completion(&t, k, owner, b"owner", lapse + 3))
            .await
            .expect("complete"),
        Fenced::Applied
    );
    assert_eq!(
        store
            .claim(claim(&t, k, fp(1), lapse + 4))
            .await
            .expect("claim"),
        Claim::Completed {
            result: b"owner".to_vec()
        }
    );
}

/// A renewal moves the lease of its own `in_flight` record to `now + lease` (and the record's
/// expiry with it, when the TTL would end first); it is fenced like a completion: another
/// token, a settled record, a record taken over or marked `unknown` are [`Fenced::Lost`].
pub async fn renewal_extends_the_lease_and_is_fenced(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let zombie = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let renewed_at = T0 + ms(LEASE) * 2 / 3;
    assert_eq!(
        store
            .renew(renewal(&t, k, zombie, renewed_at))
            .await
            .expect("renew"),
        Fenced::Applied,
        "the owner renews its lease"
    );
    assert_eq!(
        store
            .claim(claim(&t, k, fp(1), T0 + ms(LEASE) + 1))
            .await
            .expect("claim"),
        Claim::InFlight {
            lease_expires_at: renewed_at + ms(LEASE)
        },
        "a renewed lease holds past the first one"
    );
    assert_eq!(
        store
            .renew(renewal(&t, k, FencingToken::generate(), renewed_at + 1))
            .await
            .expect("renew"),
        Fenced::Lost,
        "another token cannot renew"
    );
    let late = renewed_at + ms(LEASE) + 5;
    assert_eq!(
        store
            .renew(renewal(&t, k, zombie, late))
            .await
            .expect("renew"),
        Fenced::Applied,
        "a lapsed lease nobody took over is still the owner's"
    );
    let lapse = late + ms(LEASE);
    let owner = acquire(&*store, claim(&t, k, fp(1), lapse)).await;
    assert_eq!(
        store
            .renew(renewal(&t, k, zombie, lapse + 1))
            .await
            .expect("renew"),
        Fenced::Lost,
        "a lease taken over cannot be renewed by the zombie"
    );
    assert_eq!(
        store
            .complete(completion(&t, k, owner, b"done", lapse + 2))
            .await
            .expect("complete"),
        Fenced::Applied
    );
    assert_eq!(
        store
            .renew(renewal(&t, k, owner, lapse + 3))
            .await
            .expect("renew"),
        Fenced::Lost,
        "a completed record has no lease"
    );
    assert_eq!(
        store
            .claim(claim(&t, k, fp(1), lapse + 4))
            .await
            .expect("claim"),
        Claim::Completed {
            result: b"done".to_vec()
        },
        "a refused renewal changes nothing"
    );

    // A TTL shorter than the lease: the renewal keeps the record as long as its lease.
    let short = key(&t, 2);
    let ttl = LEASE / 3;
    let token = acquire(
        &*store,
        ClaimRequest {
            ttl,
            ..claim(&t, short, fp(1), T0)
        },
    )
    .await;
    assert_eq!(
        store
            .renew(renewal(&t, short, token, T0 + 1))
            .await
            .expect("renew"),
        Fenced::Applied
    );
    assert_eq!(
        store
            .claim(claim(&t, short, fp(1), T0 + ms(ttl) + 1))
            .await
            .expect("claim"),
        Claim::InFlight {
            lease_expires_at: T0 + 1 + ms(LEASE)
        },
        "a renewed record outlives its TTL while its lease holds"
    );

    // A lapsed record turned `unknown` by a blocking claim is nobody's to renew.
    let blocked = key(&t, 3);
    let token = acquire(&*store, claim(&t, blocked, fp(1), T0)).await;
    let after_lapse = T0 + ms(LEASE) + 1;
    assert_eq!(
        store
            .claim(with_orphans(
                claim(&t, blocked, fp(1), after_lapse),
                Orphans::Block
            ))
            .await
            .expect("claim"),
        Claim::Unknown
    );
    assert_eq!(
        store
            .renew(renewal(&t, blocked, token, after_lapse + 1))
            .await
            .expect("renew"),
        Fenced::Lost,
        "an `unknown` record cannot be renewed"
    );
}

/// Under [`Orphans::Block`] a lapsed lease is never taken over: the record turns `unknown`, the
/// zombie's completion is refused, and every later claim is told so, whatever its own policy,
/// until one with [`Orphans::Reconcile`] takes it over for the state check.
pub async fn blocked_orphans_become_unknown(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let zombie = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let lapse = T0 + ms(LEASE);
    let block = |now| with_orphans(claim(&t, k, fp(1), now), Orphans::Block);
    assert_eq!(
        store.claim(block(lapse - 1)).await.expect("claim"),
        Claim::InFlight {
            lease_expires_at: lapse
        },
        "a live lease is in flight under every policy"
    );
    assert_eq!(
        store.claim(block(lapse)).await.expect("claim"),
        Claim::Unknown,
        "a lapsed lease under `Block` is not taken over"
    );
    assert_eq!(status_of(&*store, &t, k).await, RecordStatus::Unknown);
    assert_eq!(
        store
            .complete(completion(&t, k, zombie, b"late", lapse + 1))
            .await
            .expect("complete"),
        Fenced::Lost,
        "an unknown record is not completed by its old owner"
    );
    assert_eq!(
        store.release(&t, k, zombie).await.expect("release"),
        Fenced::Lost,
        "nor released"
    );
    for orphans in [Orphans::Block, Orphans::TakeOver] {
        assert_eq!(
            store
                .claim(with_orphans(claim(&t, k, fp(1), lapse + 2), orphans))
                .await
                .expect("claim"),
            Claim::Unknown,
            "{orphans:?} keeps an unknown record blocked"
        );
    }
    assert_eq!(
        store
            .claim(with_orphans(claim(&t, k, fp(2), lapse + 2), Orphans::Block))
            .await
            .expect("claim"),
        Claim::Mismatch,
        "other arguments are a mismatch first"
    );
    let Claim::Acquired {
        token,
        takeover: true,
    } = store
        .claim(with_orphans(
            claim(&t, k, fp(1), lapse + 3),
            Orphans::Reconcile,
        ))
        .await
        .expect("claim")
    else {
        panic!("a reconciling claim takes an unknown record over");
    };
    assert_ne!(token, zombie);
    assert_eq!(status_of(&*store, &t, k).await, RecordStatus::InFlight);
    assert_eq!(
        store
            .complete(completion(&t, k, token, b"checked", lapse + 4))
            .await
            .expect("complete"),
        Fenced::Applied
    );
    assert_eq!(
        store.claim(block(lapse + 5)).await.expect("claim"),
        Claim::Completed {
            result: b"checked".to_vec()
        }
    );
}

/// A completion can settle a record as `unknown`: it blocks every claim that does not
/// reconcile, it is fenced like any completion, and it expires with its TTL.
pub async fn unknown_records_block_until_reconciled(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let unknown = |token, now| Completion {
        status: RecordStatus::Unknown,
        ..completion(&t, k, token, b"", now)
    };
    assert_eq!(
        store
            .complete(unknown(FencingToken::from_raw(7), T0 + 1))
            .await
            .expect("complete"),
        Fenced::Lost,
        "fenced"
    );
    assert_eq!(
        store
            .complete(unknown(token, T0 + 1))
            .await
            .expect("complete"),
        Fenced::Applied
    );
    let record = store.lookup(&t, k).await.expect("lookup").expect("record");
    assert_eq!(record.status, RecordStatus::Unknown);
    assert_eq!(record.expires_at, T0 + 1 + ms(TTL));
    // Long after the lease, well before the TTL: still blocked, with or without `Block`.
    let later = T0 + 10 * ms(LEASE);
    for orphans in [Orphans::TakeOver, Orphans::Block] {
        assert_eq!(
            store
                .claim(with_orphans(claim(&t, k, fp(1), later), orphans))
                .await
                .expect("claim"),
            Claim::Unknown,
            "{orphans:?}"
        );
    }
    assert_eq!(
        store
            .complete(completion(&t, k, token, b"again", later))
            .await
            .expect("complete"),
        Fenced::Lost,
        "a settled record is not completed twice"
    );
    let expired = store
        .claim(claim(&t, k, fp(1), T0 + 1 + ms(TTL)))
        .await
        .expect("claim");
    assert!(
        matches!(
            expired,
            Claim::Acquired {
                takeover: false,
                ..
            }
        ),
        "past its TTL the key is a new intent, got {expired:?}"
    );
    let other = tenant();
    let elsewhere = store
        .claim(claim(&other, key(&t, 1), fp(1), later))
        .await
        .expect("claim");
    assert!(
        matches!(
            elsewhere,
            Claim::Acquired {
                takeover: false,
                ..
            }
        ),
        "another tenant's records do not block this one, got {elsewhere:?}"
    );
}
