//! The checks of streams: chunks recorded under a claimed key in order, fenced by its token,
//! read back with the record they belong to, never two holders' chunks mixed.

use std::sync::Arc;

use super::support::{LEASE, T0, acquire, claim, completion, fp, key, ms, tenant, with_orphans};
use crate::key::IdempotencyKey;
use crate::store::{
    ChunkAppend, ChunkRead, Claim, Fenced, FencingToken, Orphans, RecordStatus, Store, StreamPage,
};

fn chunk(n: u64) -> Vec<u8> {
    // Sizes vary (1 to 1,400 bytes) and bytes cover 0..=255, so a store that trims, pads or
    // re-encodes a chunk is caught.
    let len = 1 + (n * 37 % 1400) as usize;
    (0..len).map(|i| (n as usize * 31 + i) as u8).collect()
}

fn append<'a>(
    tenant: &'a str,
    key: IdempotencyKey,
    token: FencingToken,
    first: u64,
    chunks: &'a [Vec<u8>],
) -> ChunkAppend<'a> {
    ChunkAppend {
        tenant,
        key,
        token,
        first,
        chunks,
    }
}

async fn read(
    store: &dyn Store,
    tenant: &str,
    key: IdempotencyKey,
    from: u64,
    limit: usize,
) -> Option<StreamPage> {
    store
        .read_chunks(ChunkRead {
            tenant,
            key,
            from,
            limit,
        })
        .await
        .expect("read_chunks")
}

/// Every chunk of `key`'s stream from 0, read in pages of `page`.
async fn read_all(
    store: &dyn Store,
    tenant: &str,
    key: IdempotencyKey,
    page: usize,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let got = read(store, tenant, key, out.len() as u64, page)
            .await
            .expect("a record")
            .chunks;
        assert!(got.len() <= page, "a page holds at most its limit");
        let last = got.len() < page;
        out.extend(got);
        if last {
            return out;
        }
    }
}

/// 1,000 chunks appended in batches of varied sizes read back byte-identical and in order, in
/// pages, before and after the completion; the record is read with them.
pub async fn streams_read_back_in_order(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    assert!(
        read(&*store, &t, k, 0, 10).await.is_none(),
        "no record, no page"
    );
    let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let empty = read(&*store, &t, k, 0, 10)
        .await
        .expect("the claimed record");
    assert_eq!(empty.record.status, RecordStatus::InFlight);
    assert!(empty.chunks.is_empty());

    let all: Vec<Vec<u8>> = (0..1000).map(chunk).collect();
    let mut first = 0;
    for size in [1, 7, 100, 250, 2, 640] {
        let batch = &all[first..first + size];
        let applied = store.append_chunks(append(&t, k, token, first as u64, batch));
        assert_eq!(applied.await.expect("append"), Fenced::Applied);
        first += size;
    }
    assert_eq!(first, 1000);

    let page = read(&*store, &t, k, 500, 10).await.expect("a record");
    assert_eq!(page.record.status, RecordStatus::InFlight);
    assert_eq!(page.record.token, token);
    assert_eq!(page.chunks, all[500..510], "a page from the middle");
    assert!(
        read(&*store, &t, k, 1000, 10)
            .await
            .expect("record")
            .chunks
            .is_empty(),
        "nothing past the end"
    );
    assert_eq!(read_all(&*store, &t, k, 64).await, all, "in flight");

    let done = store.complete(completion(&t, k, token, b"the end", T0 + 10));
    assert_eq!(done.await.expect("complete"), Fenced::Applied);
    let page = read(&*store, &t, k, 990, 100).await.expect("a record");
    assert_eq!(page.record.status, RecordStatus::Completed);
    assert_eq!(page.record.result.as_deref(), Some(&b"the end"[..]));
    assert_eq!(page.chunks, all[990..], "the rest, then the end");
    assert_eq!(read_all(&*store, &t, k, 333).await, all, "completed");

    let after = store.append_chunks(append(&t, k, token, 1000, &all[..1]));
    assert_eq!(
        after.await.expect("append"),
        Fenced::Lost,
        "a completed stream takes no chunk"
    );
    assert!(
        read(&*store, &tenant(), k, 0, 10).await.is_none(),
        "another tenant reads nothing"
    );
}

/// An append sent again after its answer was lost is applied once; one that starts past the
/// end is refused, and the stream is left as it was.
pub async fn appends_sent_again_apply_once(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let token = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let all: Vec<Vec<u8>> = (0..6).map(chunk).collect();
    for (first, end) in [(0, 3), (0, 3), (2, 5), (3, 5)] {
        let applied = store.append_chunks(append(&t, k, token, first, &all[first as usize..end]));
        assert_eq!(
            applied.await.expect("append"),
            Fenced::Applied,
            "{first}..{end}"
        );
    }
    assert_eq!(
        read_all(&*store, &t, k, 10).await,
        all[..5],
        "each chunk once"
    );
    let gap = store.append_chunks(append(&t, k, token, 7, &all[5..]));
    assert!(gap.await.is_err(), "a chunk would be missing");
    assert_eq!(read_all(&*store, &t, k, 10).await, all[..5], "untouched");
}

/// A holder that died leaves its prefix readable while the record is its own (its lease
/// lapsed, or the record marked `unknown`). Once taken over it appends nothing, and the new
/// holder's stream starts empty: a reader sees one holder's chunks, never both. A release drops
/// the stream with the record.
pub async fn streams_are_fenced_by_their_holder(store: Arc<dyn Store>) {
    let t = tenant();
    let k = key(&t, 1);
    let zombie = acquire(&*store, claim(&t, k, fp(1), T0)).await;
    let old: Vec<Vec<u8>> = (0..5).map(chunk).collect();
    let applied = store.append_chunks(append(&t, k, zombie, 0, &old));
    assert_eq!(applied.await.expect("append"), Fenced::Applied);

    let later = T0 + ms(LEASE) + 1;
    let page = read(&*store, &t, k, 0, 10).await.expect("a record");
    assert_eq!(page.chunks, old, "a lapsed holder's prefix is readable");

    let blocked = key(&t, 2);
    let dead = acquire(&*store, claim(&t, blocked, fp(1), T0)).await;
    let applied = store.append_chunks(append(&t, blocked, dead, 0, &old));
    assert_eq!(applied.await.expect("append"), Fenced::Applied);
    let req = with_orphans(claim(&t, blocked, fp(1), later), Orphans::Block);
    assert_eq!(store.claim(req).await.expect("claim"), Claim::Unknown);
    let page = read(&*store, &t, blocked, 0, 10).await.expect("a record");
    assert_eq!(page.record.status, RecordStatus::Unknown);
    assert_eq!(page.chunks, old, "an unknown record's prefix is readable");

    let holder = acquire(&*store, claim(&t, k, fp(1), later)).await;
    assert_ne!(holder, zombie);
    let page = read(&*store, &t, k, 0, 10).await.expect("a record");
    assert_eq!(page.record.token, holder);
    assert!(
        page.chunks.is_empty(),
        "the taken-over holder's chunks are not the new holder's stream: {} read",
        page.chunks.len()
    );
    let lost = store.append_chunks(append(&t, k, zombie, 5, &old[..1]));
    assert_eq!(
        lost.await.expect("append"),
        Fenced::Lost,
        "the zombie is fenced"
    );
    let lost = store.append_chunks(append(&t, k, zombie, 0, &old[..1]));
    assert_eq!(
        lost.await.expect("append"),
        Fenced::Lost,
        "even from the start"
    );

    let new: Vec<Vec<u8>> = (100..103).map(chunk).collect();
    let applied = store.append_chunks(append(&t, k, holder, 0, &new));
    assert_eq!(applied.await.expect("append"), Fenced::Applied);
    assert_eq!(
        read_all(&*store, &t, k, 2).await,
        new,
        "the new holder's chunks alone"
    );

    let released = store.release(&t, k, holder);
    assert_eq!(released.await.expect("release"), Fenced::Applied);
    assert!(read(&*store, &t, k, 0, 10).await.is_none());
    let again = acquire(&*store, claim(&t, k, fp(1), later + 1)).await;
    let page = read(&*store, &t, k, 0, 10).await.expect("a record");
    assert_eq!(page.record.token, again);
    assert!(page.chunks.is_empty(), "a released key's stream is gone");
}
