//! Durable runs: tools keyed by the run scope (`idem::run`), engine-neutral. Each test counts
//! effects: how many times a body really ran.

mod common;

use std::time::Duration;

use common::{effect, effects, manual_runtime, unique};
use idem::registry::{Severity, audit_tools};
use idem::retry::{RetryPolicy, retry};
use idem::run::Run;
use idem::store::memory::MemoryStore;
use idem::{Error, Idem, Outcome, idempotent};

/// Keyed by the run scope: no key plumbing in the signature.
#[idempotent(key = "run_id, step_id", mutating, name = "runs.charge")]
async fn charge(ledger: String, amount_cents: u64) -> Result<u64, String> {
    effect(&ledger);
    Ok(amount_cents)
}

/// The same tool written by hand, with the same stable name: the explicit form.
#[idempotent(key = "run_id, step_id", mutating, name = "runs.charge")]
async fn charge_by_hand(
    run_id: String,
    step_id: String,
    ledger: String,
    amount_cents: u64,
) -> Result<u64, String> {
    effect(&ledger);
    Ok(amount_cents)
}

/// `run_id` explicit, `step_id` from the run.
#[idempotent(key = "run_id, step_id", mutating, name = "runs.charge_for")]
async fn charge_for(run_id: String, ledger: String) -> Result<String, String> {
    effect(&ledger);
    Ok(run_id)
}

/// A body that takes its time, to hold its key in flight.
#[idempotent(key = "run_id, step_id", mutating, name = "runs.slow")]
async fn slow(ledger: String) -> Result<(), String> {
    effect(&ledger);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

#[idempotent(key = "run_id, step_id", mutating, name = "runs.week", ttl = "8d")]
async fn weekly(ledger: String) -> Result<u32, String> {
    effect(&ledger);
    Ok(7)
}

#[idempotent(key = "run_id, step_id", mutating, name = "runs.day", ttl = "1d")]
async fn daily(ledger: String) -> Result<u32, String> {
    effect(&ledger);
    Ok(1)
}

#[tokio::test]
async fn a_step_run_again_replays_its_calls_and_never_runs_a_body_twice() {
    let idem = Idem::open("memory://").await.unwrap();
    let scope = idem.scope("tenant-runs");
    let (ledger, other) = (unique("ledger"), unique("ledger"));
    let run = Run::new(unique("run")).unwrap().with_attempt(1);
    // The step as the engine runs it: two calls of one tool (two effects), one of another.
    let step = |attempt: u32| {
        let run = run.clone().with_attempt(attempt);
        let (ledger, other) = (ledger.clone(), other.clone());
        scope.run(async move {
            run.step("pay", async move {
                let first = charge(ledger.clone(), 500).await.unwrap();
                let second = charge(ledger.clone(), 500).await.unwrap();
                let third = charge_for("explicit-run".into(), other).await.unwrap();
                (first, second, third)
            })
            .unwrap()
            .await
        })
    };
    let (first, second, third) = step(1).await;
    assert_eq!((first, second), (Outcome::Fresh(500), Outcome::Fresh(500)));
    assert_eq!(third, Outcome::Fresh("explicit-run".to_owned()));
    assert_eq!(effects(&ledger), 2, "two calls in one step are two intents");
    assert_eq!(effects(&other), 1);

    // The engine runs the step again (a crash before its checkpoint): every call replays.
    let (first, second, third) = step(2).await;
    assert_eq!(
        (first, second),
        (Outcome::Replayed(500), Outcome::Replayed(500))
    );
    assert!(third.is_replayed());
    assert_eq!(effects(&ledger), 2, "no body ran again");
    assert_eq!(effects(&other), 1);

    // Another step of the same run, and the same step of another run, are new intents.
    let next = run.step("refund", charge(ledger.clone(), 500)).unwrap();
    assert!(scope.run(next).await.unwrap().is_fresh());
    let another = Run::new(unique("run")).unwrap();
    let same_step = another.step("pay", charge(ledger.clone(), 500)).unwrap();
    assert!(scope.run(same_step).await.unwrap().is_fresh());
    assert_eq!(effects(&ledger), 4);
}

/// The key of a call by hand hits the record of the call by the run: it answers `Mismatch`, since
/// its arguments (the fingerprint) also hold the two ids, where the run's form has none.
#[tokio::test]
async fn the_first_call_of_a_step_has_the_key_written_by_hand() {
    let idem = Idem::open("memory://").await.unwrap();
    let scope = idem.scope("tenant-runs");
    let (ledger, run_id) = (unique("ledger"), unique("run"));
    let run = Run::new(run_id.clone()).unwrap();
    let by_run = run.step("s1", charge(ledger.clone(), 70)).unwrap();
    assert_eq!(scope.run(by_run).await.unwrap(), Outcome::Fresh(70));
    let by_hand = charge_by_hand(run_id.clone(), "s1".into(), ledger.clone(), 70);
    assert!(
        scope.run(by_hand).await.unwrap().is_mismatch(),
        "the same key"
    );
    let other_step = charge_by_hand(run_id.clone(), "s2".into(), ledger.clone(), 70);
    assert!(
        scope.run(other_step).await.unwrap().is_fresh(),
        "another key"
    );
    // The second call of the step is `s1#2`, by hand too.
    let twice = run
        .step("s1", async {
            (
                charge(ledger.clone(), 70).await,
                charge(ledger.clone(), 70).await,
            )
        })
        .unwrap();
    let (first, second) = scope.run(twice).await;
    assert!(first.unwrap().is_replayed());
    assert!(second.unwrap().is_fresh());
    let by_hand = charge_by_hand(run_id, "s1#2".into(), ledger.clone(), 70);
    assert!(scope.run(by_hand).await.unwrap().is_mismatch());
    assert_eq!(effects(&ledger), 3);
}

#[tokio::test]
async fn outside_a_step_a_tool_keyed_by_the_run_refuses_to_run() {
    let idem = Idem::open("memory://").await.unwrap();
    let ledger = unique("ledger");
    let err = idem
        .scope("tenant-runs")
        .run(charge(ledger.clone(), 5))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NoRun {
                tool: "runs.charge",
                part: "run_id"
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("outside a run's step"), "{message}");
    assert!(
        message.contains("give the tool a `run_id` parameter"),
        "{message}"
    );
    assert!(!err.body_ran());
    assert_eq!(effects(&ledger), 0);
}

#[tokio::test]
async fn a_retried_call_keeps_its_step_id_and_waits_for_the_duplicate_holding_it() {
    let idem = Idem::open("memory://").await.unwrap();
    let scope = idem.scope("tenant-runs");
    let ledger = unique("ledger");
    let run = Run::new(unique("run")).unwrap();
    // A duplicate execution of the step (a second worker) holds the key in flight.
    let holder = tokio::spawn(scope.run(run.step("s", slow(ledger.clone())).unwrap()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let policy = RetryPolicy {
        max_attempts: 100,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(50),
        budget: Duration::from_secs(10),
    };
    let retried = run
        .step("s", retry(&policy, || slow(ledger.clone())))
        .unwrap();
    let answer = scope.run(retried).await.unwrap();
    assert!(answer.is_replayed(), "{answer:?}");
    assert!(holder.await.unwrap().unwrap().is_fresh());
    assert_eq!(
        effects(&ledger),
        1,
        "each retry is the same call: `s`, never `s#2`"
    );
}

#[tokio::test]
async fn a_run_resumed_after_seven_days_replays_when_its_keys_outlive_the_window() {
    let (idem, clock) = manual_runtime();
    let scope = idem.scope("tenant-runs");
    let run = Run::new(unique("run")).unwrap();
    let (week, day) = (unique("ledger"), unique("ledger"));
    let step = || {
        let (week, day) = (week.clone(), day.clone());
        scope.run(
            run.step("s", async move { (weekly(week).await, daily(day).await) })
                .unwrap(),
        )
    };
    let (w, d) = step().await;
    assert!(w.unwrap().is_fresh() && d.unwrap().is_fresh());
    clock.advance(Duration::from_secs(7 * 24 * 3600));
    let (w, d) = step().await;
    assert_eq!(w.unwrap(), Outcome::Replayed(7), "8 days of TTL: replays");
    assert_eq!(effects(&week), 1);
    assert_eq!(
        d.unwrap(),
        Outcome::Fresh(1),
        "1 day of TTL: the key is gone, the body runs again (what the audit refuses)"
    );
    assert_eq!(effects(&day), 2);
}

/// What the test's subscriber wrote.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;

    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}

#[tokio::test]
async fn the_audit_refuses_keys_shorter_than_the_resume_window_unless_accepted() {
    let tools = idem::registry::tools();
    let named = |name: &str| {
        tools
            .iter()
            .copied()
            .filter(|t| t.name == name)
            .collect::<Vec<_>>()
    };
    let (week, day) = (named("runs.week"), named("runs.day"));
    let both = [week.as_slice(), day.as_slice()].concat();
    let week_long = Duration::from_secs(7 * 24 * 3600);

    let idem = Idem::builder()
        .resume_window(week_long)
        .build(MemoryStore::new());
    let audit = audit_tools(&idem, &both).await;
    let text = audit.to_string();
    assert!(!audit.is_ok(), "{text}");
    let refused: Vec<_> = audit.errors().collect();
    assert_eq!(refused.len(), 1, "{text}");
    assert_eq!(refused[0].tool, Some("runs.day"));
    for words in [
        "TTL 1d is shorter than the resume window 7d + the retry window 1d",
        "Declare `ttl = \"8d\"` (or more) on the tool",
        "accept_short_ttl(\"runs.day\")",
    ] {
        assert!(refused[0].message.contains(words), "{words}: {text}");
    }
    let report = idem.report().to_markdown();
    assert!(
        report.contains("Durable runs resume for up to 7d"),
        "{report}"
    );
    assert!(report.contains("1d ✗ (runs need 8d)"), "{report}");
    assert!(report.contains("8d ✓"), "{report}");
    assert!(
        report.contains("`run_id` (from the run), `step_id` (from the run)"),
        "{report}"
    );

    // Accepted: a warning, and the risk is named.
    let idem = Idem::builder()
        .resume_window(week_long)
        .accept_short_ttl("runs.day")
        .accept_short_ttl("runs.nothing")
        .build(MemoryStore::new());
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let audit = audit_tools(&idem, &both).await;
    drop(guard);
    let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("WARN") && logged.contains("accepted risk") && logged.contains("runs.day"),
        "the accepted risk is logged: {logged}"
    );
    let text = audit.to_string();
    assert!(audit.is_ok(), "{text}");
    let day_finding = audit
        .findings
        .iter()
        .find(|f| f.tool == Some("runs.day"))
        .expect("the accepted tool is still reported");
    assert_eq!(day_finding.severity, Severity::Warning);
    assert!(day_finding.message.contains("accepted"), "{text}");
    assert!(
        text.contains("`accept_short_ttl(\"runs.nothing\")` names no registered tool"),
        "{text}"
    );

    // Without a resume window, nothing about runs.
    let idem = Idem::builder().build(MemoryStore::new());
    assert!(audit_tools(&idem, &both).await.is_ok());
}
