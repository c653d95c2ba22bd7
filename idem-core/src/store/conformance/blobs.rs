//! The checks of large results and chunks ([`blob`](crate::store::blob)): stored once per
//! tenant, read back whole by every read, let go of by every deletion, never written by a
//! completion or an append that lost its key. They run on the admin side, whose [`AdminStore::blob_usage`] counts the blobs.

use std::sync::Arc;
use std::time::Duration;

use super::support::{LEASE, T0, TTL, acquire, claim, completion, fp, key, ms, tenant};
use crate::store::admin::{AdminStore, Resolution};
use crate::store::blob::{BlobUsage, DEFAULT_THRESHOLD};
use crate::store::{
    ChunkAppend, ChunkRead, Claim, Completion, Fenced, FencingToken, IdempotencyKey, RecordStatus,
};

/// Past the default threshold, so stored as a blob by a store built with its defaults.
const BIG: usize = DEFAULT_THRESHOLD * 3;
/// The shortest life of the short-lived records of [`the_last_record_naming_a_blob_deletes_it`]
/// (they live longer when counting blobs takes longer here).
const SHORTEST_LIFE: Duration = Duration::from_millis(500);

/// `len` bytes that differ with `seed` (and are not one repeated byte, which a store could
/// compress out of sight).
fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn usage(store: &dyn AdminStore, tenant: &str) -> BlobUsage {
    store.blob_usage(Some(tenant)).await.expect("blob usage")
}

async fn complete(store: &dyn AdminStore, tenant: &str, n: u32, result: &[u8]) {
    let k = key(tenant, n);
    let token = acquire(store, claim(tenant, k, fp(1), T0)).await;
    let done = store
        .complete(completion(tenant, k, token, result, T0))
        .await
        .expect("complete");
    assert_eq!(done, Fenced::Applied, "the holder completes");
}

/// Identical large results of one tenant are stored once, and every read (a replaying claim, a
/// lookup, a stream's page) gives the whole result back; another tenant's copy is its own, and
/// small results stay out of the blobs.
pub async fn large_results_are_stored_once_per_tenant(store: Arc<dyn AdminStore>) {
    let (t, other) = (tenant(), tenant());
    let (same, different, small) = (bytes(1, BIG), bytes(2, BIG), bytes(3, 1024));
    for n in 0..5 {
        complete(&*store, &t, n, &same).await;
    }
    let once = BlobUsage {
        blobs: 1,
        bytes: BIG as u64,
    };
    assert_eq!(
        usage(&*store, &t).await,
        once,
        "five identical results, one blob"
    );
    complete(&*store, &other, 0, &same).await;
    assert_eq!(
        usage(&*store, &other).await,
        once,
        "each tenant has its own"
    );
    assert_eq!(
        usage(&*store, &t).await,
        once,
        "and the first tenant's is unchanged"
    );
    complete(&*store, &t, 5, &different).await;
    complete(&*store, &t, 6, &small).await;
    assert_eq!(
        usage(&*store, &t).await,
        BlobUsage {
            blobs: 2,
            bytes: 2 * BIG as u64,
        },
        "a different result is a second blob; a small one is none"
    );
    for (n, expected) in [(0, &same), (4, &same), (5, &different), (6, &small)] {
        let k = key(&t, n);
        match store
            .claim(claim(&t, k, fp(1), T0 + 1))
            .await
            .expect("claim")
        {
            Claim::Completed { result } => assert!(&result == expected, "a replay is whole"),
            other => panic!("expected a replay, got {other:?}"),
        }
        let record = store.lookup(&t, k).await.expect("lookup").expect("record");
        assert!(
            record.result.as_ref() == Some(expected),
            "a lookup is whole"
        );
        let read = ChunkRead {
            tenant: &t,
            key: k,
            from: 0,
            limit: 1,
        };
        let page = store.read_chunks(read).await.expect("read").expect("page");
        assert!(
            page.record.result.as_ref() == Some(expected),
            "a page is whole"
        );
    }
}

/// A blob lives while a record names it: deleting records (an operator), purging expired ones
/// and claiming a key over its expired record let go of it, and the last one deletes it.
pub async fn the_last_record_naming_a_blob_deletes_it(store: Arc<dyn AdminStore>) {
    let t = tenant();
    let big = bytes(4, BIG);
    for n in 0..3 {
        complete(&*store, &t, n, &big).await;
    }
    store.delete(&t, key(&t, 0)).await.expect("delete");
    store.delete(&t, key(&t, 1)).await.expect("delete");
    assert_eq!(
        usage(&*store, &t).await.blobs,
        1,
        "one record still names it"
    );
    store.delete(&t, key(&t, 2)).await.expect("delete");
    assert_eq!(
        usage(&*store, &t).await,
        BlobUsage::default(),
        "the last one let go"
    );

    // A claim over an expired record replaces it, and lets go of its blob.
    complete(&*store, &t, 3, &big).await;
    let later = T0 + ms(TTL) + 1;
    let token = acquire(&*store, claim(&t, key(&t, 3), fp(1), later)).await;
    assert_eq!(usage(&*store, &t).await, BlobUsage::default(), "replaced");
    let done = store
        .complete(completion(&t, key(&t, 3), token, b"small", later))
        .await
        .expect("complete");
    assert_eq!(done, Fenced::Applied);

    // Records that expire take their blobs with them: purged by SQL stores, expired by Redis.
    // Redis expires them on its own clock, and they must outlive the count that follows their
    // writes (a walk of a shared server's whole keyspace, slow on a busy machine): they live
    // twenty times what a count takes here, and the wait for their expiry polls.
    let counting = tokio::time::Instant::now();
    usage(&*store, &t).await;
    let short = (counting.elapsed() * 20).max(SHORTEST_LIFE);
    for n in [10, 11] {
        let k = key(&t, n);
        let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
        let c = Completion {
            ttl: short,
            ..completion(&t, k, token, &big, T0)
        };
        store.complete(c).await.expect("complete");
    }
    assert_eq!(
        usage(&*store, &t).await.blobs,
        1,
        "two short-lived records, one blob"
    );
    if store.expires_on_its_own() {
        let deadline = tokio::time::Instant::now() + short * 20;
        while usage(&*store, &t).await != BlobUsage::default()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(short / 10).await;
        }
    } else {
        let purged = store
            .purge_expired(T0 + ms(short) + 1, 100)
            .await
            .expect("purge");
        assert!(purged >= 2, "both expired records are purged");
    }
    assert_eq!(
        usage(&*store, &t).await,
        BlobUsage::default(),
        "no blob outlives its records"
    );
}

/// A completion whose token lost the key writes no blob; one sent again after its answer was
/// lost is recognised and names its blob once; an operator's resolution keeps its result whole.
pub async fn only_the_holder_writes_a_blob(store: Arc<dyn AdminStore>) {
    let t = tenant();
    let (k, big) = (key(&t, 0), bytes(5, BIG));
    let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let zombie = FencingToken::from_raw(token.get() ^ 1);
    let lost = store
        .complete(completion(&t, k, zombie, &big, T0))
        .await
        .expect("complete");
    assert_eq!(lost, Fenced::Lost, "another token loses");
    assert_eq!(
        usage(&*store, &t).await,
        BlobUsage::default(),
        "and writes nothing"
    );
    for _ in 0..2 {
        let done = store
            .complete(completion(&t, k, token, &big, T0))
            .await
            .expect("complete");
        assert_eq!(
            done,
            Fenced::Applied,
            "the holder's completion, and its delivery again"
        );
    }
    assert_eq!(usage(&*store, &t).await.blobs, 1);
    store.delete(&t, k).await.expect("delete");
    assert_eq!(
        usage(&*store, &t).await,
        BlobUsage::default(),
        "named once, let go once"
    );

    // An `unknown` record resolved by an operator with a large result replays it whole.
    let u = key(&t, 1);
    let token = acquire(&*store, claim(&t, u, fp(1), T0)).await;
    let unknown = Completion {
        status: RecordStatus::Unknown,
        ..completion(&t, u, token, b"", T0)
    };
    store.complete(unknown).await.expect("complete");
    let resolved = store
        .resolve(&t, u, Resolution::Complete { result: &big }, "checked", T0)
        .await
        .expect("resolve");
    assert_eq!(resolved, Fenced::Applied);
    match store
        .claim(claim(&t, u, fp(1), T0 + 1))
        .await
        .expect("claim")
    {
        Claim::Completed { result } => assert!(result == big, "the resolution replays whole"),
        other => panic!("expected a replay, got {other:?}"),
    }
    store.delete(&t, u).await.expect("delete");
    assert_eq!(usage(&*store, &t).await, BlobUsage::default());
}

async fn append(
    store: &dyn AdminStore,
    tenant: &str,
    key: IdempotencyKey,
    token: FencingToken,
    first: u64,
    chunks: &[Vec<u8>],
) -> Fenced {
    let a = ChunkAppend {
        tenant,
        key,
        token,
        first,
        chunks,
    };
    store.append_chunks(a).await.expect("append")
}

async fn chunks_of(store: &dyn AdminStore, tenant: &str, key: IdempotencyKey) -> Vec<Vec<u8>> {
    let read = ChunkRead {
        tenant,
        key,
        from: 0,
        limit: 100,
    };
    let page = store.read_chunks(read).await.expect("read").expect("page");
    page.chunks
}

/// A chunk past the threshold is a blob, shared with every chunk and result of the tenant of
/// the same bytes and read back whole; dropping the chunks (their record deleted or expired, a
/// new holder's first append) lets go of it, and an append fenced out writes none.
pub async fn large_chunks_are_blobs_let_go_with_their_stream(store: Arc<dyn AdminStore>) {
    let t = tenant();
    let (a, b, small) = (bytes(6, BIG), bytes(7, BIG), bytes(8, 1024));
    let k0 = key(&t, 0);
    let token = acquire(&*store, claim(&t, k0, fp(1), T0)).await;
    let stream = vec![a.clone(), small.clone(), a.clone(), b.clone()];
    for _ in 0..2 {
        let applied = append(&*store, &t, k0, token, 0, &stream).await;
        assert_eq!(
            applied,
            Fenced::Applied,
            "an append, and its delivery again"
        );
    }
    let two = BlobUsage {
        blobs: 2,
        bytes: 2 * BIG as u64,
    };
    assert_eq!(
        usage(&*store, &t).await,
        two,
        "two large chunks of one bytes, one blob"
    );
    assert!(
        chunks_of(&*store, &t, k0).await == stream,
        "read back whole, in order"
    );
    let zombie = FencingToken::from_raw(token.get() ^ 1);
    let fenced = append(&*store, &t, k0, zombie, 4, &[bytes(9, BIG)]).await;
    assert_eq!(fenced, Fenced::Lost);
    assert_eq!(
        usage(&*store, &t).await,
        two,
        "a fenced-out append writes no blob"
    );
    let done = store
        .complete(completion(&t, k0, token, &a, T0))
        .await
        .expect("complete");
    assert_eq!(done, Fenced::Applied);
    assert_eq!(
        usage(&*store, &t).await,
        two,
        "a result shares a chunk's blob"
    );
    assert!(
        chunks_of(&*store, &t, k0).await == stream,
        "a completed stream too"
    );

    // Another key's stream names `b` too: deleting the first record lets go of `a` only.
    let k1 = key(&t, 1);
    let token1 = acquire(&*store, claim(&t, k1, fp(1), T0)).await;
    append(&*store, &t, k1, token1, 0, std::slice::from_ref(&b)).await;
    store.delete(&t, k0).await.expect("delete");
    assert_eq!(
        usage(&*store, &t).await,
        BlobUsage {
            blobs: 1,
            bytes: BIG as u64
        },
        "the record and chunks that named `a` are gone, `b` is still named"
    );
    // A new holder of k1 (its lease lapsed) drops the chunks of the first at its first append.
    let later = T0 + ms(LEASE) + 1;
    let token2 = acquire(&*store, claim(&t, k1, fp(1), later)).await;
    append(&*store, &t, k1, token2, 0, std::slice::from_ref(&small)).await;
    assert_eq!(
        usage(&*store, &t).await,
        BlobUsage::default(),
        "dropped with its chunk"
    );
    assert!(chunks_of(&*store, &t, k1).await == vec![small.clone()]);

    // Chunks whose record expires take their blobs with them: purged by SQL stores, expired
    // by Redis.
    let k2 = key(&t, 2);
    let token = acquire(&*store, claim(&t, k2, fp(1), T0)).await;
    append(&*store, &t, k2, token, 0, std::slice::from_ref(&a)).await;
    let c = Completion {
        ttl: Duration::from_millis(20),
        ..completion(&t, k2, token, b"small", T0)
    };
    store.complete(c).await.expect("complete");
    if store.expires_on_its_own() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    } else {
        let purged = store.purge_expired(T0 + 1_000, 100).await.expect("purge");
        assert!(purged >= 1, "the expired record is purged");
    }
    store.delete(&t, k1).await.expect("delete");
    assert_eq!(
        usage(&*store, &t).await,
        BlobUsage::default(),
        "no blob outlives its chunks"
    );
}
