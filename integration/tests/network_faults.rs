//! Network faults between idem and its store, made by a TCP fault proxy (`common/proxy.rs`) in
//! front of the real Postgres and Redis, and stalls made by stopping a private server: each
//! fault deterministically, with the bound on the time to a store error asserted, counting how
//! many times the body ran; lost replies to claims, completions and releases; the retry
//! executor under faults. The random schedules are in `network_schedules.rs`.

mod common;
#[path = "common/proxy.rs"]
mod proxy;
#[path = "common/servers.rs"]
mod servers;

use std::convert::Infallible;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{effect, effects};
use idem::key::{KeyPart, derive_key};
use idem::store::RecordStatus;
use idem::store::conformance::test_server_url;
use idem::{Error, Idem, Outcome, idempotent};
use proxy::{Fault, FaultProxy};

/// Run ids whose body waits until the test lets it go.
static HELD: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Run ids as bodies begin, held or not.
static ENTERED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn entered(run_id: &str) -> usize {
    ENTERED
        .lock()
        .unwrap()
        .iter()
        .filter(|id| *id == run_id)
        .count()
}

#[idempotent(key = "run_id", mutating, lease = "1s", name = "faults.charge")]
async fn charge(run_id: String) -> Result<u32, Infallible> {
    ENTERED.lock().unwrap().push(run_id.clone());
    while HELD.lock().unwrap().contains(&run_id) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    effect(&run_id);
    Ok(7)
}

fn run_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[tokio::test]
async fn a_reset_fails_the_call_closed_and_the_store_recovers_after_it_on_postgres() {
    let Some((proxy, url)) =
        FaultProxy::in_front_of("IDEM_TEST_POSTGRES_URL", "sslmode=disable").await
    else {
        return;
    };
    let scope = Idem::open(&url).await.unwrap().scope("tenant-faults");
    assert!(matches!(
        scope.run(charge(run_id())).await,
        Ok(Outcome::Fresh(7))
    ));
    proxy.set(Fault::Reset);
    let id = run_id();
    let answer = scope.run(charge(id.clone())).await;
    assert!(matches!(&answer, Err(e) if e.is_store()), "{answer:?}");
    assert_eq!(effects(&id), 0, "the body did not run");
    proxy.set(Fault::None);
    let answer = scope.run(charge(id)).await;
    assert!(matches!(answer, Ok(Outcome::Fresh(7))), "{answer:?}");
}

#[tokio::test]
async fn a_black_hole_is_a_store_error_within_the_timeout_on_redis() {
    let Some((proxy, url)) = FaultProxy::in_front_of("IDEM_TEST_REDIS_URL", "timeout_ms=300").await
    else {
        return;
    };
    let scope = Idem::open(&url).await.unwrap().scope("tenant-faults");
    // The bound: two sends (the second on a new connection), each at most one connection
    // timeout and one response timeout; 300 ms more for the scheduler of a busy test machine.
    let within = Duration::from_millis(2 * (300 + 300) + 300);
    let _ = fails_closed_within(&scope, within, || proxy.set(Fault::BlackHole)).await;
    proxy.set(Fault::None);
    let mut healed = false;
    for _ in 0..20 {
        if matches!(scope.run(charge(run_id())).await, Ok(Outcome::Fresh(7))) {
            healed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(healed, "calls go through again once the network heals");
}

/// Postgres never sees a statement the network black-holes, so its own `statement_timeout`
/// cannot end the call: the client's response timeout does, and the connection is dropped.
#[tokio::test]
async fn a_black_hole_is_a_store_error_within_the_response_timeout_on_postgres() {
    let Some((proxy, url)) = FaultProxy::in_front_of(
        "IDEM_TEST_POSTGRES_URL",
        "sslmode=disable&response_timeout_ms=500",
    )
    .await
    else {
        return;
    };
    let scope = Idem::open(&url).await.unwrap().scope("tenant-faults");
    // The bound: one response timeout (the connection was already open).
    let within = Duration::from_millis(500 + 1000);
    let (_, answer) = fails_closed_within(&scope, within, || proxy.set(Fault::BlackHole)).await;
    assert!(
        matches!(&answer, Err(e) if e.to_string().contains("no answer")),
        "{answer:?}"
    );
    proxy.set(Fault::None);
    let answer = scope.run(charge(run_id())).await;
    assert!(matches!(answer, Ok(Outcome::Fresh(7))), "{answer:?}");
}

/// A claim whose reply is lost, then its connection: the call fails closed (the body does not
/// run), the claim is held in the store, and once its lease lapses a retry runs the body: once
/// in all.
#[tokio::test]
async fn a_lost_reply_to_a_claim_runs_the_body_once_after_the_lease_on_redis() {
    let Some((proxy, url)) =
        FaultProxy::in_front_of("IDEM_TEST_REDIS_URL", "timeout_ms=300&replay_cache=0").await
    else {
        return;
    };
    let scope = Idem::open(&url).await.unwrap().scope("tenant-faults");
    let id = run_id();
    proxy.set(Fault::SwallowReplies);
    let answer = scope.run(charge(id.clone())).await;
    assert!(matches!(&answer, Err(e) if e.is_store()), "{answer:?}");
    assert_eq!(effects(&id), 0, "the body did not run");
    // The connection lives on, one reply short: the store throws it away and opens another.
    proxy.set(Fault::None);
    let started = Instant::now();
    let mut answers = Vec::new();
    let fresh = loop {
        match scope.run(charge(id.clone())).await {
            Ok(Outcome::Fresh(7)) => break started.elapsed(),
            Ok(Outcome::InFlight(_)) => {
                answers.push("in flight".to_owned());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(Error::Store(e)) => {
                answers.push(format!("store error: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{answers:?}");
    };
    assert!(
        !answers.is_empty(),
        "the lost claim held the key for a while"
    );
    assert!(
        fresh <= Duration::from_secs(3),
        "taken over after {fresh:?}"
    );
    assert_eq!(effects(&id), 1, "one run in all");
}

/// Run ids whose `try_charge` may succeed; the others fail and release their claim.
static ALLOWED: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("not yet")]
struct NotYet;

#[idempotent(key = "run_id", mutating, lease = "1s", name = "faults.try_charge")]
async fn try_charge(run_id: String) -> Result<u32, NotYet> {
    ENTERED.lock().unwrap().push(run_id.clone());
    while HELD.lock().unwrap().contains(&run_id) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !ALLOWED.lock().unwrap().contains(&run_id) {
        return Err(NotYet);
    }
    effect(&run_id);
    Ok(7)
}

/// Waits until `check` holds, for at most 5 s.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < Duration::from_secs(5), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The status of `run_id`'s record of `tool`, read on `direct` (not through the proxy).
async fn status(direct: &Idem, tenant: &str, tool: &str, run_id: &str) -> Option<RecordStatus> {
    let key = derive_key(tenant, tool, &[KeyPart::new(run_id).unwrap()]);
    let record = direct.store().lookup(tenant, key).await.unwrap();
    record.map(|r| r.status)
}

/// Runs `call`, whose body waits while `id` is held; lets the body finish while replies are
/// swallowed; waits until `reached` finds on the server the write that followed the body; and
/// resets the open connections, so that write's reply is lost. Answers what the call answers.
async fn lose_the_reply_after_the_body<T: Send + 'static>(
    proxy: &FaultProxy,
    id: &str,
    call: impl Future<Output = T> + Send + 'static,
    reached: impl AsyncFnMut() -> bool,
) -> T {
    HELD.lock().unwrap().push(id.to_owned());
    let call = tokio::spawn(call);
    until("the body began", async || entered(id) == 1).await;
    proxy.set(Fault::SwallowReplies);
    HELD.lock().unwrap().retain(|held| held != id);
    until("the write after the body reached the server", reached).await;
    proxy.reset_open();
    call.await.unwrap()
}

/// A claim, a completion and a release each reach the server, their replies are lost, and
/// their connection is reset: each is sent again on a new connection, where the store
/// recognises its own token, so the call answers as if nothing was lost. (Were the claim not
/// recognised, the call would answer `InFlight`; the completion, `CompletionFailed`; the
/// release, a key held until its lease lapses.)
async fn lost_replies_are_recognised(var: &str, options: &str) {
    let Some((proxy, url)) = FaultProxy::in_front_of(var, options).await else {
        return;
    };
    let direct = Idem::open(&test_server_url(var).unwrap()).await.unwrap();
    let tenant = format!("tenant-lost-{}", uuid::Uuid::new_v4().simple());
    let scope = Idem::open(&url).await.unwrap().scope(tenant.as_str());
    // Statements prepared on the connection and scripts loaded on the server: the claim, the
    // completion or the release itself is what is sent next, not its preparation.
    let warm_up = async || {
        for _ in 0..3 {
            let _ = scope.run(charge(run_id())).await.unwrap();
            let _ = scope.run(try_charge(run_id())).await.unwrap_err();
        }
    };

    // The claim.
    warm_up().await;
    let id = run_id();
    proxy.set(Fault::SwallowReplies);
    let call = tokio::spawn({
        let (scope, id) = (scope.clone(), id.clone());
        async move { scope.run(charge(id)).await }
    });
    until("the claim reached the server", async || {
        status(&direct, &tenant, "faults.charge", &id).await == Some(RecordStatus::InFlight)
    })
    .await;
    proxy.reset_open();
    let answer = call.await.unwrap();
    assert!(matches!(answer, Ok(Outcome::Fresh(7))), "claim: {answer:?}");
    assert_eq!(effects(&id), 1);

    // The completion.
    warm_up().await;
    let id = run_id();
    let answer =
        lose_the_reply_after_the_body(&proxy, &id, scope.run(charge(id.clone())), async || {
            status(&direct, &tenant, "faults.charge", &id).await == Some(RecordStatus::Completed)
        })
        .await;
    assert!(
        matches!(answer, Ok(Outcome::Fresh(7))),
        "completion: {answer:?}"
    );
    assert_eq!(effects(&id), 1);

    // The release.
    warm_up().await;
    let id = run_id();
    let answer =
        lose_the_reply_after_the_body(&proxy, &id, scope.run(try_charge(id.clone())), async || {
            status(&direct, &tenant, "faults.try_charge", &id)
                .await
                .is_none()
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(Error::Tool {
                replayed: false,
                ..
            })
        ),
        "release: {answer:?}"
    );
    ALLOWED.lock().unwrap().push(id.clone());
    let answer = scope.run(try_charge(id.clone())).await;
    assert!(
        matches!(answer, Ok(Outcome::Fresh(7))),
        "the key is free: {answer:?}"
    );
    assert_eq!(effects(&id), 1);
}

#[tokio::test]
async fn a_lost_reply_to_a_claim_a_completion_or_a_release_is_recognised_on_postgres() {
    lost_replies_are_recognised("IDEM_TEST_POSTGRES_URL", "sslmode=disable&replay_cache=0").await;
}

#[tokio::test]
async fn a_lost_reply_to_a_claim_a_completion_or_a_release_is_recognised_on_redis() {
    lost_replies_are_recognised("IDEM_TEST_REDIS_URL", "timeout_ms=5000&replay_cache=0").await;
}

/// A reply lost on a connection that lives on (a middlebox dropped it), then the network heals
/// before the response timeout: the next reply on that connection belongs to another request.
/// Paired by order alone, the lost claim would read another key's fresh claim as its own and run
/// its body beside the key's owner. Tagged, it is found out of order: the connection is thrown
/// away and both claims are answered for what they are.
#[tokio::test]
async fn a_reply_lost_on_a_live_connection_is_never_taken_for_another_ones_on_redis() {
    let Some((proxy, url)) =
        FaultProxy::in_front_of("IDEM_TEST_REDIS_URL", "timeout_ms=2000&replay_cache=0").await
    else {
        return;
    };
    let scope = Idem::open(&url).await.unwrap().scope("tenant-faults");
    let (held, other) = (run_id(), run_id());
    HELD.lock().unwrap().push(held.clone());
    let owner = tokio::spawn({
        let (scope, held) = (scope.clone(), held.clone());
        async move { scope.run(charge(held)).await }
    });
    // The owner holds the key (its body waits).
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::SwallowReplies);
    let lost = tokio::spawn({
        let (scope, held) = (scope.clone(), held.clone());
        async move { scope.run(charge(held)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set(Fault::None);
    let fresh = scope.run(charge(other.clone())).await;
    assert!(matches!(fresh, Ok(Outcome::Fresh(7))), "{fresh:?}");
    let lost = tokio::time::timeout(Duration::from_secs(5), lost).await;
    assert_eq!(
        entered(&held),
        1,
        "a second body began beside the key's owner"
    );
    let lost = lost.expect("answered").unwrap();
    assert!(
        matches!(&lost, Ok(Outcome::InFlight(_))) || matches!(&lost, Err(e) if e.is_store()),
        "the key is its owner's: {lost:?}"
    );
    HELD.lock().unwrap().retain(|id| *id != held);
    assert!(matches!(owner.await.unwrap(), Ok(Outcome::Fresh(7))));
    assert_eq!(effects(&held), 1, "the held key ran once");
    assert_eq!(effects(&other), 1);
}

#[tokio::test]
async fn refused_connections_are_a_clear_error_at_open_on_postgres() {
    let Some((proxy, url)) = FaultProxy::in_front_of(
        "IDEM_TEST_POSTGRES_URL",
        "sslmode=disable&pool_timeout_ms=1000",
    )
    .await
    else {
        return;
    };
    proxy.set(Fault::Refuse);
    let error = Idem::open(&url).await.expect_err("refused");
    let text = error.to_string();
    assert!(text.contains("postgres"), "{text}");
    proxy.set(Fault::None);
    Idem::open(&url)
        .await
        .expect("opens once the network heals");
}

/// The proxy itself, on a raw Redis connection: a swallowed reply is gone, the next one comes.
#[tokio::test]
async fn the_proxy_swallows_replies_and_then_forwards_again() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some((proxy, _)) = FaultProxy::in_front_of("IDEM_TEST_REDIS_URL", "").await else {
        return;
    };
    let mut conn = proxy.raw().await;
    let mut buf = [0u8; 64];
    conn.write_all(b"PING\r\n").await.unwrap();
    let n = conn.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"+PONG\r\n");
    proxy.set(Fault::SwallowReplies);
    conn.write_all(b"ECHO a\r\n").await.unwrap();
    let silent = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
    assert!(silent.is_err(), "the reply was swallowed");
    proxy.set(Fault::None);
    conn.write_all(b"ECHO b\r\n").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf))
        .await
        .expect("replies flow again")
        .unwrap();
    assert_eq!(&buf[..n], b"$1\r\nb\r\n");
}

/// The proxy itself: a reply cut part way stops at the byte count and the socket stays open; a
/// latency fault holds each chunk back.
#[tokio::test]
async fn the_proxy_cuts_replies_and_delays_chunks() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some((proxy, _)) = FaultProxy::in_front_of("IDEM_TEST_REDIS_URL", "").await else {
        return;
    };
    let mut conn = proxy.raw().await;
    let mut buf = [0u8; 64];
    proxy.set(Fault::CutReplies { after: 3 });
    conn.write_all(b"ECHO abcdef\r\n").await.unwrap();
    let n = conn.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"$6\r", "three bytes of the reply");
    let rest = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
    assert!(rest.is_err(), "then nothing, the socket open");

    let mut conn = proxy.raw().await;
    proxy.set(Fault::Latency { ms: 200 });
    let started = Instant::now();
    conn.write_all(b"PING\r\n").await.unwrap();
    let n = conn.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"+PONG\r\n");
    // Held back on the way there and on the way back.
    assert!(started.elapsed() >= Duration::from_millis(400));
}

/// A first call on `scope` runs; then `strike` (a fault, a stall) and a call on a new key: a
/// store error within `within`, the body not run. Answers the key and the answer.
async fn fails_closed_within(
    scope: &idem::Scope,
    within: Duration,
    strike: impl FnOnce(),
) -> (String, Result<Outcome<u32>, Error<Infallible>>) {
    assert!(matches!(
        scope.run(charge(run_id())).await,
        Ok(Outcome::Fresh(7))
    ));
    strike();
    let id = run_id();
    let started = Instant::now();
    let answer = scope.run(charge(id.clone())).await;
    let waited = started.elapsed();
    assert!(matches!(&answer, Err(e) if e.is_store()), "{answer:?}");
    println!("a store error after {waited:?} (at most {within:?})");
    assert!(waited < within, "{waited:?}");
    assert_eq!(effects(&id), 0, "the body did not run");
    (id, answer)
}

/// Retries `call` on `id` until it answers `Fresh`, for at most `within`; returns how long it
/// took. In flight (a claim that reached the server late holds the key until its lease lapses)
/// and store errors are retried.
async fn fresh_within(scope: &idem::Scope, id: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let mut answers = Vec::new();
    loop {
        match scope.run(charge(id.to_owned())).await {
            Ok(Outcome::Fresh(7)) => return started.elapsed(),
            Ok(Outcome::InFlight(_)) => answers.push("in flight".to_owned()),
            Err(Error::Store(e)) => answers.push(format!("store error: {e}")),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < within, "{answers:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A stalled server (its processes stopped with SIGSTOP, sockets open): a call is a store error
/// within `bound`, and the body does not run; once the server resumes (SIGCONT), the key runs
/// once (a claim that reached the server during the stall holds it until its lease lapses).
async fn a_stall_fails_within(url: &str, bound: Duration, pause: impl Fn(), resume: impl Fn()) {
    let scope = Idem::open(url).await.unwrap().scope("tenant-stalls");
    // 300 ms more for the scheduler of a busy test machine.
    let within = bound + Duration::from_millis(300);
    let (id, _) = fails_closed_within(&scope, within, pause).await;
    resume();
    fresh_within(&scope, &id, Duration::from_secs(10)).await;
    assert_eq!(effects(&id), 1, "one run in all");
}

/// Postgres: the bound is the pool's wait, create and recycle timeouts and one response timeout.
#[tokio::test]
async fn a_stalled_postgres_is_a_store_error_within_the_bound_and_runs_once_after_it() {
    if idem::store::conformance::test_server_url("IDEM_TEST_POSTGRES_URL").is_none() {
        return;
    }
    let pg = servers::PrivatePostgres::create();
    let url = format!("{}?response_timeout_ms=500&pool_timeout_ms=500", pg.url());
    let bound = Duration::from_millis(3 * 500 + 500);
    a_stall_fails_within(&url, bound, || pg.pause(), || pg.resume()).await;
}

/// Redis: the bound is two sends, each one connection timeout and one response timeout.
#[tokio::test]
async fn a_stalled_redis_is_a_store_error_within_the_bound_and_runs_once_after_it() {
    if idem::store::conformance::test_server_url("IDEM_TEST_REDIS_URL").is_none() {
        return;
    }
    let redis = servers::PrivateRedis::create();
    let url = format!("{}?timeout_ms=300&replay_cache=0", redis.url());
    let bound = Duration::from_millis(2 * (300 + 300));
    a_stall_fails_within(&url, bound, || redis.pause(), || redis.resume()).await;
}

/// The retry executor while faults strike between idem and Redis, then heal: the same key on
/// every attempt, backoff between them, and one effect for every step, whatever the fault.
/// Faults that outlast the budget give the step up (the dead-letter queue is in the same
/// unreachable store: the caller is told it keeps the step), with no effect; a key held in
/// flight beyond the budget goes to the dead-letter queue.
#[tokio::test]
async fn the_retry_executor_through_network_faults_makes_one_effect_per_step() {
    use idem::retry::{RetryError, RetryPolicy, retry};
    let Some((proxy, url)) = FaultProxy::in_front_of("IDEM_TEST_REDIS_URL", "timeout_ms=200").await
    else {
        return;
    };
    let idem = Idem::open(&url).await.unwrap();
    let scope = idem.scope(format!("tenant-retry-{}", uuid::Uuid::new_v4().simple()));
    let policy = RetryPolicy {
        max_attempts: 50,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(200),
        budget: Duration::from_secs(10),
    };
    for fault in [
        Fault::SwallowReplies,
        Fault::CutReplies { after: 5 },
        Fault::BlackHole,
        Fault::Reset,
        Fault::Refuse,
        Fault::Latency { ms: 50 },
    ] {
        let id = run_id();
        let step = tokio::spawn({
            let (scope, id) = (scope.clone(), id.clone());
            async move { scope.run(retry(&policy, || charge(id.clone()))).await }
        });
        proxy.set(fault);
        tokio::time::sleep(Duration::from_millis(400)).await;
        proxy.set(Fault::None);
        let answer = step.await.unwrap();
        match &answer {
            Ok(Outcome::Fresh(7) | Outcome::Replayed(7)) => {
                assert_eq!(effects(&id), 1, "{fault:?}")
            }
            Err(RetryError::Call(e)) if e.body_ran() => assert_eq!(effects(&id), 1, "{fault:?}"),
            other => panic!("{fault:?}: {other:?}"),
        }
    }

    // Faults beyond the budget: given up, nothing ran; the step runs once when retried later.
    let id = run_id();
    proxy.set(Fault::BlackHole);
    let short = RetryPolicy {
        budget: Duration::from_secs(1),
        ..policy
    };
    let answer = scope.run(retry(&short, || charge(id.clone()))).await;
    assert!(
        matches!(answer, Err(RetryError::DeadLetterFailed { .. })),
        "{answer:?}"
    );
    assert_eq!(effects(&id), 0);
    proxy.set(Fault::None);
    let answer = scope.run(retry(&policy, || charge(id.clone()))).await;
    assert!(matches!(answer, Ok(Outcome::Fresh(7))), "{answer:?}");

    // A key held in flight beyond the budget, on a slow link: dead-lettered, readable after.
    let held = run_id();
    HELD.lock().unwrap().push(held.clone());
    let owner = tokio::spawn({
        let (scope, held) = (scope.clone(), held.clone());
        async move { scope.run(charge(held)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::Latency { ms: 30 });
    let answer = scope.run(retry(&short, || charge(held.clone()))).await;
    assert!(
        matches!(answer, Err(RetryError::DeadLettered { .. })),
        "{answer:?}"
    );
    proxy.set(Fault::None);
    let letters = idem.dead_letters(scope.tenant()).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    HELD.lock().unwrap().retain(|id| *id != held);
    assert!(matches!(owner.await.unwrap(), Ok(Outcome::Fresh(7))));
    assert_eq!(effects(&held), 1);
}

/// A state check for `checked_charge`: the effect ledger says whether the charge happened.
async fn already_charged(run_id: &str) -> Result<Option<u32>, Infallible> {
    Ok((effects(run_id) > 0).then_some(7))
}

#[idempotent(key = "run_id", mutating, lease = "1s", check = already_charged, name = "faults.checked_charge")]
async fn checked_charge(run_id: String) -> Result<u32, Infallible> {
    ENTERED.lock().unwrap().push(run_id.clone());
    while HELD.lock().unwrap().contains(&run_id) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    effect(&run_id);
    Ok(7)
}

/// The store goes away as the body returns (every connection reset, new ones too) and comes
/// back `outage` later; answers the call's answer and how long it took after the body.
async fn an_outage_as_the_body_returns(
    proxy: &FaultProxy,
    scope: &idem::Scope,
    id: &str,
    outage: Duration,
) -> (Result<Outcome<u32>, Error<Infallible>>, Duration) {
    HELD.lock().unwrap().push(id.to_owned());
    let call = tokio::spawn({
        let (scope, id) = (scope.clone(), id.to_owned());
        async move { scope.run(checked_charge(id)).await }
    });
    until("the body began", async || entered(id) == 1).await;
    proxy.set(Fault::Reset);
    let returned = Instant::now();
    HELD.lock().unwrap().retain(|held| held != id);
    tokio::time::sleep(outage).await;
    proxy.set(Fault::None);
    let answer = call.await.unwrap();
    (answer, returned.elapsed())
}

/// The completion meets an outage: shorter than the lease, it is tried again until the store is
/// back, and the call answers `Fresh`; longer than the lease, the call answers that the body
/// ran and its result was not recorded (after one lease of attempts), and once the lease has
/// lapsed the next call takes the key over, asks the state check, and replays: one effect.
async fn a_completion_rides_out_an_outage_shorter_than_the_lease(var: &str, options: &str) {
    let Some((proxy, url)) = FaultProxy::in_front_of(var, options).await else {
        return;
    };
    let direct = Idem::open(&test_server_url(var).unwrap()).await.unwrap();
    let tenant = format!("tenant-outage-{}", uuid::Uuid::new_v4().simple());
    let scope = Idem::open(&url).await.unwrap().scope(tenant.as_str());
    let _ = scope.run(checked_charge(run_id())).await.unwrap();

    let id = run_id();
    let (answer, took) =
        an_outage_as_the_body_returns(&proxy, &scope, &id, Duration::from_millis(600)).await;
    assert!(matches!(answer, Ok(Outcome::Fresh(7))), "{answer:?}");
    assert!(took >= Duration::from_millis(600), "{took:?}");
    assert_eq!(
        status(&direct, &tenant, "faults.checked_charge", &id).await,
        Some(RecordStatus::Completed)
    );
    assert_eq!(effects(&id), 1);

    let id = run_id();
    let (answer, took) =
        an_outage_as_the_body_returns(&proxy, &scope, &id, Duration::from_millis(2500)).await;
    match &answer {
        Err(e @ Error::CompletionFailed { attempts, .. }) => {
            assert!(e.body_ran() && *attempts > 1, "{e}");
        }
        other => panic!("past the lease: {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(2500),
        "answered after the outage: {took:?}"
    );
    assert_eq!(
        status(&direct, &tenant, "faults.checked_charge", &id).await,
        Some(RecordStatus::InFlight),
        "the key stays in flight until its lease lapses"
    );
    let replayed = loop {
        match scope.run(checked_charge(id.clone())).await {
            Ok(Outcome::InFlight(wait)) => tokio::time::sleep(wait.retry_after).await,
            other => break other,
        }
    };
    assert!(
        matches!(replayed, Ok(Outcome::Replayed(7))),
        "the check found the charge: {replayed:?}"
    );
    assert_eq!(effects(&id), 1);
}

#[tokio::test]
async fn a_completion_rides_out_an_outage_shorter_than_the_lease_on_postgres() {
    a_completion_rides_out_an_outage_shorter_than_the_lease(
        "IDEM_TEST_POSTGRES_URL",
        "sslmode=disable&replay_cache=0&response_timeout_ms=400&pool_timeout_ms=400&connect_timeout=1",
    )
    .await;
}

#[tokio::test]
async fn a_completion_rides_out_an_outage_shorter_than_the_lease_on_redis() {
    a_completion_rides_out_an_outage_shorter_than_the_lease(
        "IDEM_TEST_REDIS_URL",
        "timeout_ms=250&replay_cache=0",
    )
    .await;
}
