//! A store that fails at random (seeded): whatever fails, every answer is an outcome or a
//! documented error, every effect is accounted for, and a second effect of an intent never
//! happens without a caller having been told that a body ran unrecorded. With a state check
//! that finds the effect, no intent's effect ever happens twice.

mod common;

use std::time::Duration;

use common::{effect, effects, unique};
use idem::clock::ManualClock;
use idem::store::faulty::{Faults, FaultyStore};
use idem::store::memory::MemoryStore;
use idem::{Error, Idem, Outcome, idempotent};
use proptest::prelude::*;

#[idempotent(key = "run_id", mutating, name = "faults.charge")]
async fn charge(run_id: String, amount_cents: u64) -> Result<u64, std::convert::Infallible> {
    effect(&run_id);
    Ok(amount_cents)
}

/// Effects by run id, as a provider would keep them (the check reads them).
fn charged(run_id: &str) -> bool {
    effects(run_id) > 0
}

async fn already_charged(
    run_id: &str,
    amount_cents: &u64,
) -> Result<Option<u64>, std::convert::Infallible> {
    Ok(charged(run_id).then_some(*amount_cents))
}

#[idempotent(key = "run_id", mutating, check = already_charged, name = "faults.charge_checked")]
async fn charge_checked(
    run_id: String,
    amount_cents: u64,
) -> Result<u64, std::convert::Infallible> {
    effect(&run_id);
    Ok(amount_cents)
}

/// Per intent: answers seen, and body runs the callers were told about.
#[derive(Default, Debug)]
struct Seen {
    fresh: usize,
    ran_unrecorded: usize,
}

fn scenario(seed: u64, steps: &[(u8, bool)], checked: bool) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = ManualClock::new(1_700_000_000_000);
        let faults = Faults::seeded(seed)
            .fail_before(0.15)
            .fail_after(0.15)
            .timeout(0.05);
        let idem = Idem::builder()
            .lease(Duration::from_secs(30))
            .clock(clock.clone())
            .build(FaultyStore::new(MemoryStore::new(), faults));
        let tenant = idem.scope("tenant-a");
        let case = unique("case");
        let runs: Vec<String> = (0..4).map(|i| format!("{case}-{i}")).collect();
        let mut seen: Vec<Seen> = (0..4).map(|_| Seen::default()).collect();
        let mut lapsed = false;
        for &(intent, lapse) in steps {
            if lapse {
                clock.advance(Duration::from_secs(31));
                lapsed = true;
            }
            let i = usize::from(intent);
            let answer = if checked {
                tenant.run(charge_checked(runs[i].clone(), 500)).await
            } else {
                tenant.run(charge(runs[i].clone(), 500)).await
            };
            match answer {
                Ok(Outcome::Fresh(_)) => seen[i].fresh += 1,
                Ok(Outcome::Replayed(_) | Outcome::InFlight(_)) => {}
                Ok(other) => prop_assert!(false, "unexpected outcome {other:?}"),
                Err(e @ (Error::CompletionFailed { .. } | Error::LeaseLost { .. })) => {
                    prop_assert!(e.body_ran());
                    seen[i].ran_unrecorded += 1;
                }
                Err(e @ Error::Store(_)) => prop_assert!(!e.body_ran()),
                Err(other) => prop_assert!(false, "undocumented error {other:?}"),
            }
        }
        for (run, seen) in runs.iter().zip(&seen) {
            let ran = effects(run);
            if checked {
                prop_assert!(ran <= 1, "with a check, never twice: {:?}", seen);
                continue;
            }
            prop_assert_eq!(
                ran,
                seen.fresh + seen.ran_unrecorded,
                "every run of the body was answered Fresh or reported as unrecorded: {:?}",
                seen
            );
            prop_assert!(seen.fresh <= 1, "one Fresh per intent: {:?}", seen);
            prop_assert!(
                ran <= 1 + seen.ran_unrecorded,
                "a second effect only after a caller was told a body ran unrecorded: {:?}",
                seen
            );
            if !lapsed {
                prop_assert!(ran <= 1, "no lease lapsed, no second effect: {:?}", seen);
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn faults_never_hide_an_effect(
        seed in any::<u64>(),
        steps in prop::collection::vec((0u8..4, prop::bool::weighted(0.1)), 1..40),
    ) {
        scenario(seed, &steps, false)?;
    }

    #[test]
    fn with_a_check_faults_never_repeat_an_effect(
        seed in any::<u64>(),
        steps in prop::collection::vec((0u8..4, prop::bool::weighted(0.1)), 1..40),
    ) {
        scenario(seed, &steps, true)?;
    }
}
