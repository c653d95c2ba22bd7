//! The agent loop's retry executor: it retries what a retry can change (in flight, store
//! down), with the same key, never a mismatch, and dead-letters the step when the budget runs
//! out. Effects are counted: the body never runs twice.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{CountingStore, effect, effects, unique};
use idem::retry::{DeadLetterReason, RetryError, RetryPolicy, retry};
use idem::store::admin::AdminStore;
use idem::{Error, Idem, Outcome, idempotent};

#[idempotent(key = "run_id", mutating, name = "retry.charge", skip = "hold_ms")]
async fn charge(run_id: String, amount: u64, hold_ms: u64) -> Result<u64, String> {
    effect(&run_id);
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    Ok(amount)
}

fn quick(budget_ms: u64) -> RetryPolicy {
    RetryPolicy {
        max_attempts: 1000,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        budget: Duration::from_millis(budget_ms),
    }
}

#[tokio::test]
async fn an_in_flight_call_is_waited_for_and_replayed() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let first = tokio::spawn(tenant.run(charge(run.clone(), 5, 150)));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let calls = AtomicUsize::new(0);
    let out = tenant
        .run(retry(&quick(5_000), || {
            calls.fetch_add(1, Ordering::SeqCst);
            charge(run.clone(), 5, 0)
        }))
        .await
        .unwrap();
    assert_eq!(out, Outcome::Replayed(5));
    assert!(
        calls.load(Ordering::SeqCst) > 1,
        "it waited and called again"
    );
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Fresh(5));
    assert_eq!(effects(&run), 1);
}

#[tokio::test]
async fn a_mismatch_is_never_retried() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    assert!(
        tenant
            .run(charge(run.clone(), 5, 0))
            .await
            .unwrap()
            .is_fresh()
    );
    let calls = AtomicUsize::new(0);
    let out = tenant
        .run(retry(&quick(5_000), || {
            calls.fetch_add(1, Ordering::SeqCst);
            charge(run.clone(), 6, 0)
        }))
        .await
        .unwrap();
    assert!(out.is_mismatch());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_step_in_flight_for_the_whole_budget_is_dead_lettered_once() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant_name = unique("tenant");
    let tenant = idem.scope(tenant_name.clone());
    let run = unique("run");
    let stuck = tokio::spawn(tenant.run(charge(run.clone(), 5, 60_000)));
    tokio::time::sleep(Duration::from_millis(20)).await;
    for _ in 0..2 {
        let err = tenant
            .run(retry(&quick(100), || charge(run.clone(), 5, 0)))
            .await
            .unwrap_err();
        let RetryError::DeadLettered {
            tool,
            reason,
            attempts,
            ..
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(*tool, "retry.charge");
        assert_eq!(*reason, DeadLetterReason::IdempotencyInFlight);
        assert!(*attempts > 1);
        assert!(!err.to_string().contains(&run), "no key in: {err}");
    }
    let letters = idem.dead_letters(&tenant_name).await.unwrap();
    assert_eq!(letters.len(), 1, "one entry per step: {letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.tool, "retry.charge");
    assert_eq!(letter.reason, DeadLetterReason::IdempotencyInFlight);
    assert_eq!(letter.tenant, tenant_name);
    assert_eq!(letter.key.len(), 12, "the key's short hash");
    assert!(!serde_json::to_string(letter).unwrap().contains(&run));
    assert!(idem.acknowledge(&tenant_name, &letter.id).await.unwrap());
    assert!(idem.dead_letters(&tenant_name).await.unwrap().is_empty());
    assert!(!idem.acknowledge(&tenant_name, &letter.id).await.unwrap());
    assert_eq!(
        effects(&run),
        1,
        "the stuck call ran once; no retry ran the body"
    );
    stuck.abort();
}

#[tokio::test]
async fn a_store_outage_is_retried_then_dead_lettered() {
    let store = Arc::new(CountingStore::default());
    store.fail_claims.store(3, Ordering::SeqCst);
    let idem = Idem::with_store(store.clone());
    let tenant = idem.scope("tenant-a");

    // A short outage: retried through it.
    let run = unique("run");
    let out = tenant
        .run(retry(&quick(5_000), || charge(run.clone(), 5, 0)))
        .await
        .unwrap();
    assert_eq!(out, Outcome::Fresh(5));
    assert_eq!(effects(&run), 1);

    // An outage longer than the budget: the step is dead-lettered with its reason.
    store.fail_claims.store(usize::MAX / 2, Ordering::SeqCst);
    let run = unique("run");
    let err = tenant
        .run(retry(&quick(100), || charge(run.clone(), 5, 0)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RetryError::DeadLettered {
                reason: DeadLetterReason::StoreUnavailable,
                last: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        effects(&run),
        0,
        "the body never ran on a store it could not claim in"
    );
    let page = store.inner.scan(Some("tenant-a"), None, 100).await.unwrap();
    let letters: Vec<_> = page
        .records
        .iter()
        .filter(|r| r.tool == idem::retry::DEAD_LETTER_TOOL)
        .collect();
    assert_eq!(letters.len(), 1);
    let text = String::from_utf8(letters[0].result.clone().unwrap()).unwrap();
    assert!(
        text.contains("store_unavailable") && !text.contains(&run),
        "{text}"
    );
}

#[tokio::test]
async fn tool_errors_are_returned_not_retried() {
    #[idempotent(key = "run_id", mutating, name = "retry.failing")]
    async fn failing(run_id: String) -> Result<u64, String> {
        effect(&run_id);
        Err("declined".into())
    }
    let idem = Idem::open("memory://").await.unwrap();
    let run = unique("run");
    let err = idem
        .scope("tenant-a")
        .run(retry(&quick(5_000), || failing(run.clone())))
        .await
        .unwrap_err();
    assert!(
        matches!(err, RetryError::Call(Error::Tool { .. })),
        "{err:?}"
    );
    assert_eq!(effects(&run), 1);
}
