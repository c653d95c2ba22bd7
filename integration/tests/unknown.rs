//! Unknown outcomes: an error that cannot say whether the effect happened (`on_error =
//! "unknown"`, or `"classify"` with [`ClassifyError`]), and an orphan of a tool that never runs
//! twice blindly (`on_orphan = "unknown"`). The key stays blocked, later calls get
//! `Outcome::Unknown` and the body does not run, until the tool's state check decides.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use common::{effect, effects, manual_runtime, unique};
use idem::store::RecordStatus;
use idem::{ClassifyError, Error, ErrorClass, Idem, Outcome, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
enum ChargeError {
    #[error("invalid amount")]
    Invalid,
    #[error("card declined")]
    Declined,
    #[error("the provider timed out")]
    ProviderTimedOut,
}

impl ClassifyError for ChargeError {
    fn class(&self) -> ErrorClass {
        match self {
            ChargeError::Invalid => ErrorClass::Release,
            ChargeError::Declined => ErrorClass::Store,
            ChargeError::ProviderTimedOut => ErrorClass::Unknown,
        }
    }
}

/// What the provider answers for a given amount (the test picks the error by the amount).
fn provider(amount_cents: u64) -> Result<u64, ChargeError> {
    match amount_cents {
        0 => Err(ChargeError::Invalid),
        402 => Err(ChargeError::Declined),
        504 => Err(ChargeError::ProviderTimedOut),
        n => Ok(n),
    }
}

#[idempotent(
    key = "run_id",
    mutating,
    on_error = "classify",
    name = "unknown.classified"
)]
async fn classified(run_id: String, amount_cents: u64) -> Result<u64, ChargeError> {
    effect(&run_id);
    provider(amount_cents)
}

#[tokio::test]
async fn each_error_class_does_what_it_says() {
    let (idem, _clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");

    // Release: nothing happened, a corrected retry runs.
    let run = unique("run");
    let err = tenant.run(classified(run.clone(), 0)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Tool {
                error: ChargeError::Invalid,
                replayed: false,
                class: ErrorClass::Release
            }
        ),
        "{err:?}"
    );
    let fixed = tenant.run(classified(run.clone(), 500)).await.unwrap();
    assert_eq!(fixed, Outcome::Fresh(500));
    assert_eq!(effects(&run), 2);

    // Store: a definite end, replayed as is.
    let run = unique("run");
    for replayed in [false, true, true] {
        let err = tenant.run(classified(run.clone(), 402)).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Tool { error: ChargeError::Declined, replayed: r, class: ErrorClass::Store }
                    if r == replayed
            ),
            "{err:?}"
        );
    }
    assert_eq!(effects(&run), 1);

    // Unknown: the key is blocked, and says so.
    let run = unique("run");
    let err = tenant.run(classified(run.clone(), 504)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Tool {
                error: ChargeError::ProviderTimedOut,
                replayed: false,
                class: ErrorClass::Unknown
            }
        ),
        "{err:?}"
    );
    assert!(err.body_ran());
    assert!(err.to_string().contains("key is blocked"), "{err}");
    for _ in 0..3 {
        let blocked = tenant.run(classified(run.clone(), 504)).await.unwrap();
        let Outcome::Unknown(unknown) = &blocked else {
            panic!("{blocked:?}")
        };
        assert_eq!(unknown.tool, "unknown.classified");
        assert!(!unknown.key.to_string().contains(&run));
        let json = serde_json::to_value(&blocked).unwrap();
        assert_eq!(json["status"], "unknown");
        assert!(!json.to_string().contains(&run), "{json}");
    }
    assert_eq!(
        effects(&run),
        1,
        "an unknown effect is never retried blindly"
    );
    let other = tenant.run(classified(run.clone(), 700)).await.unwrap();
    assert!(other.is_mismatch(), "other arguments: {other:?}");
}

#[tokio::test]
async fn an_unknown_record_outlives_the_lease_and_ends_with_its_ttl() {
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    assert!(tenant.run(classified(run.clone(), 504)).await.is_err());
    clock.advance(Duration::from_secs(3600));
    assert!(
        tenant
            .run(classified(run.clone(), 504))
            .await
            .unwrap()
            .is_unknown(),
        "an hour later, still blocked"
    );
    clock.advance(idem::DEFAULT_TTL);
    assert_eq!(
        tenant.run(classified(run.clone(), 500)).await.unwrap(),
        Outcome::Fresh(500),
        "past the TTL the key is a new intent"
    );
    assert_eq!(effects(&run), 2);
}

/// The provider's charges by downstream key, for the state check.
static CHARGES: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

fn charges() -> std::sync::MutexGuard<'static, Option<HashMap<String, u64>>> {
    CHARGES.lock().unwrap()
}

async fn charge_exists(
    run_id: &str,
    _amount: &u64,
    _outcome: &Ending,
) -> Result<Option<u64>, String> {
    let key = idem::current()
        .expect("runs as the call")
        .derive("provider");
    if run_id.ends_with("-check-fails") {
        return Err("the provider's API is down".into());
    }
    Ok(charges()
        .get_or_insert_with(HashMap::new)
        .get(key.as_str())
        .copied())
}

/// How the body ends after (maybe) charging.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Ending {
    /// Charges, then the answer is lost: a timeout.
    ChargedThenTimedOut,
    /// Times out before the request reached the provider.
    TimedOutBeforeCharging,
    /// Charges and answers.
    Charged,
}

#[idempotent(
    key = "run_id",
    mutating,
    on_error = "unknown",
    check = charge_exists,
    skip = "ending",
    name = "unknown.checked"
)]
async fn checked(run_id: String, amount: u64, ending: Ending) -> Result<u64, String> {
    if ending != Ending::TimedOutBeforeCharging {
        effect(&run_id);
        let key = idem::current().expect("keyed").derive("provider");
        charges()
            .get_or_insert_with(HashMap::new)
            .insert(key.as_str().to_owned(), amount);
    }
    match ending {
        Ending::Charged => Ok(amount),
        _ => Err("timed out".into()),
    }
}

#[tokio::test]
async fn the_state_check_decides_an_unknown_record() {
    let (idem, _clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");

    // The charge happened: the check finds it, the record is completed, no second charge.
    let run = unique("run");
    let err = tenant
        .run(checked(run.clone(), 500, Ending::ChargedThenTimedOut))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Tool {
                class: ErrorClass::Unknown,
                ..
            }
        ),
        "{err:?}"
    );
    let next = tenant
        .run(checked(run.clone(), 500, Ending::Charged))
        .await
        .unwrap();
    assert_eq!(next, Outcome::Replayed(500), "reconciled by the check");
    assert_eq!(effects(&run), 1);
    let record = lookup(&idem, "tenant-a", "unknown.checked", &run).await;
    assert_eq!(record, RecordStatus::Completed);

    // It did not: the check finds nothing, the body runs once more, and only once.
    let run = unique("run");
    assert!(
        tenant
            .run(checked(run.clone(), 500, Ending::TimedOutBeforeCharging))
            .await
            .is_err()
    );
    assert_eq!(effects(&run), 0);
    let next = tenant
        .run(checked(run.clone(), 500, Ending::Charged))
        .await
        .unwrap();
    assert_eq!(next, Outcome::Fresh(500));
    let again = tenant
        .run(checked(run.clone(), 500, Ending::Charged))
        .await
        .unwrap();
    assert_eq!(again, Outcome::Replayed(500));
    assert_eq!(effects(&run), 1);
}

#[tokio::test]
async fn a_failing_check_leaves_an_unknown_record_to_the_next_check() {
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = format!("{}-check-fails", unique("run"));
    assert!(
        tenant
            .run(checked(run.clone(), 500, Ending::ChargedThenTimedOut))
            .await
            .is_err()
    );
    let err = tenant
        .run(checked(run.clone(), 500, Ending::Charged))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::CheckFailed { .. }), "{err:?}");
    assert!(!err.body_ran());
    assert!(
        tenant
            .run(checked(run.clone(), 500, Ending::Charged))
            .await
            .unwrap()
            .is_in_flight(),
        "the claim taken for the check holds the key for one lease"
    );
    clock.advance(Duration::from_secs(31));
    assert!(
        matches!(
            tenant.run(checked(run.clone(), 500, Ending::Charged)).await,
            Err(Error::CheckFailed { .. })
        ),
        "then the next call checks again; the body never runs blindly"
    );
    assert_eq!(effects(&run), 1);
}

/// A tool without a check that must never run twice: its orphans become unknown.
#[idempotent(
    key = "run_id",
    mutating,
    on_orphan = "unknown",
    skip = "hang",
    name = "unknown.orphan"
)]
async fn never_twice(run_id: String, hang: bool) -> Result<u64, String> {
    effect(&run_id);
    if hang {
        std::future::pending::<()>().await;
    }
    Ok(1)
}

#[tokio::test]
async fn an_orphan_of_a_blocking_tool_becomes_unknown() {
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let call = tenant.run(never_twice(run.clone(), true));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), call)
            .await
            .is_err(),
        "the agent loop gives up on the call"
    );
    assert!(
        tenant
            .run(never_twice(run.clone(), false))
            .await
            .unwrap()
            .is_in_flight()
    );
    clock.advance(Duration::from_secs(31));
    for _ in 0..2 {
        let out = tenant.run(never_twice(run.clone(), false)).await.unwrap();
        assert!(out.is_unknown(), "{out:?}");
    }
    assert_eq!(effects(&run), 1);
    assert_eq!(
        lookup(&idem, "tenant-a", "unknown.orphan", &run).await,
        RecordStatus::Unknown
    );
}

#[tokio::test]
async fn the_default_orphan_policy_still_takes_over() {
    #[idempotent(key = "run_id", mutating, skip = "hang", name = "unknown.takeover")]
    async fn retried(run_id: String, hang: bool) -> Result<u64, String> {
        effect(&run_id);
        if hang {
            std::future::pending::<()>().await;
        }
        Ok(1)
    }
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let call = tenant.run(retried(run.clone(), true));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), call)
            .await
            .is_err()
    );
    clock.advance(Duration::from_secs(31));
    let out = tenant.run(retried(run.clone(), false)).await.unwrap();
    assert_eq!(out, Outcome::Fresh(1), "the contract: no check, take over");
    assert_eq!(effects(&run), 2);
}

#[tokio::test]
async fn unknown_survives_a_restart_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let run = unique("run");
    {
        let idem = Idem::open(&url).await.unwrap();
        let err = idem
            .scope("tenant-a")
            .run(classified(run.clone(), 504))
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            Error::Tool {
                class: ErrorClass::Unknown,
                ..
            }
        ));
    }
    let reopened = Idem::open(&url).await.unwrap();
    let out = reopened
        .scope("tenant-a")
        .run(classified(run.clone(), 504))
        .await
        .unwrap();
    assert!(out.is_unknown(), "{out:?}");
    assert_eq!(effects(&run), 1);
}

#[test]
fn the_registry_and_report_state_the_policies() {
    let tools = idem::registry::tools();
    let find = |name| tools.iter().find(|t| t.name == name).unwrap();
    assert_eq!(
        find("unknown.classified").on_error,
        idem::registry::ErrorPolicy::Classify
    );
    assert_eq!(
        find("unknown.checked").on_error,
        idem::registry::ErrorPolicy::Unknown
    );
    assert_eq!(
        find("unknown.orphan").on_orphan,
        idem::registry::OrphanPolicy::Unknown
    );
    let report = idem::registry::Report::new(tools.clone(), idem::DEFAULT_TTL, idem::DEFAULT_LEASE)
        .to_markdown();
    let row = |name: &str| {
        report
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}`")))
            .unwrap()
            .to_owned()
    };
    assert!(
        row("unknown.classified").contains("| classify | takeover |"),
        "{report}"
    );
    assert!(
        row("unknown.checked").contains("| unknown | check |"),
        "{report}"
    );
    assert!(
        row("unknown.orphan").contains("| release | unknown |"),
        "{report}"
    );
}

/// The status of the record of `tool` + `run` (looked up through the store, as an operator would).
async fn lookup(idem: &Idem, tenant: &str, tool: &str, run: &str) -> RecordStatus {
    let key = idem::derive_key(tenant, tool, &[idem::key::KeyPart::new(&run).unwrap()]);
    idem.store()
        .lookup(tenant, key)
        .await
        .unwrap()
        .expect("a record")
        .status
}
