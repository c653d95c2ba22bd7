//! The store contract as executable checks, run against every backend.
//!
//! A backend's test file only says how to build the store:
//!
//! ```ignore
//! idem_runtime::store_conformance_tests!(async { MyStore::connect("…").await.unwrap() });
//! ```
//!
//! Each check uses tenants of its own (`conformance-<uuid>`), so the checks can run in parallel
//! against one shared server. Times are explicit (`now` in every request), so no check sleeps.
//! The checks panic with a message naming the rule that failed.

use std::sync::Arc;
use std::time::Duration;

use super::admin::{AdminStore, Resolution};
use super::{Claim, ClaimRequest, Completion, Fenced, FencingToken, Orphans, RecordStatus, Store};
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, KeyPart, derive_key};

/// Generates one `#[tokio::test]` per conformance check for the store that `$make` (an
/// expression evaluating to a future of the store) builds. Needs `tokio` with `macros` and
/// `rt-multi-thread` in the calling crate.
///
/// For a server that may be absent, `store_conformance_tests!(maybe: $make)` takes a future of
/// `Option<store>`; `None` skips each check (see [`test_server_url`]).
#[macro_export]
macro_rules! store_conformance_tests {
    (maybe: $make:expr) => {
        $crate::store_conformance_tests!(@each dyn $crate::store::Store; $make;
            acquire_complete_replay,
            mismatch_is_checked_first,
            lapsed_lease_is_taken_over_and_fenced,
            blocked_orphans_become_unknown,
            unknown_records_block_until_reconciled,
            release_is_fenced_and_frees_the_key,
            expired_records_are_new_intents,
            tenants_are_isolated,
            hostile_tenants_stay_apart,
            purge_is_bounded_and_spares_live_records,
            concurrent_claims_have_one_winner,
            results_are_stored_byte_exact,
            health_reports_the_current_schema
        );
    };
    ($make:expr) => {
        $crate::store_conformance_tests!(maybe: async { ::core::option::Option::Some($make.await) });
    };
    (@each $store:ty; $make:expr; $($check:ident),*) => {$(
        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $check() {
            let ::core::option::Option::Some(store) = $make.await else {
                return;
            };
            let store: ::std::sync::Arc<$store> = ::std::sync::Arc::new(store);
            $crate::store::conformance::$check(store).await;
        }
    )*};
}

/// Generates one `#[tokio::test]` per admin conformance check ([`AdminStore`]): the same
/// shapes as [`store_conformance_tests!`](crate::store_conformance_tests).
#[macro_export]
macro_rules! admin_conformance_tests {
    (maybe: $make:expr) => {
        $crate::store_conformance_tests!(@each dyn $crate::store::admin::AdminStore; $make;
            scan_walks_a_tenant_in_pages,
            resolve_settles_only_blocked_records
        );
    };
    ($make:expr) => {
        $crate::admin_conformance_tests!(maybe: async { ::core::option::Option::Some($make.await) });
    };
}

/// The URL of a test server from the environment variable `var`
/// (`IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_REDIS_URL`).
///
/// Unset, it returns `None` after printing why the test is skipped, unless
/// `IDEM_REQUIRE_BACKENDS=1`, which makes a missing server a failure (CI sets it).
pub fn test_server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") => {
            panic!("{var} is not set, and IDEM_REQUIRE_BACKENDS=1 requires this backend")
        }
        _ => {
            eprintln!("skipped: set {var} to run this test against a real server");
            None
        }
    }
}

const T0: u64 = 1_700_000_000_000;
const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(24 * 3600);

fn tenant() -> String {
    format!("conformance-{}", uuid::Uuid::new_v4())
}

fn key(tenant: &str, n: u32) -> IdempotencyKey {
    derive_key(
        tenant,
        "conformance.tool",
        &[KeyPart::new(&n).expect("key part")],
    )
}

fn fp(b: u8) -> Fingerprint {
    Fingerprint::from_bytes([b; 32])
}

fn claim<'a>(
    tenant: &'a str,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    now: u64,
) -> ClaimRequest<'a> {
    ClaimRequest {
        tenant,
        key,
        tool: "conformance.tool",
        fingerprint,
        now,
        lease: LEASE,
        ttl: TTL,
        orphans: Orphans::TakeOver,
    }
}

fn completion<'a>(
    tenant: &'a str,
    key: IdempotencyKey,
    token: FencingToken,
    result: &'a [u8],
    now: u64,
) -> Completion<'a> {
    Completion {
        tenant,
        key,
        token,
        status: RecordStatus::Completed,
        result,
        now,
        ttl: TTL,
    }
}

fn with_orphans(req: ClaimRequest<'_>, orphans: Orphans) -> ClaimRequest<'_> {
    ClaimRequest { orphans, ..req }
}

async fn status_of(store: &dyn Store, tenant: &str, key: IdempotencyKey) -> RecordStatus {
    store
        .lookup(tenant, key)
        .await
        .expect("lookup")
        .expect("a record")
        .status
}

async fn acquire(store: &dyn Store, req: ClaimRequest<'_>) -> FencingToken {
    match store.claim(req).await.expect("claim") {
        Claim::Acquired { token, .. } => token,
        other => panic!("expected the claim to be acquired, got {other:?}"),
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

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

/// Tenants made of SQL metacharacters, Redis separators and hash-tag braces, glob characters,
/// non-ASCII text and 255 bytes each keep their own records, with the same key: no injection,
/// no collision between a tenant and its prefixes.
pub async fn hostile_tenants_stay_apart(store: Arc<dyn Store>) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let long = format!("{run}{}x", "ß".repeat(111));
    assert_eq!(long.len(), 255);
    let hostile: Vec<String> = [
        "'; DROP TABLE idem_records; --",
        "\" ' OR '1'='1",
        "a}b{c",
        "{evil}",
        "x:y:z",
        "x:y",
        "x",
        "*",
        "[a-z]?",
        "%_\\",
        "ñandú 🦀",
        "tenant\twith\nwhitespace",
    ]
    .iter()
    .map(|t| format!("{run}{t}"))
    .chain([long.clone(), format!("{run}x:"), format!("{run}x}}")])
    .collect();
    let k = key("shared", 1);
    for (n, t) in hostile.iter().enumerate() {
        let token = acquire(&*store, claim(t, k, fp(1), T0)).await;
        let applied = store
            .complete(completion(t, k, token, t.as_bytes(), T0 + n as u64))
            .await
            .expect("complete");
        assert_eq!(applied, Fenced::Applied, "{t:?}");
    }
    for t in &hostile {
        assert_eq!(
            store
                .claim(claim(t, k, fp(1), T0 + 100))
                .await
                .expect("claim"),
            Claim::Completed {
                result: t.as_bytes().to_vec()
            },
            "{t:?} sees its own record"
        );
        let record = store.lookup(t, k).await.expect("lookup").expect("record");
        assert_eq!(&record.tenant, t);
        assert_eq!(
            store
                .claim(claim(t, k, fp(2), T0 + 100))
                .await
                .expect("claim"),
            Claim::Mismatch
        );
    }
    assert!(
        store.lookup(&run, k).await.expect("lookup").is_none(),
        "the common prefix is a tenant of its own"
    );
}

/// Release deletes the record only for its owner, and only while in flight.
pub async fn release_is_fenced_and_frees_the_key(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    assert_eq!(
        store
            .release(&t, k, FencingToken::from_raw(token.get() ^ 1))
            .await
            .expect("release"),
        Fenced::Lost
    );
    assert_eq!(
        store.release(&t, k, token).await.expect("release"),
        Fenced::Applied
    );
    assert!(
        store.lookup(&t, k).await.expect("lookup").is_none(),
        "released means gone"
    );
    let again = store
        .claim(claim(&t, k, fp(2), T0 + 1))
        .await
        .expect("claim");
    assert!(
        matches!(
            again,
            Claim::Acquired {
                takeover: false,
                ..
            }
        ),
        "a released key is new, even with other arguments: {again:?}"
    );
    let Claim::Acquired { token, .. } = again else {
        unreachable!()
    };
    store
        .complete(completion(&t, k, token, b"r", T0 + 2))
        .await
        .expect("complete");
    assert_eq!(
        store.release(&t, k, token).await.expect("release"),
        Fenced::Lost,
        "a completed record cannot be released"
    );
    assert!(store.lookup(&t, k).await.expect("lookup").is_some());
}

/// After its TTL a key is a new intent, whatever its arguments.
pub async fn expired_records_are_new_intents(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    store
        .complete(completion(&t, k, token, b"old", T0 + 1))
        .await
        .expect("complete");
    let expiry = T0 + 1 + ms(TTL);
    assert!(matches!(
        store
            .claim(claim(&t, k, fp(1), expiry - 1))
            .await
            .expect("claim"),
        Claim::Completed { .. }
    ));
    let fresh = store
        .claim(claim(&t, k, fp(2), expiry))
        .await
        .expect("claim");
    let Claim::Acquired {
        token: new_token,
        takeover: false,
    } = fresh
    else {
        panic!("an expired key must be acquired as new, got {fresh:?}");
    };
    let record = store.lookup(&t, k).await.expect("lookup").expect("record");
    assert_eq!(record.status, RecordStatus::InFlight);
    assert_eq!(record.fingerprint, fp(2));
    assert_eq!(record.result, None, "the old result is gone");
    assert_eq!(record.created_at, expiry);
    assert_eq!(
        store
            .complete(completion(&t, k, token, b"x", expiry + 1))
            .await
            .expect("complete"),
        Fenced::Lost,
        "the expired record's owner cannot complete the new one"
    );
    assert_eq!(
        store
            .complete(completion(&t, k, new_token, b"new", expiry + 1))
            .await
            .expect("complete"),
        Fenced::Applied
    );
}

/// The same key in two tenants is two records.
pub async fn tenants_are_isolated(store: Arc<dyn Store>) {
    let (a, b) = (tenant(), tenant());
    let k = key("shared", 1);
    let ta = acquire(&*store, claim(&a, k, fp(1), T0)).await;
    let tb = acquire(&*store, claim(&b, k, fp(2), T0)).await;
    assert_eq!(
        store.release(&b, k, ta).await.expect("release"),
        Fenced::Lost
    );
    store
        .complete(completion(&a, k, ta, b"a", T0 + 1))
        .await
        .expect("complete");
    assert_eq!(
        store
            .lookup(&b, k)
            .await
            .expect("lookup")
            .expect("record")
            .status,
        RecordStatus::InFlight,
        "completing in one tenant leaves the other alone"
    );
    store
        .complete(completion(&b, k, tb, b"b", T0 + 2))
        .await
        .expect("complete");
    assert_eq!(
        store
            .claim(claim(&a, k, fp(1), T0 + 3))
            .await
            .expect("claim"),
        Claim::Completed {
            result: b"a".to_vec()
        }
    );
    assert_eq!(
        store
            .claim(claim(&b, k, fp(2), T0 + 3))
            .await
            .expect("claim"),
        Claim::Completed {
            result: b"b".to_vec()
        }
    );
    assert!(store.lookup(&tenant(), k).await.expect("lookup").is_none());
}

/// Purge deletes expired records in batches of at most `limit`, and nothing live.
///
/// Its records live in the distant past (expiring at 11 ms after the epoch), so that purging them
/// cannot touch the records of checks running at the same time on the same server. A store that
/// expires records on its own must have deleted them once their TTL has passed.
pub async fn purge_is_bounded_and_spares_live_records(store: Arc<dyn Store>) {
    let t = tenant();
    let short = |n| ClaimRequest {
        ttl: Duration::from_millis(1),
        lease: Duration::from_millis(1),
        ..claim(&t, key(&t, n), fp(1), 10)
    };
    if store.expires_on_its_own() {
        for n in 0..25 {
            acquire(&*store, short(n)).await;
        }
        let live = key(&t, 100);
        acquire(&*store, claim(&t, live, fp(1), T0)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        for n in 0..25 {
            assert!(
                store
                    .lookup(&t, key(&t, n))
                    .await
                    .expect("lookup")
                    .is_none(),
                "a record past its TTL must vanish on its own"
            );
        }
        assert!(
            store.lookup(&t, live).await.expect("lookup").is_some(),
            "live record kept"
        );
        assert_eq!(store.purge_expired(12, 10).await.expect("purge"), 0);
        return;
    }
    while store.purge_expired(12, 1000).await.expect("purge") > 0 {}
    for n in 0..25 {
        acquire(&*store, short(n)).await;
    }
    let live = key(&t, 100);
    acquire(&*store, claim(&t, live, fp(1), T0)).await;
    let mut batches = Vec::new();
    loop {
        let n = store.purge_expired(12, 10).await.expect("purge");
        batches.push(n);
        if n == 0 {
            break;
        }
    }
    assert_eq!(batches, vec![10, 10, 5, 0]);
    assert!(
        store
            .lookup(&t, key(&t, 0))
            .await
            .expect("lookup")
            .is_none()
    );
    assert!(
        store.lookup(&t, live).await.expect("lookup").is_some(),
        "live record kept"
    );
}

/// Many concurrent claims of one key: exactly one is acquired.
pub async fn concurrent_claims_have_one_winner(store: Arc<dyn Store>) {
    let t: Arc<str> = tenant().into();
    let k = key(&t, 1);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (store, t) = (store.clone(), t.clone());
        set.spawn(async move { store.claim(claim(&t, k, fp(1), T0 + i)).await });
    }
    let mut acquired = 0;
    while let Some(res) = set.join_next().await {
        match res.expect("task").expect("claim") {
            Claim::Acquired { .. } => acquired += 1,
            Claim::InFlight { .. } => {}
            other => panic!("unexpected answer under contention: {other:?}"),
        }
    }
    assert_eq!(acquired, 1, "exactly one concurrent claim may win");
}

/// Results come back byte for byte, including non-UTF-8 bytes and large values.
pub async fn results_are_stored_byte_exact(store: Arc<dyn Store>) {
    let t = tenant();
    let mut big: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    big.extend_from_slice(&[0, 0xff, 0xfe]);
    for (n, result) in [Vec::new(), vec![0u8, 0xc3, 0x28], big]
        .into_iter()
        .enumerate()
    {
        let k = key(&t, n as u32);
        let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
        store
            .complete(completion(&t, k, token, &result, T0 + 1))
            .await
            .expect("complete");
        assert_eq!(
            store
                .claim(claim(&t, k, fp(1), T0 + 2))
                .await
                .expect("claim"),
            Claim::Completed { result },
        );
    }
}

/// The health check answers with the schema this build writes.
pub async fn health_reports_the_current_schema(store: Arc<dyn Store>) {
    let health = store.health().await.expect("health");
    assert_eq!(health.backend, store.backend());
    assert_eq!(health.schema_version, health.expected_schema_version);
}

/// Scanning one tenant walks all its records, once each, in pages; other tenants' records are
/// not in it.
pub async fn scan_walks_a_tenant_in_pages(store: Arc<dyn AdminStore>) {
    let (t, other) = (tenant(), tenant());
    for n in 0..25 {
        acquire(&*store, claim(&t, key(&t, n), fp(1), T0)).await;
    }
    acquire(&*store, claim(&other, key(&other, 0), fp(1), T0)).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store
            .scan(Some(&t), cursor.as_deref(), 10)
            .await
            .expect("scan");
        if store.backend() != "redis" {
            // Redis walks its keyspace with SCAN, whose pages are approximate.
            assert!(page.records.len() <= 10, "a page holds at most `limit`");
        }
        seen.extend(page.records.into_iter().map(|r| (r.tenant, r.key)));
        pages += 1;
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages < 1000, "the scan ends");
    }
    if store.backend() != "redis" {
        // SCAN may return a key twice; SQL walks return each row once.
        assert_eq!(seen.len(), 25, "every record once");
    }
    assert!(
        seen.iter().all(|(tenant, _)| *tenant == t),
        "only this tenant"
    );
    let mut keys: Vec<_> = seen.iter().map(|(_, k)| *k).collect();
    keys.sort_by_key(|k| *k.as_bytes());
    keys.dedup();
    assert_eq!(keys.len(), 25, "no record twice");
}

/// An operator resolves `unknown` records and orphans, and nothing else.
pub async fn resolve_settles_only_blocked_records(store: Arc<dyn AdminStore>) {
    let t = tenant();
    let (live, done, unknown, orphan) = (key(&t, 1), key(&t, 2), key(&t, 3), key(&t, 4));
    acquire(&*store, claim(&t, live, fp(1), T0)).await;
    let token = acquire(&*store, claim(&t, done, fp(1), T0)).await;
    store
        .complete(completion(&t, done, token, b"done", T0))
        .await
        .expect("complete");
    let token = acquire(&*store, claim(&t, unknown, fp(1), T0)).await;
    store
        .complete(Completion {
            status: RecordStatus::Unknown,
            ..completion(&t, unknown, token, b"", T0)
        })
        .await
        .expect("complete");
    acquire(&*store, claim(&t, orphan, fp(1), T0)).await;
    let now = T0 + 1;
    let complete = Resolution::Complete { result: b"by hand" };
    for (k, what) in [(live, "a live lease"), (done, "a completed record")] {
        assert_eq!(
            store
                .resolve(&t, k, complete, "ticket 7", now)
                .await
                .expect("resolve"),
            Fenced::Lost,
            "{what} is not resolved"
        );
    }
    assert_eq!(
        store
            .resolve(&t, key(&t, 99), complete, "ticket 7", now)
            .await
            .expect("resolve"),
        Fenced::Lost,
        "a missing record is not resolved"
    );
    assert_eq!(
        store
            .resolve(
                &t,
                unknown,
                complete,
                "ticket 7: the charge is in the bank statement",
                now
            )
            .await
            .expect("resolve"),
        Fenced::Applied
    );
    let record = store
        .lookup(&t, unknown)
        .await
        .expect("lookup")
        .expect("kept");
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(
        record.note.as_deref(),
        Some("ticket 7: the charge is in the bank statement")
    );
    assert_eq!(
        store
            .claim(claim(&t, unknown, fp(1), now))
            .await
            .expect("claim"),
        Claim::Completed {
            result: b"by hand".to_vec()
        },
        "the resolution replays"
    );
    let lapsed = T0 + ms(LEASE);
    assert_eq!(
        store
            .resolve(&t, orphan, Resolution::Release, "never sent", lapsed)
            .await
            .expect("resolve"),
        Fenced::Applied,
        "an orphan whose lease lapsed is released"
    );
    assert_eq!(store.lookup(&t, orphan).await.expect("lookup"), None);
    assert!(matches!(
        store
            .claim(claim(&t, orphan, fp(1), lapsed))
            .await
            .expect("claim"),
        Claim::Acquired {
            takeover: false,
            ..
        }
    ));
}
