//! The call of a batch tool (`key = "…, items[].id"`): one key per item, the claims of all
//! items in one store round trip, the body called once with only the items to run, their
//! settlements in one more round trip, and one answer per item in the items' order.
//!
//! | step | what happens |
//! |---|---|
//! | refuse the batch | no runtime in scope, a bad tenant, more than [`MAX_BATCH_ITEMS`] items: nothing is claimed |
//! | refuse an item | its key part is invalid or missing, its arguments cannot be fingerprinted, its key repeats an earlier item's: that item's answer, the others go on |
//! | claim | [`Store::claim_batch`](idem_core::store::Store::claim_batch): each item decided as a claim of its own |
//! | answer without running | completed items replay (value or stored error), mismatches, items in flight and `unknown` items answer as a single call would |
//! | run | the body gets the acquired items, in order, their leases renewed while it runs (one [`Store::renew_batch`](idem_core::store::Store::renew_batch) a period) ([`current_batch()`](crate::current_batch()) gives each item's downstream key); it answers one result per item, in the same order |
//! | settle | [`Store::settle_batch`](idem_core::store::Store::settle_batch): each item completed, released or marked `unknown` by the tool's `on_error` policy; if that round trip fails, each item's completion is tried again on its own as a single call's is |
//!
//! A body that answers another number of results than it was given items cannot say which
//! result is whose: its items are settled `unknown` (the effects may have happened) and each
//! answers [`Error::BatchAnswer`]. Batches do not wait for items in flight (`InFlight` is
//! their answer), and run no state check.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::call::{self, KeyParts, Settling, check_tenant, settled, settling};
use super::policy::ErrorHandling;
use super::{Claimed, Claiming, Intent, Recorded};
use crate::registry::ToolInfo;
use crate::runtime::{Idem, Scope};
use crate::telemetry::Observation;
use idem_core::canonical::CanonicalError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::IdempotencyKey;
use idem_core::store::{BatchClaim, BatchItem, BatchSettlement, RecordStatus, Settle, Settlement};
use idem_core::{Batch, Error, ErrorClass, Outcome};

/// The most items one call of a batch tool takes; more is [`Error::BatchTooLarge`] before the
/// store is touched. One round trip carries every item's key, fingerprint and result: a bound
/// keeps a statement, a script and a transaction of the stores small enough to answer quickly.
pub const MAX_BATCH_ITEMS: usize = 1_000;

/// One item of a batch call: its key parts and the fingerprint of its arguments (the tool's
/// other arguments with this item).
pub struct BatchEntry {
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
}

impl BatchEntry {
    /// The item's key parts and fingerprint.
    pub fn new(key: KeyParts, fingerprint: Result<Fingerprint, CanonicalError>) -> Self {
        BatchEntry { key, fingerprint }
    }
}

/// Runs a batch tool: `entries` and `items` are in the same order, one entry per item.
pub(crate) async fn run_batch<T, E, H, I, B, F>(
    tool: &'static ToolInfo,
    entries: Vec<BatchEntry>,
    items: Vec<I>,
    body: B,
) -> Result<Batch<T, E>, Error<E>>
where
    T: Serialize + DeserializeOwned,
    E: ErrorHandling<H>,
    B: FnOnce(Vec<I>) -> F,
    F: Future<Output = Vec<Result<T, E>>>,
{
    let name = tool.name;
    let Some(scope) = Scope::current() else {
        return Err(Error::NoRuntime { tool: name });
    };
    crate::registry::write_report_from_env(Some(scope.idem()));
    if items.len() > MAX_BATCH_ITEMS {
        return Err(Error::BatchTooLarge {
            tool: name,
            items: items.len(),
            limit: MAX_BATCH_ITEMS,
        });
    }
    check_tenant(name, scope.tenant())?;
    let (idem, tenant) = scope.into_parts();
    let idem = &idem;
    // The keys: an item refused here is answered, and never claimed.
    let mut answers: Vec<Option<Result<Outcome<T>, Error<E>>>> = Vec::with_capacity(items.len());
    let mut keyed: Vec<(usize, BatchItem)> = Vec::with_capacity(items.len());
    let mut first_of: HashMap<IdempotencyKey, usize> = HashMap::with_capacity(items.len());
    for (index, entry) in entries.into_iter().enumerate() {
        match item_key(tool, &tenant, entry) {
            Err(refused) => answers.push(Some(Err(refused))),
            Ok(item) => match first_of.get(&item.key) {
                Some(&first) => answers.push(Some(Err(Error::DuplicateInBatch {
                    tool: name,
                    item: index,
                    first,
                }))),
                None => {
                    first_of.insert(item.key, index);
                    keyed.push((index, item));
                    answers.push(None);
                }
            },
        }
    }
    let observed: Vec<Observation> = keyed
        .iter()
        .map(|(_, item)| Observation::start(tool, &tenant, item.key))
        .collect();
    let lease = tool.effective_lease(idem);
    let ttl = tool.effective_ttl(idem);
    let orphans = tool.orphans();
    let now = idem.clock().now();
    let claims = if keyed.is_empty() {
        Vec::new()
    } else {
        let batch_items: Vec<BatchItem> = keyed.iter().map(|(_, item)| *item).collect();
        let claimed = idem.store().claim_batch(BatchClaim {
            tenant: &tenant,
            tool: name,
            now,
            lease,
            ttl,
            orphans,
            items: &batch_items,
        });
        match claimed.await {
            Ok(claims) if claims.len() == keyed.len() => claims,
            Ok(_) => {
                let e = idem_core::StoreError::new(
                    idem.store().backend(),
                    idem_core::StoreErrorKind::Corrupt,
                    "claim: the batch's answers do not match its items",
                );
                return Err(Error::Store(e));
            }
            Err(e) => return Err(Error::Store(e)),
        }
    };
    // Answered without running (a replay, a refusal), or to run: the body gets these, in order.
    let mut to_run: Vec<(usize, IdempotencyKey, Claimed)> = Vec::new();
    for ((index, item), claim) in keyed.iter().zip(claims) {
        let intent = Intent {
            tenant: tenant.clone(),
            key: item.key,
            tool: name,
            fingerprint: item.fingerprint,
            lease,
            ttl,
            orphans,
            wait: std::time::Duration::ZERO,
        };
        let claiming = Claiming::of(idem, &intent, claim, now);
        match call::to_run::<T, E, H>(name, item.key, claiming) {
            Ok(claimed) => to_run.push((*index, item.key, claimed)),
            Err(answer) => answers[*index] = Some(answer),
        }
    }
    if !to_run.is_empty() {
        let mut run = to_run.iter().map(|(index, _, _)| *index).peekable();
        let mut chosen = Vec::with_capacity(to_run.len());
        for (index, item) in items.into_iter().enumerate() {
            if run.next_if_eq(&index).is_some() {
                chosen.push(item);
            }
        }
        let claims: Vec<&Claimed> = to_run.iter().map(|(_, _, claimed)| claimed).collect();
        let calls = to_run
            .iter()
            .map(|(_, key, claimed)| (*key, claimed.lease_state().clone()))
            .collect();
        let body = crate::current::run_batch_as(name, calls, body(chosen));
        let results = super::lease::hold_all(&claims, body).await;
        let limit = idem.max_result_bytes();
        for (index, answer) in
            settle_all::<T, E, H>(idem, name, &tenant, ttl, to_run, results, limit).await
        {
            answers[index] = Some(answer);
        }
    }
    let answers: Vec<Result<Outcome<T>, Error<E>>> = answers
        .into_iter()
        .map(|answer| answer.expect("every item is answered"))
        .collect();
    let mut observed = observed.into_iter();
    for (index, _) in &keyed {
        if let Some(observation) = observed.next() {
            observation.finish(&answers[*index]);
        }
    }
    Ok(Batch::new(answers))
}

/// The key of one item, or why it has none.
fn item_key<E>(
    tool: &'static ToolInfo,
    tenant: &str,
    entry: BatchEntry,
) -> Result<BatchItem, Error<E>> {
    let name = tool.name;
    let fingerprint = entry
        .fingerprint
        .map_err(|source| Error::Unfingerprintable { tool: name, source })?;
    let key = entry.key.derive_required(tenant, name)?;
    Ok(BatchItem { key, fingerprint })
}

/// Settles every claimed item with its result, in one round trip; through a store error, each
/// item is settled again on its own (a completion that landed is recognised). Answers each
/// item's position and answer.
async fn settle_all<T, E, H>(
    idem: &Idem,
    name: &'static str,
    tenant: &Arc<str>,
    ttl: std::time::Duration,
    to_run: Vec<(usize, IdempotencyKey, Claimed)>,
    results: Vec<Result<T, E>>,
    limit: usize,
) -> Vec<(usize, Result<Outcome<T>, Error<E>>)>
where
    T: Serialize,
    E: ErrorHandling<H>,
{
    if results.len() != to_run.len() {
        // Which result is whose cannot be told: every item may have had its effect.
        let answered = results.len();
        let settlements: Vec<Settlement<'_>> = to_run
            .iter()
            .map(|(_, key, claimed)| Settlement {
                key: *key,
                token: claimed.token(),
                settle: Settle::Complete {
                    status: RecordStatus::Unknown,
                    result: &[],
                },
            })
            .collect();
        let batch = BatchSettlement {
            tenant,
            now: idem.clock().now(),
            ttl,
            items: &settlements,
        };
        if idem.store().settle_batch(batch).await.is_err() {
            let claims = to_run
                .iter()
                .map(|(_, _, claimed)| claimed.complete_retrying(RecordStatus::Unknown, &[]));
            join_all(claims.collect()).await;
        }
        let expected = to_run.len();
        return to_run
            .into_iter()
            .map(|(index, _, _)| {
                let error = Error::BatchAnswer {
                    tool: name,
                    expected,
                    answered,
                };
                (index, Err(error))
            })
            .collect();
    }
    let settlings: Vec<(Option<ErrorClass>, Settling)> = results
        .iter()
        .map(|result| settling::<T, E, H>(result, limit))
        .collect();
    // A result that could not be encoded is left to its lease, as a single call's is.
    let settlements: Vec<(usize, Settlement<'_>)> = to_run
        .iter()
        .zip(&settlings)
        .enumerate()
        .filter_map(|(i, ((_, key, claimed), (_, settling)))| {
            let settle = match settling {
                Settling::Release => Settle::Release,
                Settling::Record { status, bytes, .. } => Settle::Complete {
                    status: *status,
                    result: bytes,
                },
                Settling::NotStored(_) => return None,
            };
            let token = claimed.token();
            Some((
                i,
                Settlement {
                    key: *key,
                    token,
                    settle,
                },
            ))
        })
        .collect();
    let items: Vec<Settlement<'_>> = settlements.iter().map(|(_, s)| *s).collect();
    let batch = BatchSettlement {
        tenant,
        now: idem.clock().now(),
        ttl,
        items: &items,
    };
    let mut recorded: Vec<Option<Recorded>> = (0..to_run.len()).map(|_| None).collect();
    match idem.store().settle_batch(batch).await {
        Ok(answers) if answers.len() == items.len() => {
            for ((i, _), answer) in settlements.iter().zip(answers) {
                recorded[*i] = Some(Recorded {
                    answer: Ok(answer),
                    retries: 0,
                });
            }
        }
        // The round trip failed (or answered nonsense): each item on its own, as a single
        // call's completion is tried again (a completion that landed is recognised; a release
        // that landed answers lost, which a release ignores).
        _ => {
            let retried = settlements.iter().map(|(i, settlement)| {
                let claimed = &to_run[*i].2;
                async move {
                    match settlement.settle {
                        Settle::Complete { status, result } => {
                            Some(claimed.complete_retrying(status, result).await)
                        }
                        Settle::Release => {
                            let _ = idem
                                .store()
                                .release(tenant, settlement.key, claimed.token())
                                .await;
                            None
                        }
                    }
                }
            });
            let answers = join_all(retried.collect()).await;
            for ((i, _), answer) in settlements.iter().zip(answers) {
                recorded[*i] = answer;
            }
        }
    }
    let mut answers = Vec::with_capacity(to_run.len());
    for ((((index, key, _), result), (class, settling)), recorded) in
        to_run.into_iter().zip(results).zip(settlings).zip(recorded)
    {
        answers.push((
            index,
            settled(name, key, result, class, settling, recorded, limit),
        ));
    }
    answers
}

/// Awaits every future, polling them together; their outputs in their order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future finished"))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{BatchEntry, MAX_BATCH_ITEMS, run_batch};
    use crate::protocol::call::KeyParts;
    use crate::protocol::policy::{ReleaseErrors, StoreErrors};
    use crate::registry::ToolInfo;
    use crate::runtime::Idem;
    use idem_core::fingerprint::Fingerprint;
    use idem_core::key::{IdempotencyKey, KeyPart};
    use idem_core::store::memory::MemoryStore;
    use idem_core::store::{
        BatchClaim, BatchSettlement, Claim, ClaimRequest, Completion, Fenced, FencingToken, Record,
        Renewal, Store, StoreFuture, StoreHealth, UnixMillis,
    };
    use idem_core::{Batch, Error, ErrorClass, Outcome, StoreError, StoreErrorKind};

    static TOOL: ToolInfo = ToolInfo::new("batch.test", "send", "m", "f.rs", 1)
        .stable_name()
        .key(&["run", "items[].id"], true);

    /// An item: its id (the key part) and its content (fingerprinted).
    fn entry(id: &str, content: u8) -> BatchEntry {
        let key = KeyParts::new()
            .part("run", KeyPart::new("run-1").map(Some))
            .part("items[].id", KeyPart::new(id).map(Some));
        BatchEntry::new(key, Ok(Fingerprint::from_bytes([content; 32])))
    }

    /// One call over `items` (id, content): the body doubles each content, and counts what it
    /// was given.
    async fn send<H>(
        items: &[(String, u8)],
        ran: &Mutex<Vec<String>>,
        answer: impl Fn(u8) -> Result<u32, String>,
    ) -> Result<Batch<u32, String>, Error<String>>
    where
        String: crate::protocol::policy::ErrorHandling<H>,
    {
        let entries = items.iter().map(|(id, c)| entry(id, *c)).collect();
        let body = |given: Vec<(String, u8)>| async {
            let mut ran = ran.lock().unwrap();
            given
                .into_iter()
                .map(|(id, content)| {
                    ran.push(id);
                    answer(content)
                })
                .collect()
        };
        run_batch::<u32, String, H, _, _, _>(&TOOL, entries, items.to_vec(), body).await
    }

    fn items(ids: impl IntoIterator<Item = usize>) -> Vec<(String, u8)> {
        ids.into_iter()
            .map(|i| (format!("item-{i}"), (i % 200) as u8))
            .collect()
    }

    fn doubled(content: u8) -> Result<u32, String> {
        Ok(u32::from(content) * 2)
    }

    #[tokio::test]
    async fn a_batch_of_100_with_37_done_runs_the_other_63_and_answers_100_in_order() {
        let idem = Idem::with_store(MemoryStore::new());
        let ran = Mutex::new(Vec::new());
        // 37 items scattered over the 100 (7 is prime to 100: i * 7 % 100 is a permutation).
        let done: Vec<usize> = (0..100).filter(|i| i * 7 % 100 < 37).collect();
        assert_eq!(done.len(), 37);
        idem.scope("t")
            .run(async {
                let first = send::<ReleaseErrors>(&items(done.clone()), &ran, doubled).await;
                assert_eq!(first.unwrap().ran(), 37);
                ran.lock().unwrap().clear();
                let batch = send::<ReleaseErrors>(&items(0..100), &ran, doubled)
                    .await
                    .unwrap();
                assert_eq!(batch.len(), 100);
                assert_eq!(batch.ran(), 63);
                for (i, answer) in batch.iter().enumerate() {
                    let want = (i % 200) as u32 * 2;
                    match answer {
                        Ok(Outcome::Replayed(v)) if done.contains(&i) => assert_eq!(*v, want),
                        Ok(Outcome::Fresh(v)) if !done.contains(&i) => assert_eq!(*v, want),
                        other => panic!("item {i}: {other:?}"),
                    }
                }
            })
            .await;
        let ran = ran.into_inner().unwrap();
        let rest: Vec<String> = (0..100)
            .filter(|i| !done.contains(i))
            .map(|i| format!("item-{i}"))
            .collect();
        assert_eq!(ran, rest, "the body got exactly the other 63, in order");
    }

    #[tokio::test]
    async fn bad_items_never_block_the_others() {
        let idem = Idem::with_store(MemoryStore::new());
        let ran = Mutex::new(Vec::new());
        idem.scope("t")
            .run(async {
                let first = send::<ReleaseErrors>(&[("a".into(), 1)], &ran, doubled).await;
                assert_eq!(first.unwrap().ran(), 1);
                let mixed = vec![
                    ("a".to_owned(), 9), // other content under a done key: mismatch
                    ("b".to_owned(), 2), // new
                    ("b".to_owned(), 2), // the same key again in one batch
                    (String::new(), 3),  // an invalid key part
                    ("c".to_owned(), 4), // new
                ];
                let batch = send::<ReleaseErrors>(&mixed, &ran, doubled).await.unwrap();
                let answers = batch.into_vec();
                assert!(
                    matches!(answers[0], Ok(Outcome::Mismatch(_))),
                    "{:?}",
                    answers[0]
                );
                assert!(matches!(answers[1], Ok(Outcome::Fresh(4))));
                assert!(
                    matches!(
                        answers[2],
                        Err(Error::DuplicateInBatch {
                            item: 2,
                            first: 1,
                            ..
                        })
                    ),
                    "{:?}",
                    answers[2]
                );
                assert!(matches!(answers[3], Err(Error::InvalidKey { .. })));
                assert!(matches!(answers[4], Ok(Outcome::Fresh(8))));
            })
            .await;
        assert_eq!(ran.into_inner().unwrap(), ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn each_items_error_follows_the_policy() {
        let idem = Idem::with_store(MemoryStore::new());
        let ran = Mutex::new(Vec::new());
        let odd_fails = |content: u8| {
            if content % 2 == 1 {
                Err(format!("declined {content}"))
            } else {
                doubled(content)
            }
        };
        idem.scope("t")
            .run(async {
                // Released: the failed items run again on the retry.
                let released = items(0..4);
                let first = send::<ReleaseErrors>(&released, &ran, odd_fails)
                    .await
                    .unwrap();
                assert!(matches!(
                    first.get(1),
                    Some(Err(Error::Tool {
                        class: ErrorClass::Release,
                        replayed: false,
                        ..
                    }))
                ));
                let retry = send::<ReleaseErrors>(&released, &ran, doubled)
                    .await
                    .unwrap();
                assert_eq!(retry.ran(), 2, "only the released items ran again");
                assert!(matches!(retry.get(1), Some(Ok(Outcome::Fresh(2)))));
                assert!(matches!(retry.get(2), Some(Ok(Outcome::Replayed(4)))));
                // Stored: the error replays, the body does not run again.
                let stored = items(10..12);
                let first = send::<StoreErrors>(&stored, &ran, odd_fails).await.unwrap();
                assert_eq!(first.ran(), 2);
                let retry = send::<StoreErrors>(&stored, &ran, doubled).await.unwrap();
                assert_eq!(retry.ran(), 0);
                match retry.get(1) {
                    Some(Err(Error::Tool {
                        error,
                        replayed: true,
                        ..
                    })) => assert_eq!(error, "declined 11"),
                    other => panic!("a stored error replays: {other:?}"),
                }
            })
            .await;
    }

    #[tokio::test]
    async fn a_body_that_answers_another_count_blocks_its_items_as_unknown() {
        let idem = Idem::with_store(MemoryStore::new());
        idem.scope("t")
            .run(async {
                let entries = vec![entry("x", 1), entry("y", 2)];
                let body = |_: Vec<u8>| async { vec![Ok::<u32, String>(1)] };
                let batch = run_batch::<u32, String, ReleaseErrors, _, _, _>(
                    &TOOL,
                    entries,
                    vec![1, 2],
                    body,
                )
                .await
                .unwrap();
                for answer in &batch {
                    assert!(
                        matches!(
                            answer,
                            Err(Error::BatchAnswer {
                                expected: 2,
                                answered: 1,
                                ..
                            })
                        ),
                        "{answer:?}"
                    );
                }
                assert_eq!(batch.ran(), 2, "their effects may have happened");
                let again = run_batch::<u32, String, ReleaseErrors, _, _, _>(
                    &TOOL,
                    vec![entry("x", 1), entry("y", 2)],
                    vec![1, 2],
                    |_: Vec<u8>| async { panic!("blocked items never run") },
                )
                .await
                .unwrap();
                assert!(again.iter().all(|a| matches!(a, Ok(Outcome::Unknown(_)))));
            })
            .await;
    }

    #[tokio::test]
    async fn too_many_items_are_refused_before_the_store() {
        let idem = Idem::with_store(MemoryStore::new());
        let ran = Mutex::new(Vec::new());
        let answer = idem
            .scope("t")
            .run(send::<ReleaseErrors>(
                &items(0..MAX_BATCH_ITEMS + 1),
                &ran,
                doubled,
            ))
            .await;
        assert!(
            matches!(
                answer,
                Err(Error::BatchTooLarge {
                    items: 1001,
                    limit: 1000,
                    ..
                })
            ),
            "{answer:?}"
        );
        assert!(ran.into_inner().unwrap().is_empty());
        let none = send::<ReleaseErrors>(&[], &Mutex::new(Vec::new()), doubled).await;
        assert!(matches!(none, Err(Error::NoRuntime { .. })));
    }

    #[tokio::test]
    async fn the_body_knows_each_items_downstream_key_and_no_single_call() {
        let idem = Idem::with_store(MemoryStore::new());
        let seen = Mutex::new(Vec::new());
        idem.scope("t")
            .run(async {
                let body = |given: Vec<(String, u8)>| async {
                    assert!(crate::current().is_none(), "a batch has no one key");
                    let batch = crate::current_batch().expect("inside a batch body");
                    assert_eq!((batch.len(), batch.tool()), (given.len(), "batch.test"));
                    let mut seen = seen.lock().unwrap();
                    for (i, (id, content)) in given.iter().enumerate() {
                        let key = batch.item(i).unwrap().derive("provider");
                        seen.push((id.clone(), key.as_str().to_owned()));
                        let _ = content;
                    }
                    given
                        .into_iter()
                        .map(|(_, c)| doubled(c))
                        .collect::<Vec<_>>()
                };
                let all = items(0..3);
                let entries = all.iter().map(|(id, c)| entry(id, *c)).collect();
                run_batch::<u32, String, ReleaseErrors, _, _, _>(&TOOL, entries, all, body)
                    .await
                    .unwrap();
            })
            .await;
        let seen = seen.into_inner().unwrap();
        for (id, downstream) in &seen {
            let parts = [KeyPart::new("run-1").unwrap(), KeyPart::new(id).unwrap()];
            let key = idem_core::key::derive_key("t", "batch.test", &parts);
            let expected = idem_core::key::derive_downstream_key(&key, "provider");
            assert_eq!(downstream, expected.as_str(), "{id}: the item's own key");
        }
        assert_eq!(seen.len(), 3);
        assert_ne!(seen[0].1, seen[1].1);
        assert!(crate::current_batch().is_none(), "outside a body");
    }

    static SHORT_LEASE: ToolInfo = ToolInfo::new("batch.slow", "send", "m", "f.rs", 2)
        .stable_name()
        .key(&["run", "items[].id"], true)
        .lease_ms(30);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_longer_than_its_lease_keeps_every_items_lease() {
        let idem = Idem::with_store(MemoryStore::new());
        let scope = idem.scope("t");
        let call = |ms: u64| {
            let all = items(0..5);
            let entries = all.iter().map(|(id, c)| entry(id, *c)).collect();
            let body = move |given: Vec<(String, u8)>| async move {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                let batch = crate::current_batch().expect("a batch");
                assert!(batch.items().iter().all(|call| !call.is_lease_lost()));
                given
                    .into_iter()
                    .map(|(_, c)| doubled(c))
                    .collect::<Vec<_>>()
            };
            scope.run(run_batch::<u32, String, ReleaseErrors, _, _, _>(
                &SHORT_LEASE,
                entries,
                all,
                body,
            ))
        };
        // The body runs for more than six leases; meanwhile a second call finds every item held.
        let (first, second) = tokio::join!(call(200), async {
            tokio::time::sleep(std::time::Duration::from_millis(120)).await;
            call(0).await
        });
        let second = second.unwrap();
        assert!(
            second.iter().all(|a| matches!(a, Ok(Outcome::InFlight(_)))),
            "renewed, never taken over: {second:?}"
        );
        let first = first.unwrap();
        assert_eq!(first.ran(), 5);
        let third = call(0).await.unwrap();
        assert!(third.iter().all(|a| matches!(a, Ok(Outcome::Replayed(_)))));
    }

    /// A memory store whose batch settlement lands and then loses its answer, once.
    struct LosesSettlement {
        inner: MemoryStore,
        lost: AtomicUsize,
    }

    impl Store for LosesSettlement {
        fn backend(&self) -> &'static str {
            "loses-settlement"
        }
        fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
            self.inner.claim(req)
        }
        fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
            self.inner.claim_batch(batch)
        }
        fn settle_batch<'a>(&'a self, batch: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
            Box::pin(async move {
                let answers = self.inner.settle_batch(batch).await?;
                if self.lost.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(StoreError::new(
                        "loses-settlement",
                        StoreErrorKind::Unavailable,
                        "the answer was lost",
                    ));
                }
                Ok(answers)
            })
        }
        fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
            self.inner.complete(c)
        }
        fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
            self.inner.renew(r)
        }
        fn release<'a>(
            &'a self,
            tenant: &'a str,
            key: IdempotencyKey,
            token: FencingToken,
        ) -> StoreFuture<'a, Fenced> {
            self.inner.release(tenant, key, token)
        }
        fn lookup<'a>(
            &'a self,
            tenant: &'a str,
            key: IdempotencyKey,
        ) -> StoreFuture<'a, Option<Record>> {
            self.inner.lookup(tenant, key)
        }
        fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
            self.inner.purge_expired(now, limit)
        }
        fn health(&self) -> StoreFuture<'_, StoreHealth> {
            self.inner.health()
        }
    }

    #[tokio::test]
    async fn a_settlement_whose_answer_was_lost_is_recognised_item_by_item() {
        let idem = Idem::with_store(LosesSettlement {
            inner: MemoryStore::new(),
            lost: AtomicUsize::new(0),
        });
        let ran = Mutex::new(Vec::new());
        let fails_on_3 = |content: u8| {
            if content == 3 {
                Err("invalid".to_owned())
            } else {
                doubled(content)
            }
        };
        idem.scope("t")
            .run(async {
                let batch = send::<ReleaseErrors>(&items(0..5), &ran, fails_on_3)
                    .await
                    .unwrap();
                assert_eq!(batch.ran(), 5);
                assert!(matches!(batch.get(0), Some(Ok(Outcome::Fresh(0)))));
                assert!(matches!(batch.get(4), Some(Ok(Outcome::Fresh(8)))));
                assert!(matches!(batch.get(3), Some(Err(Error::Tool { .. }))));
                let retry = send::<ReleaseErrors>(&items(0..5), &ran, doubled)
                    .await
                    .unwrap();
                assert_eq!(retry.ran(), 1, "only the released item runs again");
            })
            .await;
        assert_eq!(ran.into_inner().unwrap().len(), 6);
    }
}
