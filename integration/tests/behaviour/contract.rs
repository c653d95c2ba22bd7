//! The decision table, counted: a body runs once per intent, whatever the retries.

use std::sync::Arc;
use std::time::Duration;

use idem::clock::ManualClock;
use idem::{Error, ErrorClass, Idem, Outcome, idempotent};
use serde::Serialize;
use tokio::sync::Notify;

use crate::common::{effect, effects, unique};
use crate::{PaymentError, call, sqlite, strict_payment};

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
