//! Form 3: a state check that finds an effect that already happened. On its own it decides a
//! tool without a key (`assign_shift`); beside a key it reconciles an orphaned claim before the
//! body would run again.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use common::{effect, effects, manual_runtime, unique};
use idem::{Error, Outcome, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Assignment {
    crewmate: String,
    shift: String,
    already_assigned: bool,
}

#[derive(Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("the roster is unreachable")]
struct RosterDown;

/// The roster: (crewmate, shift) pairs, and whether reading it fails.
static ROSTER: Mutex<Option<HashMap<(String, String), ()>>> = Mutex::new(None);
static ROSTER_DOWN: Mutex<Option<String>> = Mutex::new(None);

async fn already_assigned(crewmate: &str, shift: &str) -> Result<Option<Assignment>, RosterDown> {
    if ROSTER_DOWN.lock().unwrap().as_deref() == Some(crewmate) {
        return Err(RosterDown);
    }
    let found = ROSTER
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .contains_key(&(crewmate.to_owned(), shift.to_owned()));
    Ok(found.then(|| Assignment {
        crewmate: crewmate.to_owned(),
        shift: shift.to_owned(),
        already_assigned: true,
    }))
}

/// The seeds' `assign_shift`: no key; the roster itself says whether it already happened.
#[idempotent(mutating, check = already_assigned, name = "crew.assign_shift")]
async fn assign_shift(crewmate: String, shift: String) -> Result<Assignment, RosterDown> {
    effect(&crewmate);
    ROSTER
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert((crewmate.clone(), shift.clone()), ());
    Ok(Assignment {
        crewmate,
        shift,
        already_assigned: false,
    })
}

#[tokio::test]
async fn a_state_check_decides_a_tool_without_a_key() {
    let crewmate = unique("crew");
    let first = assign_shift(crewmate.clone(), "night".into())
        .await
        .unwrap();
    let Outcome::Fresh(assignment) = first else {
        panic!("{first:?}")
    };
    assert!(!assignment.already_assigned);
    let second = assign_shift(crewmate.clone(), "night".into())
        .await
        .unwrap();
    assert!(second.is_replayed(), "{second:?}");
    assert!(second.value().unwrap().already_assigned);
    assert_eq!(effects(&crewmate), 1);
    let json = serde_json::to_value(&second).unwrap();
    assert_eq!(json["status"], "ok");
    assert_eq!(json["replayed"], true);
    assert_eq!(json["value"]["already_assigned"], true);
}

#[tokio::test]
async fn a_failing_state_check_runs_nothing() {
    let crewmate = unique("crew");
    *ROSTER_DOWN.lock().unwrap() = Some(crewmate.clone());
    let err = assign_shift(crewmate.clone(), "day".into())
        .await
        .unwrap_err();
    *ROSTER_DOWN.lock().unwrap() = None;
    assert!(
        matches!(
            &err,
            Error::CheckFailed {
                error: RosterDown,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.body_ran());
    assert!(err.to_string().contains("state check failed"), "{err}");
    assert_eq!(effects(&crewmate), 0);
}

/// The payment provider: charges by downstream key, so a check can ask it what happened.
static PROVIDER: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);
/// The runs whose check ran, in order.
static CHECKED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn checks_of(run: &str) -> usize {
    CHECKED.lock().unwrap().iter().filter(|r| *r == run).count()
}

async fn provider_has_charge(
    run_id: &str,
    amount_cents: &u64,
    _phase: &Phase,
) -> Result<Option<u64>, RosterDown> {
    CHECKED.lock().unwrap().push(run_id.to_owned());
    let key = idem::current()
        .expect("the check runs as the call")
        .derive("provider");
    if run_id.ends_with("-check-fails") {
        return Err(RosterDown);
    }
    let found = PROVIDER
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .get(key.as_str())
        .copied();
    assert!(found.is_none_or(|f| f == *amount_cents));
    Ok(found)
}

/// Where the body stops: it may hang before the charge or after it (the agent loop cancels it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Phase {
    HangBefore,
    HangAfter,
    Finish,
}

#[idempotent(
    key = "run_id",
    mutating,
    check = provider_has_charge,
    skip = "phase",
    name = "payments.charge_reconciled"
)]
async fn charge(run_id: String, amount_cents: u64, phase: Phase) -> Result<u64, RosterDown> {
    if phase == Phase::HangBefore {
        std::future::pending::<()>().await;
    }
    let key = idem::current().expect("keyed").derive("provider");
    effect(&run_id);
    PROVIDER
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(key.as_str().to_owned(), amount_cents);
    if phase == Phase::HangAfter {
        std::future::pending::<()>().await;
    }
    Ok(amount_cents)
}

/// Runs a call that the agent loop gives up on after 50 ms.
async fn cancelled(tenant: &idem::Scope, run: &str, phase: Phase) {
    let call = tenant.run(charge(run.to_owned(), 500, phase));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), call)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn an_orphan_whose_effect_happened_is_reconciled_not_run_again() {
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    cancelled(&tenant, &run, Phase::HangAfter).await;
    assert_eq!(effects(&run), 1, "charged, then the call was cancelled");

    let during = tenant.run(charge(run.clone(), 500, Phase::Finish)).await;
    assert!(
        during.unwrap().is_in_flight(),
        "the lease protects the claim"
    );

    clock.advance(Duration::from_secs(31));
    assert_eq!(checks_of(&run), 0);
    let after = tenant
        .run(charge(run.clone(), 500, Phase::Finish))
        .await
        .unwrap();
    assert_eq!(after, Outcome::Replayed(500), "the check found the charge");
    assert_eq!(effects(&run), 1, "and the body did not run again");
    assert_eq!(checks_of(&run), 1);

    let later = tenant
        .run(charge(run.clone(), 500, Phase::Finish))
        .await
        .unwrap();
    assert_eq!(later, Outcome::Replayed(500), "now stored as completed");
    assert_eq!(effects(&run), 1);
    assert_eq!(
        checks_of(&run),
        1,
        "a completed record replays without checking"
    );
}

#[tokio::test]
async fn an_orphan_whose_effect_did_not_happen_runs_once() {
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    cancelled(&tenant, &run, Phase::HangBefore).await;
    assert_eq!(effects(&run), 0);
    clock.advance(Duration::from_secs(31));
    let after = tenant
        .run(charge(run.clone(), 500, Phase::Finish))
        .await
        .unwrap();
    assert_eq!(after, Outcome::Fresh(500), "nothing found: the body ran");
    assert_eq!(effects(&run), 1);
}

#[tokio::test]
async fn the_check_runs_only_for_orphans() {
    let (idem, _clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    assert!(
        tenant
            .run(charge(run.clone(), 500, Phase::Finish))
            .await
            .unwrap()
            .is_fresh()
    );
    assert!(
        tenant
            .run(charge(run.clone(), 500, Phase::Finish))
            .await
            .unwrap()
            .is_replayed()
    );
    assert_eq!(effects(&run), 1);
    assert_eq!(checks_of(&run), 0, "a new key and a replay need no check");
}

#[tokio::test]
async fn a_failing_check_keeps_the_orphan_blocked() {
    let (idem, clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = format!("{}-check-fails", unique("run"));
    cancelled(&tenant, &run, Phase::HangAfter).await;
    clock.advance(Duration::from_secs(31));
    let err = tenant
        .run(charge(run.clone(), 500, Phase::Finish))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::CheckFailed { .. }), "{err:?}");
    assert!(!err.body_ran());
    assert_eq!(effects(&run), 1, "the body did not run again");
    let meanwhile = tenant
        .run(charge(run.clone(), 500, Phase::Finish))
        .await
        .unwrap();
    assert!(
        meanwhile.is_in_flight(),
        "the claim taken for the check still holds the key: {meanwhile:?}"
    );
}

#[test]
fn the_registry_and_report_name_the_check() {
    let tools = idem::registry::tools();
    let assign = tools
        .iter()
        .find(|t| t.name == "crew.assign_shift")
        .unwrap();
    assert_eq!(assign.form, idem::registry::Form::StateCheck);
    assert_eq!(assign.check, Some("already_assigned"));
    let charge = tools
        .iter()
        .find(|t| t.name == "payments.charge_reconciled")
        .unwrap();
    assert_eq!(charge.form, idem::registry::Form::Keyed);
    assert_eq!(charge.check, Some("provider_has_charge"));
    let report = idem::registry::Report::new(tools.clone(), idem::DEFAULT_TTL, idem::DEFAULT_LEASE)
        .to_markdown();
    assert!(
        report.contains("state check `already_assigned`"),
        "{report}"
    );
    assert!(
        report.contains("orphans reconciled by `provider_has_charge`"),
        "{report}"
    );
}

#[tokio::test]
async fn checked_calls_can_be_spawned() {
    let (idem, _clock) = manual_runtime();
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let keyed = tokio::spawn(tenant.run(charge(run.clone(), 500, Phase::Finish)));
    assert!(keyed.await.unwrap().unwrap().is_fresh());
    let crewmate = unique("crew");
    let keyless = tokio::spawn(assign_shift(crewmate, "day".into()));
    assert!(keyless.await.unwrap().unwrap().is_fresh());
}
