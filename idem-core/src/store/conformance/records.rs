//! The checks of what records keep and for whom: tenants apart, fenced release, expiry, purge,
//! one winner among concurrent claims, byte-exact results, health.

use std::sync::Arc;
use std::time::Duration;

use super::support::{T0, TTL, acquire, claim, completion, fp, key, ms, tenant};
use crate::store::{Claim, ClaimRequest, Fenced, FencingToken, RecordStatus, Store};

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

/// A watch on a key wakes when the key settles through the store: a completion that asks to
/// notify, and a release. (A notice is a hint: a watch may also wake for nothing.)
pub async fn settlements_wake_watches(store: Arc<dyn Store>) {
    let t = tenant();
    let within = Duration::from_secs(5);
    let (done, freed) = (key(&t, 1), key(&t, 2));
    let token = acquire(&*store, claim(&t, done, fp(1), T0)).await;
    let watch = store.watch(&t, done).await.expect("watch");
    store
        .complete(completion(&t, done, token, b"{}", T0 + 1))
        .await
        .expect("complete");
    tokio::time::timeout(within, watch.notified())
        .await
        .expect("a completion that notifies wakes the watch of its key");
    let token = acquire(&*store, claim(&t, freed, fp(1), T0)).await;
    let watch = store.watch(&t, freed).await.expect("watch");
    assert_eq!(
        store.release(&t, freed, token).await.expect("release"),
        Fenced::Applied
    );
    tokio::time::timeout(within, watch.notified())
        .await
        .expect("a release wakes the watch of its key");
}

/// For stores that announce settlements across processes (not in the generated suite: call it
/// with two stores on the same data, as two processes would open them): a watch through `here`
/// is announced and woken by a completion through `there` that asks to notify, not by one
/// that does not, and by a release.
pub async fn settlements_elsewhere_wake_watches(here: &dyn Store, there: &dyn Store) {
    let t = tenant();
    let woken = async |watch: &crate::store::Watch, within: u64| {
        tokio::time::timeout(Duration::from_millis(within), watch.notified())
            .await
            .is_ok()
    };
    for (n, notify) in [(1, true), (2, false)] {
        let k = key(&t, n);
        let token = acquire(there, claim(&t, k, fp(1), T0)).await;
        let watch = here.watch(&t, k).await.expect("watch");
        assert!(watch.announced(), "settlements elsewhere are announced");
        let done = crate::store::Completion {
            notify,
            ..completion(&t, k, token, b"{}", T0 + 1)
        };
        there.complete(done).await.expect("complete");
        assert_eq!(
            woken(&watch, if notify { 5_000 } else { 300 }).await,
            notify,
            "a completion is announced when it asks to be (notify: {notify})"
        );
    }
    let k = key(&t, 3);
    let token = acquire(there, claim(&t, k, fp(1), T0)).await;
    let watch = here.watch(&t, k).await.expect("watch");
    assert_eq!(
        there.release(&t, k, token).await.expect("release"),
        Fenced::Applied
    );
    assert!(woken(&watch, 5_000).await, "a release is always announced");
}

/// A completion sent again after it landed (its answer was lost on the way) is recognised as
/// applied; the same token with another result or status, or another token, is not.
pub async fn a_completion_sent_again_is_recognised(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let done = completion(&t, k, token, b"{\"ok\":1}", T0 + 1);
    for attempt in ["first", "again"] {
        assert_eq!(
            store.complete(done).await.expect("complete"),
            Fenced::Applied,
            "{attempt}"
        );
    }
    let other = completion(&t, k, token, b"{\"ok\":2}", T0 + 2);
    assert_eq!(store.complete(other).await.expect("complete"), Fenced::Lost);
    let unknown = crate::store::Completion {
        status: RecordStatus::Unknown,
        ..done
    };
    assert_eq!(
        store.complete(unknown).await.expect("complete"),
        Fenced::Lost
    );
    let stranger = completion(&t, k, FencingToken::from_raw(99), b"{\"ok\":1}", T0 + 2);
    assert_eq!(
        store.complete(stranger).await.expect("complete"),
        Fenced::Lost
    );
    let Claim::Completed { result } = store.claim(claim(&t, k, fp(1), T0 + 3)).await.unwrap()
    else {
        panic!("completed");
    };
    assert_eq!(result, b"{\"ok\":1}", "the first result stays");
}
