//! The checks of the admin side ([`AdminStore`]): scans in pages, resolving only blocked records.

use std::sync::Arc;

use super::support::{LEASE, T0, acquire, claim, completion, fp, key, ms, tenant};
use crate::store::admin::{AdminStore, Resolution};
use crate::store::{Claim, Completion, Fenced, RecordStatus, Store};

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
