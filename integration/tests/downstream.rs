//! Downstream keys: inside a tool body, `idem::current()` derives the key to send to the provider,
//! the same for every retry and every re-execution of the intent.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use common::{effect, effects, manual_runtime, unique};
use idem::{Idem, idempotent};

/// The keys the "provider" received, by run id, in order.
static SENT: Mutex<Option<HashMap<String, Vec<String>>>> = Mutex::new(None);

fn send(run: &str, key: &str) {
    SENT.lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(run.to_owned())
        .or_default()
        .push(key.to_owned());
}

fn sent(run: &str) -> Vec<String> {
    SENT.lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(run).cloned())
        .unwrap_or_default()
}

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("the provider timed out")]
struct Timeout;

/// Charges through a provider, sending the downstream key; `hang` never returns (the agent loop
/// cancels it), `fail` returns an error (released, so a retry runs again). Both are test controls,
/// left out of the fingerprint.
#[idempotent(
    key = "run_id",
    mutating,
    name = "downstream.charge",
    skip = "hang, fail"
)]
async fn charge(run_id: String, amount_cents: u64, hang: bool, fail: bool) -> Result<u64, Timeout> {
    let call = idem::current().expect("a keyed tool knows its call");
    assert_eq!(call.tool(), "downstream.charge");
    send(&run_id, call.derive("stripe").as_str());
    effect(&run_id);
    if hang {
        std::future::pending::<()>().await;
    }
    if fail {
        return Err(Timeout);
    }
    Ok(amount_cents)
}

#[idempotent(natural, name = "downstream.set_status")]
async fn set_status(entity: String) -> Result<bool, std::convert::Infallible> {
    Ok(idem::current().is_some() || entity.is_empty())
}

#[idempotent(key = "request_id", mutating, name = "downstream.optional")]
async fn optional(request_id: Option<String>) -> Result<bool, std::convert::Infallible> {
    Ok(idem::current().is_some() && request_id.is_some())
}

#[tokio::test]
async fn a_retry_after_an_error_sends_the_same_downstream_key() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let first = tenant.run(charge(run.clone(), 500, false, true)).await;
    assert!(first.is_err());
    let second = tenant.run(charge(run.clone(), 500, false, false)).await;
    assert!(second.unwrap().is_fresh());
    let keys = sent(&run);
    assert_eq!(
        keys.len(),
        2,
        "the body ran twice: the first attempt released its claim"
    );
    assert_eq!(keys[0], keys[1], "and the provider saw one intent");
    assert_eq!(keys[0].len(), 64);
}

#[tokio::test]
async fn a_re_execution_after_a_cancelled_call_sends_the_same_downstream_key() {
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");

    // The agent loop gives up on a call that hangs: its future is dropped mid-flight.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        tenant.run(charge(run.clone(), 500, true, false)),
    )
    .await;
    assert!(cancelled.is_err(), "the call was cancelled");
    assert_eq!(effects(&run), 1);

    // Its claim is protected by the lease: a retry meanwhile does not run the body.
    let retry = tenant
        .run(charge(run.clone(), 500, false, false))
        .await
        .unwrap();
    assert!(retry.is_in_flight(), "{retry:?}");
    assert_eq!(
        effects(&run),
        1,
        "nothing blocks forever, nothing runs meanwhile"
    );

    // After the lease, the orphan is taken over and the body runs again, with the same key
    // downstream, so the provider deduplicates the charge.
    clock.advance(Duration::from_secs(31));
    let again = tenant
        .run(charge(run.clone(), 500, false, false))
        .await
        .unwrap();
    assert!(again.is_fresh(), "{again:?}");
    let keys = sent(&run);
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);

    // And once completed, it replays without calling the provider.
    let replay = tenant
        .run(charge(run.clone(), 500, false, false))
        .await
        .unwrap();
    assert!(replay.is_replayed());
    assert_eq!(sent(&run).len(), 2);
}

#[tokio::test]
async fn downstream_keys_differ_per_intent_and_tenant() {
    let idem = Idem::open("memory://").await.unwrap();
    let (a, b) = (unique("run"), unique("run"));
    let tenant = idem.scope("tenant-a");
    assert!(tenant.run(charge(a.clone(), 5, false, false)).await.is_ok());
    assert!(tenant.run(charge(b.clone(), 5, false, false)).await.is_ok());
    let other = unique("run");
    // The same run id in another tenant is another intent.
    assert!(
        idem.scope("tenant-b")
            .run(charge(a.clone(), 5, false, false))
            .await
            .is_ok()
    );
    let (ka, kb) = (sent(&a), sent(&b));
    assert_ne!(ka[0], kb[0]);
    assert_eq!(ka.len(), 2);
    assert_ne!(ka[0], ka[1], "tenant-a and tenant-b");
    assert!(sent(&other).is_empty());
}

#[tokio::test]
async fn there_is_no_current_call_outside_a_keyed_body() {
    assert!(idem::current().is_none());
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("tenant-a");
    let natural = tenant.run(set_status("x".into())).await.unwrap();
    assert_eq!(natural.value(), Some(&false), "natural tools have no key");
    let unprotected = tenant.run(optional(None)).await.unwrap();
    assert_eq!(
        unprotected.value(),
        Some(&false),
        "a call without its key has none"
    );
    let keyed = tenant.run(optional(Some(unique("req")))).await.unwrap();
    assert_eq!(keyed.value(), Some(&true));
}

#[idempotent(key = "run_id", mutating, name = "downstream.panics", skip = "panic")]
async fn panics(run_id: String, panic: bool) -> Result<u64, std::convert::Infallible> {
    let call = idem::current().expect("keyed");
    send(&run_id, call.derive("ledger").as_str());
    effect(&run_id);
    if panic {
        panic!("the tool body panicked");
    }
    Ok(1)
}

#[tokio::test]
async fn a_panicking_body_leaves_a_claim_the_lease_protects() {
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let crashed = tokio::spawn(tenant.run(panics(run.clone(), true))).await;
    assert!(crashed.unwrap_err().is_panic());
    let meanwhile = tenant.run(panics(run.clone(), false)).await.unwrap();
    assert!(meanwhile.is_in_flight(), "{meanwhile:?}");
    assert_eq!(effects(&run), 1);
    clock.advance(Duration::from_secs(31));
    assert!(
        tenant
            .run(panics(run.clone(), false))
            .await
            .unwrap()
            .is_fresh()
    );
    let keys = sent(&run);
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0], keys[1],
        "the re-execution sends the same downstream key"
    );
}
