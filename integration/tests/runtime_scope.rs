//! Which runtime a call uses: none (fail closed), the task's scope, or the installed default.
//!
//! These tests share the process-wide default, so they run one after another in one test.

mod common;

use common::{effect, effects, unique};
use idem::{Error, Idem, Outcome, idempotent};

#[idempotent(key = "run_id", mutating, name = "scope.charge")]
async fn charge(run_id: String, amount_cents: u64) -> Result<u64, std::convert::Infallible> {
    effect(&run_id);
    Ok(amount_cents)
}

#[tokio::test]
async fn no_runtime_fails_closed_then_scope_then_installed_default() {
    // 1. No runtime anywhere: the body never runs.
    let run = unique("run");
    let err = charge(run.clone(), 5).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::NoRuntime {
                tool: "scope.charge"
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("idem.scope(tenant).run"), "{err}");
    assert!(!err.body_ran());
    assert_eq!(effects(&run), 0);

    // 2. An installed default serves calls outside any scope.
    let idem = Idem::open("memory://").await.unwrap();
    idem.install("tenant-default");
    assert_eq!(charge(run.clone(), 5).await.unwrap(), Outcome::Fresh(5));
    assert_eq!(charge(run.clone(), 5).await.unwrap(), Outcome::Replayed(5));

    // 3. A task's scope wins over the default: another tenant, another record.
    let other = idem.scope("tenant-other");
    assert_eq!(
        other.run(charge(run.clone(), 5)).await.unwrap(),
        Outcome::Fresh(5)
    );
    assert_eq!(effects(&run), 2);

    // 4. A spawned task does not inherit the task-local scope, but falls back to the default.
    let spawned =
        tokio::spawn(other.run(async move { tokio::spawn(charge(unique("run"), 1)).await }));
    assert!(spawned.await.unwrap().unwrap().unwrap().is_fresh());

    // 5. Uninstalled: closed again.
    Idem::uninstall();
    assert!(matches!(
        charge(run.clone(), 5).await,
        Err(Error::NoRuntime { .. })
    ));
    assert_eq!(effects(&run), 2);
}
