//! One full scenario with every log line captured (TRACE, all targets) and every metric
//! recorded: the counters count what happened, labelled by tool, and the raw key never appears.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{CountingStore, DownStore};
use idem::retry::{RetryPolicy, retry};
use idem::telemetry::{
    BODY_RUNS, CALL_DURATION, CALLS, COMPLETION_RETRIES, COMPLETIONS_LATE, COMPLETIONS_LOST, WAITS,
};
use idem::{Idem, idempotent};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

const SECRET: &str = "run-secret-4242";

#[idempotent(key = "run_id", mutating, name = "telemetry.charge", skip = "hold_ms")]
async fn charge(run_id: String, amount: u64, hold_ms: u64) -> Result<u64, String> {
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    if amount == 0 {
        return Err("zero".into());
    }
    Ok(amount)
}

#[idempotent(key = "run_id", mutating, name = "telemetry.send", wait = "5s")]
async fn send(run_id: String) -> Result<u64, String> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(1)
}

/// The metrics of `tool`: (metric, outcome label or "") -> count, or the number of samples of
/// the histogram; every one described, with its unit.
fn counts_of(snapshotter: &Snapshotter, tool: &str) -> HashMap<(String, String), u64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key()
                .labels()
                .any(|l| l.key() == "tool" && l.value() == tool)
        })
        .map(|(key, unit, description, value)| {
            let name = key.key().name().to_owned();
            assert!(
                unit.is_some() && description.is_some(),
                "{name} is described"
            );
            let outcome = key
                .key()
                .labels()
                .find(|l| l.key() == "outcome")
                .map_or(String::new(), |l| l.value().to_owned());
            let n = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => panic!("idem keeps no gauge: {name}"),
            };
            ((name, outcome), n)
        })
        .collect()
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_and_metrics_count_every_outcome_and_never_show_the_key() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
        .with_writer(move || writer.clone())
        // Plain text: another dependency may turn on tracing-subscriber's `ansi` feature.
        .with_ansi(false)
        .finish();
    // Global, so that the spawned call's logs (on another worker thread) are captured too.
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).unwrap();

    let idem = Idem::open("memory://").await.unwrap();
    let tenant = idem.scope("tenant-t");
    let run = SECRET.to_owned();
    assert!(
        tenant
            .run(charge(run.clone(), 5, 0))
            .await
            .unwrap()
            .is_fresh()
    );
    assert!(
        tenant
            .run(charge(run.clone(), 5, 0))
            .await
            .unwrap()
            .is_replayed()
    );
    assert!(
        tenant
            .run(charge(run.clone(), 6, 0))
            .await
            .unwrap()
            .is_mismatch()
    );
    let other = format!("{SECRET}-b");
    let hold = tokio::spawn(tenant.run(charge(other.clone(), 5, 300)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        tenant
            .run(charge(other.clone(), 5, 0))
            .await
            .unwrap()
            .is_in_flight()
    );
    let policy = RetryPolicy {
        budget: Duration::from_millis(60),
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    let dead = tenant
        .run(retry(&policy, || charge(other.clone(), 5, 0)))
        .await;
    assert!(dead.is_err(), "{dead:?}");
    assert!(hold.await.unwrap().unwrap().is_fresh());
    assert!(
        tenant
            .run(charge(format!("{SECRET}-c"), 0, 0))
            .await
            .is_err()
    );
    let down = Idem::with_store(DownStore);
    assert!(
        down.scope("tenant-t")
            .run(charge(run.clone(), 5, 0))
            .await
            .is_err()
    );

    // A completion that meets two store errors lands late; one that meets nothing else is
    // given up after its window (the body ran twice more).
    let blipping = Arc::new(CountingStore::default());
    blipping
        .fail_completions_left
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let blipping_idem = Idem::builder()
        .completion_retry(Duration::from_millis(100))
        .build(blipping.clone());
    let blipped = blipping_idem.scope("tenant-t");
    assert!(
        blipped
            .run(charge(format!("{SECRET}-d"), 5, 0))
            .await
            .unwrap()
            .is_fresh()
    );
    blipping
        .fail_completions
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        blipped
            .run(charge(format!("{SECRET}-e"), 5, 0))
            .await
            .is_err()
    );

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("idem.call"), "{logs}");
    assert!(
        logs.contains("outcome=\"replayed\"") || logs.contains("outcome=replayed"),
        "{logs}"
    );
    let hash = idem::derive_key(
        "tenant-t",
        "telemetry.charge",
        &[idem::key::KeyPart::new(&run).unwrap()],
    )
    .short_hash()
    .to_string();
    assert!(
        logs.contains(&hash),
        "the short hash is there to correlate: {logs}"
    );
    assert!(
        !logs.contains(SECRET),
        "a raw key part leaked into the logs"
    );

    let counts = counts_of(&snapshotter, "telemetry.charge");
    let count = |name: &str, outcome: &str| counts.get(&(name.to_owned(), outcome.to_owned()));
    // The body ran five times: the first call, the held one, the failing one, the one whose
    // completion landed late and the one whose completion was lost.
    assert_eq!(count(BODY_RUNS, ""), Some(&5), "{counts:?}");
    assert_eq!(count(CALLS, "fresh"), Some(&3), "{counts:?}");
    assert_eq!(count(CALLS, "completion_failed"), Some(&1), "{counts:?}");
    assert_eq!(count(COMPLETIONS_LATE, ""), Some(&1), "{counts:?}");
    assert_eq!(count(COMPLETIONS_LOST, ""), Some(&1), "{counts:?}");
    assert!(
        count(COMPLETION_RETRIES, "").is_some_and(|n| *n >= 3),
        "two for the late one, at least one for the lost one: {counts:?}"
    );
    assert_eq!(count(CALLS, "tool_error"), Some(&1), "{counts:?}");
    assert_eq!(count(CALLS, "replayed"), Some(&1), "{counts:?}");
    assert_eq!(count(CALLS, "mismatch"), Some(&1), "{counts:?}");
    assert!(
        count(CALLS, "in_flight").is_some_and(|n| *n >= 2),
        "{counts:?}"
    );
    assert_eq!(count(CALLS, "store_error"), Some(&1), "{counts:?}");
    // Every call is timed once, under the same labels as its count.
    for ((name, outcome), n) in &counts {
        if name == CALLS {
            assert_eq!(count(CALL_DURATION, outcome), Some(n), "{counts:?}");
        }
    }

    // A duplicate that waits: counted as a wait, and as the replay it ends in.
    let first = tokio::spawn(tenant.run(send("w-1".into())));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tenant.run(send("w-1".into())).await.unwrap();
    assert!(matches!(second, idem::Outcome::Replayed(1)), "{second:?}");
    assert!(matches!(first.await.unwrap(), Ok(idem::Outcome::Fresh(1))));
    let sends = counts_of(&snapshotter, "telemetry.send");
    for (name, outcome, n) in [(WAITS, "", 1), (CALLS, "replayed", 1), (CALLS, "fresh", 1)] {
        assert_eq!(
            sends.get(&(name.to_owned(), outcome.to_owned())),
            Some(&n),
            "{name} {outcome}: {sends:?}"
        );
    }
}
