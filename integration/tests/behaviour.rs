//! The contract of DESIGN §2, proven by counting effects: how many times each body really ran.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{CountingStore, DownStore, effect, effects, unique};
use idem::clock::ManualClock;
use idem::{Error, ErrorClass, Idem, Outcome, idempotent};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    id: String,
    customer: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
enum PaymentError {
    #[error("card declined")]
    Declined,
    #[error("amount must be positive")]
    ZeroAmount,
}

/// The seeds' tool: charges once per (run_id, step_id).
#[idempotent(key = "run_id, step_id", mutating, name = "payments.register")]
async fn register_payment(
    run_id: String,
    step_id: String,
    customer: String,
    amount_cents: u64,
) -> Result<Payment, PaymentError> {
    if amount_cents == 0 {
        return Err(PaymentError::ZeroAmount);
    }
    effect(&run_id);
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Payment {
        id: format!("pay_{}", uuid::Uuid::new_v4().simple()),
        customer,
        amount_cents,
    })
}

/// Declines are stored and replayed, as Stripe does for requests that started.
#[idempotent(key = "run_id", mutating, name = "payments.strict", on_error = "store")]
async fn strict_payment(run_id: String, amount_cents: u64) -> Result<Payment, PaymentError> {
    effect(&run_id);
    if amount_cents > 1_000 {
        return Err(PaymentError::Declined);
    }
    Ok(Payment {
        id: "pay_strict".into(),
        customer: "c".into(),
        amount_cents,
    })
}

fn call(
    run: &str,
    amount: u64,
) -> impl Future<Output = Result<Outcome<Payment>, Error<PaymentError>>> {
    register_payment(run.to_owned(), "step-1".into(), "cus_42".into(), amount)
}

async fn sqlite(dir: &tempfile::TempDir) -> Idem {
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    Idem::open(&url).await.expect("open sqlite")
}

#[tokio::test]
async fn a_retry_is_replayed_and_the_body_runs_once() {
    let idem = Idem::open("memory://").await.unwrap();
    let run = unique("run");
    let tenant = idem.scope("tenant-a");
    let first = tenant.run(call(&run, 500)).await.unwrap();
    let second = tenant.run(call(&run, 500)).await.unwrap();
    let Outcome::Fresh(paid) = first else {
        panic!("first call: {first:?}")
    };
    assert_eq!(
        second,
        Outcome::Replayed(paid),
        "the retry gets the first result"
    );
    assert_eq!(effects(&run), 1);
}

#[tokio::test]
async fn a_mismatch_never_runs_the_body() {
    let idem = Idem::open("memory://").await.unwrap();
    let run = unique("run");
    let tenant = idem.scope("tenant-a");
    assert!(tenant.run(call(&run, 500)).await.unwrap().is_fresh());
    for amount in [501, 5_000, 1] {
        let out = tenant.run(call(&run, amount)).await.unwrap();
        assert!(out.is_mismatch(), "amount {amount}: {out:?}");
    }
    assert_eq!(effects(&run), 1);
    assert!(
        tenant.run(call(&run, 500)).await.unwrap().is_replayed(),
        "the original still replays"
    );
}

#[tokio::test]
async fn a_mismatch_while_in_flight_is_reported_before_in_flight() {
    let idem = Idem::open("memory://").await.unwrap();
    let run = unique("run");
    let tenant = idem.scope("tenant-a");
    let running = tokio::spawn({
        let (tenant, run) = (tenant.clone(), run.clone());
        async move { tenant.run(call(&run, 500)).await }
    });
    wait_for_effects(&run, 1).await; // the first call holds its claim and is in its body
    let out = tenant.run(call(&run, 999)).await.unwrap();
    assert!(out.is_mismatch(), "{out:?}");
    assert!(running.await.unwrap().unwrap().is_fresh());
    assert_eq!(effects(&run), 1);
}

async fn sixty_four_concurrent_calls(idem: &Idem) {
    let run = unique("run");
    let tenant = idem.scope("tenant-a");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (tenant, run) = (tenant.clone(), run.clone());
        tasks.spawn(async move { tenant.run(call(&run, 500)).await });
    }
    let (mut fresh, mut replayed, mut in_flight) = (0, 0, 0);
    while let Some(done) = tasks.join_next().await {
        match done.unwrap().unwrap() {
            Outcome::Fresh(_) => fresh += 1,
            Outcome::Replayed(_) => replayed += 1,
            Outcome::InFlight(i) => {
                assert!(i.retry_after <= Duration::from_secs(30));
                in_flight += 1;
            }
            other => panic!("unexpected outcome under contention: {other:?}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one call runs the body");
    assert_eq!(fresh + replayed + in_flight, 64);
    assert_eq!(effects(&run), 1, "the effect happened once");
    assert!(tenant.run(call(&run, 500)).await.unwrap().is_replayed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_calls_run_once_in_memory() {
    sixty_four_concurrent_calls(&Idem::open("memory://").await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_calls_run_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    sixty_four_concurrent_calls(&sqlite(&dir).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_replays_from_the_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let run = unique("run");
    let first = {
        let idem = sqlite(&dir).await;
        idem.scope("tenant-a").run(call(&run, 500)).await.unwrap()
    }; // the runtime, its writer thread and its connections are gone
    let idem = sqlite(&dir).await;
    let again = idem.scope("tenant-a").run(call(&run, 500)).await.unwrap();
    assert_eq!(again, Outcome::Replayed(first.into_value().unwrap()));
    assert!(
        idem.scope("tenant-a")
            .run(call(&run, 600))
            .await
            .unwrap()
            .is_mismatch()
    );
    assert_eq!(effects(&run), 1);
    // And the 64-caller race on the reopened file.
    sixty_four_concurrent_calls(&idem).await;
}

#[tokio::test]
async fn an_error_releases_the_key_so_a_corrected_retry_runs() {
    let idem = Idem::open("memory://").await.unwrap();
    let run = unique("run");
    let tenant = idem.scope("tenant-a");
    let err = tenant.run(call(&run, 0)).await.unwrap_err();
    assert!(matches!(
        err,
        Error::Tool {
            error: PaymentError::ZeroAmount,
            replayed: false,
            class: ErrorClass::Release,
        }
    ));
    // Same key, same (bad) arguments: released, so it runs (and fails) again.
    assert!(tenant.run(call(&run, 0)).await.is_err());
    // Same key, corrected arguments: not a mismatch, the claim was released.
    let out = tenant.run(call(&run, 500)).await.unwrap();
    assert!(out.is_fresh(), "{out:?}");
    assert_eq!(effects(&run), 1);
}

#[tokio::test]
async fn under_on_error_store_the_error_is_replayed() {
    let idem = Idem::open("memory://").await.unwrap();
    let run = unique("run");
    let tenant = idem.scope("tenant-a");
    for replayed in [false, true, true] {
        let err = tenant
            .run(strict_payment(run.clone(), 5_000))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Tool { error: PaymentError::Declined, replayed: r, class: ErrorClass::Store } if r == replayed),
            "{err:?}"
        );
    }
    assert_eq!(effects(&run), 1, "the declined charge was attempted once");
    assert!(
        tenant
            .run(strict_payment(run.clone(), 10))
            .await
            .unwrap()
            .is_mismatch()
    );
}

#[tokio::test]
async fn two_tenants_with_the_same_key_never_see_each_other() {
    let idem = Idem::open("memory://").await.unwrap();
    let run = unique("run");
    let a = idem.scope("tenant-a").run(call(&run, 500)).await.unwrap();
    let b = idem.scope("tenant-b").run(call(&run, 500)).await.unwrap();
    assert!(
        a.is_fresh() && b.is_fresh(),
        "each tenant's intent is its own"
    );
    assert_ne!(a.value().unwrap().id, b.value().unwrap().id);
    let a2 = idem.scope("tenant-a").run(call(&run, 500)).await.unwrap();
    assert_eq!(a2, Outcome::Replayed(a.into_value().unwrap()));
    let b_other = idem.scope("tenant-b").run(call(&run, 700)).await.unwrap();
    assert!(b_other.is_mismatch());
    assert_eq!(effects(&run), 2);
}

/// A tool whose body waits for the test's signal, to hold a claim open.
#[idempotent(
    key = "run_id",
    mutating,
    name = "test.gated",
    lease = "30s",
    skip = "gate"
)]
async fn gated(run_id: String, gate: GateId) -> Result<String, std::convert::Infallible> {
    effect(&run_id);
    let n = effects(&run_id);
    GATES.get(gate.0).notified().await;
    Ok(format!("owner-{n}"))
}

#[derive(Debug, Clone, Copy, Serialize)]
struct GateId(usize);

struct Gates(std::sync::Mutex<Vec<Arc<Notify>>>);

impl Gates {
    fn open(&self) -> (GateId, Arc<Notify>) {
        let mut gates = self.0.lock().unwrap();
        gates.push(Arc::new(Notify::new()));
        (GateId(gates.len() - 1), gates.last().unwrap().clone())
    }
    fn get(&self, id: usize) -> Arc<Notify> {
        self.0.lock().unwrap()[id].clone()
    }
}

static GATES: Gates = Gates(std::sync::Mutex::new(Vec::new()));

/// Waits (bounded) until `id` had `n` effects.
async fn wait_for_effects(id: &str, n: usize) {
    for _ in 0..10_000 {
        if effects(id) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{id} never reached {n} effects (has {})", effects(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lapsed_lease_lets_exactly_one_new_owner_in_and_fences_the_zombie() {
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::builder()
        .clock(clock.clone())
        .build(idem::store::memory::MemoryStore::new());
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let (gate, zombie_gate) = GATES.open();

    let zombie = tokio::spawn({
        let (tenant, run) = (tenant.clone(), run.clone());
        async move { tenant.run(gated(run, gate)).await }
    });
    wait_for_effects(&run, 1).await;
    let blocked = tenant.run(gated(run.clone(), gate)).await.unwrap();
    assert!(blocked.is_in_flight(), "the lease is live: {blocked:?}");

    clock.advance(Duration::from_secs(31));
    let (gate2, owner_gate) = GATES.open();
    let mut contenders = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (tenant, run) = (tenant.clone(), run.clone());
        contenders.spawn(async move { tenant.run(gated(run, gate2)).await });
    }
    wait_for_effects(&run, 2).await;
    owner_gate.notify_one();
    let mut owners = 0;
    while let Some(done) = contenders.join_next().await {
        match done.unwrap().unwrap() {
            Outcome::Fresh(v) => {
                assert_eq!(v, "owner-2");
                owners += 1;
            }
            Outcome::InFlight(_) | Outcome::Replayed(_) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(owners, 1, "exactly one contender takes the orphan over");
    assert_eq!(effects(&run), 2, "the zombie and one new owner, never more");

    zombie_gate.notify_one();
    let err = zombie.await.unwrap().unwrap_err();
    assert!(
        matches!(err, Error::LeaseLost { .. }),
        "the zombie's completion is refused: {err:?}"
    );
    let replay = tenant.run(gated(run.clone(), gate)).await.unwrap();
    assert_eq!(
        replay,
        Outcome::Replayed("owner-2".to_owned()),
        "the new owner's result stands"
    );
}

#[tokio::test]
async fn after_the_ttl_a_reused_key_is_a_new_intent() {
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::builder()
        .ttl(Duration::from_secs(3600))
        .clock(clock.clone())
        .build(idem::store::memory::MemoryStore::new());
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    assert!(tenant.run(call(&run, 500)).await.unwrap().is_fresh());
    clock.advance(Duration::from_secs(3599));
    assert!(tenant.run(call(&run, 500)).await.unwrap().is_replayed());
    clock.advance(Duration::from_secs(1));
    assert!(
        tenant.run(call(&run, 900)).await.unwrap().is_fresh(),
        "expired: new intent"
    );
    assert_eq!(effects(&run), 2);
    clock.advance(Duration::from_secs(7200));
    assert_eq!(idem.purge_expired(10).await.unwrap(), 1);
}

#[tokio::test]
async fn an_unreachable_store_fails_closed() {
    let idem = Idem::with_store(DownStore);
    let run = unique("run");
    let err = idem
        .scope("tenant-a")
        .run(call(&run, 500))
        .await
        .unwrap_err();
    let Error::Store(store) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(store.kind(), idem::StoreErrorKind::Unavailable);
    assert!(!err.body_ran());
    assert_eq!(effects(&run), 0, "no store, no effect");
}

#[tokio::test]
async fn a_store_failing_at_completion_says_the_body_ran() {
    let store = Arc::new(CountingStore::default());
    store
        .fail_completions
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let idem = Idem::with_store(store.clone());
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let err = tenant.run(call(&run, 500)).await.unwrap_err();
    assert!(
        matches!(err, Error::CompletionFailed { .. }),
        "not a plain store error, which would say the body did not run: {err:?}"
    );
    assert!(err.body_ran() && !err.is_store());
    assert!(!err.to_string().contains(&run), "no raw key in: {err}");
    assert_eq!(effects(&run), 1);

    store
        .fail_completions
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let again = tenant.run(call(&run, 500)).await.expect("call");
    assert!(
        again.is_in_flight(),
        "the unrecorded claim keeps the key until its lease lapses: {again:?}"
    );
    assert_eq!(effects(&run), 1, "the retry did not run the body again");
}

#[tokio::test]
async fn an_invalid_key_is_refused_before_the_store_is_touched() {
    let store = Arc::new(CountingStore::default());
    let idem = Idem::with_store(store.clone());
    let tenant = idem.scope("tenant-a");
    for bad in ["", "run 9", "señal", &"x".repeat(256)] {
        let err = tenant
            .run(register_payment(bad.to_owned(), "s".into(), "c".into(), 5))
            .await
            .unwrap_err();
        let Error::InvalidKey { tool, part, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((*tool, *part), ("payments.register", "run_id"));
        if !bad.is_empty() {
            assert!(
                !err.to_string().contains(bad),
                "the message never shows the key: {err}"
            );
        }
        assert_eq!(effects(bad), 0);
    }
    assert_eq!(store.count(), 0, "the store was never asked");
    for tenant in [String::new(), "t".repeat(256), "nul\0byte".to_owned()] {
        let err = idem
            .scope(tenant.clone())
            .run(call(&unique("run"), 5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidTenant { .. }),
            "{tenant:?}: {err:?}"
        );
    }
    assert_eq!(store.count(), 0);
}

/// Arguments as one struct, keyed by field paths (rmcp `Parameters<T>`, rig).
#[derive(Debug, Clone, Serialize)]
struct TransferRequest {
    run_id: String,
    step: u32,
    to: String,
    amount_cents: u64,
    sent_at: u64,
    trace_id: String,
}

#[idempotent(
    key = "req.run_id, req.step",
    mutating,
    name = "bank.transfer",
    skip = "req.sent_at, req.trace_id"
)]
async fn transfer(req: TransferRequest) -> Result<u64, std::convert::Infallible> {
    effect(&req.run_id);
    Ok(req.amount_cents)
}

#[tokio::test]
async fn field_path_keys_and_skipped_fields() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let req = |amount, sent_at, trace: &str| TransferRequest {
        run_id: run.clone(),
        step: 1,
        to: "acct_9".into(),
        amount_cents: amount,
        sent_at,
        trace_id: trace.into(),
    };
    assert!(
        tenant
            .run(transfer(req(10, 1, "a")))
            .await
            .unwrap()
            .is_fresh()
    );
    let retry = tenant.run(transfer(req(10, 2, "b"))).await.unwrap();
    assert_eq!(
        retry,
        Outcome::Replayed(10),
        "volatile fields do not make a mismatch"
    );
    assert!(
        tenant
            .run(transfer(req(11, 1, "a")))
            .await
            .unwrap()
            .is_mismatch()
    );
    assert_eq!(effects(&run), 1);
}

/// A client-supplied key that the caller may omit (the seeds: optional, not required).
#[idempotent(key = "idempotency_key", mutating, name = "mail.send")]
async fn send_mail(
    idempotency_key: Option<String>,
    to: String,
) -> Result<(), std::convert::Infallible> {
    effect(&to);
    Ok(())
}

#[idempotent(key = "idempotency_key", mutating, name = "mail.send_strict", required)]
async fn send_mail_strict(
    idempotency_key: Option<String>,
    to: String,
) -> Result<(), std::convert::Infallible> {
    effect(&to);
    Ok(())
}

#[tokio::test]
async fn an_omitted_optional_key_runs_unprotected_and_says_so() {
    let store = Arc::new(CountingStore::default());
    let idem = Idem::with_store(store.clone());
    let tenant = idem.scope("tenant-a");
    let to = unique("to");
    for _ in 0..2 {
        let out = tenant.run(send_mail(None, to.clone())).await.unwrap();
        assert_eq!(out, Outcome::Unprotected(()));
        assert!(!out.is_protected());
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(json["protected"], false);
    }
    assert_eq!(
        effects(&to),
        2,
        "without a key every call runs: that is what unprotected means"
    );
    assert_eq!(store.count(), 0);
    let key = Some(unique("req"));
    assert!(
        tenant
            .run(send_mail(key.clone(), to.clone()))
            .await
            .unwrap()
            .is_fresh()
    );
    assert!(
        tenant
            .run(send_mail(key, to.clone()))
            .await
            .unwrap()
            .is_replayed()
    );
    assert_eq!(effects(&to), 3);
}

#[tokio::test]
async fn a_required_key_that_is_omitted_is_an_error() {
    let idem = Idem::open("memory://").await.unwrap();
    let to = unique("to");
    let err = idem
        .scope("t")
        .run(send_mail_strict(None, to.clone()))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::MissingKey {
            tool: "mail.send_strict",
            part: "idempotency_key"
        }
    ));
    assert_eq!(effects(&to), 0);
}

/// Renaming a tool's Rust function keeps its keys when `name` is set.
#[idempotent(key = "run_id", mutating, name = "payments.refund")]
async fn refund_v1(run_id: String, amount_cents: u64) -> Result<u64, std::convert::Infallible> {
    effect(&run_id);
    Ok(amount_cents)
}

#[idempotent(key = "run_id", mutating, name = "payments.refund")]
async fn refund_v2_renamed(
    run_id: String,
    amount_cents: u64,
) -> Result<u64, std::convert::Infallible> {
    effect(&run_id);
    Ok(amount_cents)
}

#[tokio::test]
async fn a_stable_name_survives_renaming_the_function() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("t");
    let run = unique("run");
    assert!(
        tenant
            .run(refund_v1(run.clone(), 70))
            .await
            .unwrap()
            .is_fresh()
    );
    assert_eq!(
        tenant
            .run(refund_v2_renamed(run.clone(), 70))
            .await
            .unwrap(),
        Outcome::Replayed(70)
    );
    assert_eq!(effects(&run), 1);
}

/// Methods with `&self`, keyed by a field of `self` and a parameter.
struct Crm {
    account: String,
}

impl Crm {
    #[idempotent(key = "self.account, ticket_ref", mutating, name = "crm.create_ticket")]
    async fn create_ticket(
        &self,
        ticket_ref: String,
        title: String,
    ) -> Result<String, std::convert::Infallible> {
        effect(&ticket_ref);
        Ok(format!("{}:{title}", self.account))
    }
}

#[tokio::test]
async fn methods_are_keyed_by_self_fields() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("t");
    let ticket = unique("ticket");
    let a = Crm {
        account: "acct-1".into(),
    };
    let b = Crm {
        account: "acct-2".into(),
    };
    assert!(
        tenant
            .run(a.create_ticket(ticket.clone(), "x".into()))
            .await
            .unwrap()
            .is_fresh()
    );
    assert!(
        tenant
            .run(a.create_ticket(ticket.clone(), "x".into()))
            .await
            .unwrap()
            .is_replayed()
    );
    assert!(
        tenant
            .run(b.create_ticket(ticket.clone(), "x".into()))
            .await
            .unwrap()
            .is_fresh()
    );
    assert_eq!(effects(&ticket), 2);
}

/// Naturally idempotent: registered, no store traffic, always runs.
#[idempotent(natural)]
async fn set_status(entity: String, status: String) -> Result<String, std::convert::Infallible> {
    effect(&entity);
    Ok(status)
}

#[tokio::test]
async fn natural_tools_touch_no_store() {
    let entity = unique("entity");
    // No runtime in scope at all: a natural tool needs none.
    assert_eq!(
        set_status(entity.clone(), "active".into()).await.unwrap(),
        Outcome::Fresh("active".into())
    );
    assert_eq!(
        set_status(entity.clone(), "active".into()).await.unwrap(),
        Outcome::Fresh("active".into())
    );
    assert_eq!(effects(&entity), 2);
}

#[tokio::test]
async fn the_model_sees_status_and_replayed_never_the_key() {
    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("t");
    let run = unique("run-secret");
    let fresh = tenant.run(call(&run, 500)).await.unwrap();
    let replay = tenant.run(call(&run, 500)).await.unwrap();
    let mismatch = tenant.run(call(&run, 1)).await.unwrap();
    for (out, status, replayed) in [
        (&fresh, "ok", false),
        (&replay, "ok", true),
        (&mismatch, "mismatch", false),
    ] {
        let json = serde_json::to_string(out).unwrap();
        assert!(!json.contains(&run), "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (
                v["status"].as_str().unwrap(),
                v["replayed"].as_bool().unwrap()
            ),
            (status, replayed)
        );
    }
}

#[tokio::test]
async fn the_registry_lists_every_tool_and_the_report_is_sorted() {
    let tools = idem::registry::tools();
    let names: Vec<&str> = tools.iter().map(|t| t.name).collect();
    for expected in [
        "payments.register",
        "payments.strict",
        "bank.transfer",
        "mail.send",
        "crm.create_ticket",
        "set_status",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    let transfer = tools.iter().find(|t| t.name == "bank.transfer").unwrap();
    assert_eq!(transfer.key_parts, ["req.run_id", "req.step"]);
    assert_eq!(
        transfer.skip,
        [&["req", "sent_at"][..], &["req", "trace_id"][..]]
    );
    assert!(transfer.file.ends_with("behaviour.rs") && transfer.line > 0);
    let strict = tools.iter().find(|t| t.name == "payments.strict").unwrap();
    assert_eq!(strict.on_error, idem::registry::ErrorPolicy::Store);
    let md = idem::registry::report().to_markdown();
    assert!(md.contains("| `bank.transfer` | keyed (mutating) | `req.run_id`, `req.step` | 1d (default) | 30s (default) | release | takeover | `req.sent_at`, `req.trace_id` |"), "{md}");

    let idem = Idem::open("memory://").await.unwrap();
    let audit = idem::audit(&idem).await;
    let text = audit.to_string();
    assert!(
        text.contains("2 tools share the name `payments.refund`"),
        "{text}"
    );
    assert!(!text.contains("tool `set_status`"), "{text}");
}

#[tokio::test]
async fn a_background_purger_removes_expired_records_in_batches() {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = Arc::new(idem::store::memory::MemoryStore::new());
    let idem = Idem::builder()
        .ttl(Duration::from_secs(60))
        .clock(clock.clone())
        .build(store.clone());
    let tenant = idem.scope("tenant-a");
    let runs: Vec<String> = (0..25).map(|_| unique("run")).collect();
    for run in &runs {
        assert!(tenant.run(call(run, 500)).await.unwrap().is_fresh());
    }
    let key = |run: &str| {
        let parts = [
            idem::key::KeyPart::new(run).unwrap(),
            idem::key::KeyPart::new("step-1").unwrap(),
        ];
        idem::derive_key("tenant-a", "payments.register", &parts)
    };
    use idem::store::Store;
    assert!(
        store
            .lookup("tenant-a", key(&runs[0]))
            .await
            .unwrap()
            .is_some()
    );
    clock.advance(Duration::from_secs(61));
    let purger = idem.spawn_purger(Duration::from_millis(5), 10);
    for _ in 0..2_000 {
        if store
            .lookup("tenant-a", key(&runs[24]))
            .await
            .unwrap()
            .is_none()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    purger.abort();
    for run in &runs {
        assert!(
            store.lookup("tenant-a", key(run)).await.unwrap().is_none(),
            "purged"
        );
    }
    assert_eq!(runs.iter().map(|r| effects(r)).sum::<usize>(), 25);
}

#[idempotent(key = "run_id", mutating, name = "limits.report")]
async fn big_report(run_id: String, size: usize) -> Result<String, String> {
    effect(&run_id);
    Ok("x".repeat(size))
}

#[tokio::test]
async fn a_result_too_large_to_keep_is_an_error_never_truncated_and_never_run_twice() {
    let idem = Idem::builder()
        .max_result_bytes(1024)
        .build(idem::store::memory::MemoryStore::new());
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let err = tenant.run(big_report(run.clone(), 4096)).await.unwrap_err();
    let Error::ResultTooLarge {
        size,
        limit,
        replayed: false,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*size > 4096, *limit), (true, 1024));
    assert!(err.body_ran(), "the effect happened");
    assert!(!err.to_string().contains(&run), "{err}");
    let again = tenant.run(big_report(run.clone(), 4096)).await.unwrap_err();
    assert!(
        matches!(again, Error::ResultTooLarge { replayed: true, .. }),
        "{again:?}"
    );
    assert!(!again.body_ran());
    assert_eq!(effects(&run), 1, "the body ran once");
    // Under the limit, as before.
    let small = unique("run");
    let out = tenant.run(big_report(small.clone(), 100)).await.unwrap();
    assert!(out.is_fresh());
    assert!(
        tenant
            .run(big_report(small, 100))
            .await
            .unwrap()
            .is_replayed()
    );
    assert_eq!(idem::DEFAULT_MAX_RESULT_BYTES, 1 << 20);
}

#[tokio::test]
async fn arguments_too_large_to_fingerprint_are_refused_before_the_store() {
    #[idempotent(key = "run_id", mutating, name = "limits.upload")]
    async fn upload(run_id: String, blob: String) -> Result<usize, String> {
        effect(&run_id);
        Ok(blob.len())
    }
    let store = Arc::new(CountingStore::default());
    let idem = Idem::with_store(store.clone());
    let run = unique("run");
    let blob = "b".repeat(idem::DEFAULT_MAX_ARGUMENT_BYTES);
    let err = idem
        .scope("tenant-a")
        .run(upload(run.clone(), blob))
        .await
        .unwrap_err();
    let Error::Unfingerprintable { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(source, idem::canonical::CanonicalError::TooLarge { limit, .. } if *limit == 1 << 20),
        "{source:?}"
    );
    assert!(!err.body_ran());
    assert_eq!(store.count(), 0, "the store was never asked");
    assert_eq!(effects(&run), 0);
    let small = idem
        .scope("tenant-a")
        .run(upload(run.clone(), "b".repeat(1000)))
        .await;
    assert!(small.unwrap().is_fresh());

    // The limit is the runtime's to set: 2,000 bytes refuses what 1 MiB took.
    let strict = Idem::builder()
        .max_argument_bytes(2_000)
        .build(store.clone());
    assert_eq!(strict.max_argument_bytes(), 2_000);
    let other = unique("run");
    let err = strict
        .scope("tenant-a")
        .run(upload(other.clone(), "b".repeat(3_000)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Unfingerprintable { source: idem::canonical::CanonicalError::TooLarge { limit: 2_000, size }, .. } if *size > 3_000),
        "{err:?}"
    );
    assert!(!err.body_ran());
    assert_eq!(effects(&other), 0);
    let fits = strict
        .scope("tenant-a")
        .run(upload(other.clone(), "b".repeat(1_900)))
        .await;
    assert!(fits.unwrap().is_fresh());
}
