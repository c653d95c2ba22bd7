//! The Redis store on a real Redis Cluster: 3 primaries with a replica each, started by the
//! test on free loopback ports (`redis-server --cluster-enabled yes` ×6, `redis-cli --cluster
//! create … --cluster-replicas 1`), reached with `redis+cluster://`.
//!
//! - the whole conformance suite (and the admin checks, one tenant at a time);
//! - the cross-process race: 4 processes × 16 tasks × 200 intents, every effect once;
//! - failovers in the middle of a race: the primary holding the race's tenant is cut off from
//!   its replica (the replica frozen with SIGSTOP, the link dropped), goes on acknowledging
//!   writes for 100 ms, and dies (SIGKILL); its replica takes over; four times per run. Redis
//!   replicates asynchronously: what the primary acknowledged in the window is lost, and a
//!   retry runs the body again. Without waiting for replicas the test finds such duplicates (the
//!   control); with `wait_replicas=1` (Redis `WAIT` after each claim and completion, and the
//!   record read back) it finds none, and no call escalates (answers that its body ran and its
//!   result was not recorded): a completion that meets the failover is tried again until the
//!   new primary takes it. Every figure is printed.
//!
//! The same on a Valkey 9 cluster (`valkey-server` from `IDEM_TEST_VALKEY_SERVER`, which
//! `.ci/run` installs), where completions, renewals and releases are the server's own
//! compare-and-set (`SET … IFEQ`, `DELIFEQ`) instead of scripts: the conformance suite, the race,
//! and the failovers with a replica acknowledging each claim.
//!
//! Needs `redis-server` and `redis-cli`; runs when `IDEM_TEST_REDIS_URL` says Redis is installed.

#[path = "common/race.rs"]
mod race;
#[path = "common/servers.rs"]
mod servers;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use idem::store::conformance::test_server_url;
use idem::store::redis::RedisStore;
use servers::PrivateCluster;

#[test]
#[ignore = "run by the races below as a child process"]
fn worker() {
    race::worker_main();
}

/// The cluster of the conformance checks and the plain race (it dies with the process).
fn shared_cluster() -> Option<&'static PrivateCluster> {
    static CLUSTER: OnceLock<PrivateCluster> = OnceLock::new();
    test_server_url("IDEM_TEST_REDIS_URL")?;
    Some(CLUSTER.get_or_init(|| PrivateCluster::start(3)))
}

/// The program of a Valkey 9 server (`IDEM_TEST_VALKEY_SERVER`).
fn valkey() -> Option<String> {
    test_server_url("IDEM_TEST_VALKEY_SERVER")
}

/// A Valkey cluster for the conformance checks and the plain race.
fn valkey_cluster() -> Option<&'static PrivateCluster> {
    static CLUSTER: OnceLock<PrivateCluster> = OnceLock::new();
    let program = valkey()?;
    Some(CLUSTER.get_or_init(|| PrivateCluster::start_with(&program, 3)))
}

/// The contract on a Valkey cluster, by the server's own compare-and-set.
mod valkey_conformance {
    async fn store() -> Option<super::RedisStore> {
        let url = format!("{}/?prefix=conformance", super::valkey_cluster()?.url());
        let store = super::RedisStore::open_url(&url)
            .await
            .expect("the store opens on the cluster");
        let health = idem::store::Store::health(&store).await.expect("health");
        let fencing = health.fencing.expect("the Redis store names its fencing");
        assert!(fencing.contains("IFEQ, DELIFEQ"), "{fencing}");
        Some(store)
    }
    idem::store_conformance_tests!(maybe: store());
    idem::admin_conformance_tests!(maybe: store());
}

#[test]
fn processes_racing_on_a_valkey_cluster_run_every_effect_once() {
    if let Some(cluster) = valkey_cluster() {
        race::race_once(format!("{}/?prefix=race", cluster.url()));
    }
}

mod conformance {
    async fn store() -> Option<super::RedisStore> {
        let url = format!("{}/?prefix=conformance", super::shared_cluster()?.url());
        Some(
            super::RedisStore::open_url(&url)
                .await
                .expect("the store opens on the cluster"),
        )
    }
    idem::store_conformance_tests!(maybe: store());
    idem::admin_conformance_tests!(maybe: store());
}

/// The contract on a store over a cluster connection its user built.
mod own_connection {
    use idem::store::redis::{RedisOptions, RedisStore, redis};

    async fn store() -> Option<RedisStore> {
        let cluster = super::shared_cluster()?;
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect();
        let client = redis::cluster::ClusterClient::new(nodes).expect("a cluster client");
        let conn = client.get_async_connection().await.expect("connected");
        let options = RedisOptions::from_url(&format!("{}/?prefix=own", cluster.url())).unwrap();
        Some(
            RedisStore::from_cluster(conn, &options)
                .await
                .expect("the layout is checked through the user's connection"),
        )
    }
    idem::store_conformance_tests!(maybe: store());
}

#[test]
fn processes_racing_on_a_cluster_run_every_effect_once() {
    if let Some(cluster) = shared_cluster() {
        race::race_once(format!("{}/?prefix=race", cluster.url()));
    }
}

#[tokio::test]
async fn listing_every_tenant_is_refused_on_a_cluster_and_the_connection_is_plain() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let store = RedisStore::open_url(&cluster.url()).await.unwrap();
    let health = idem::store::Store::health(&store).await.unwrap();
    assert_eq!(health.encrypted, Some(false));
    let refused = idem::store::admin::AdminStore::scan(&store, None, None, 10)
        .await
        .expect_err("refused");
    assert!(
        refused.to_string().contains("one tenant at a time"),
        "{refused}"
    );
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// One failover run's figures.
#[derive(Debug)]
struct Failovers {
    calls: usize,
    fresh: usize,
    store_errors: usize,
    unrecorded: usize,
    /// Intents whose effect happened more than once, and how many extra effects.
    duplicated_intents: usize,
    extra_effects: usize,
}

/// How many times a run fails the primary over.
const FAILOVERS: usize = 4;

/// Races the workers for 24 s on a fresh cluster (replay cache off, so every call meets the
/// store) and fails the primary of the run's tenant over [`FAILOVERS`] times, waiting each time
/// for its replica to take over and bringing the old primary back as a replica.
fn race_through_failovers(program: &str, options: &str) -> Failovers {
    let cluster = PrivateCluster::start_with(program, 3);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}/?replay_cache=0{options}", cluster.url());
    let mut run = race::Race::new(url, dir.path());
    // A new intent every 3 ms for the whole run, half the tasks on the newest few (claims and
    // completions are being written at every moment a primary may die), the other half on the
    // intents of 3 s before (retries, after the failover, of what was claimed before it).
    run.seconds = Some(24);
    run.pace_ms = 1;
    run.step_ms = Some(3);
    run.intents = Some(8000);
    run.revisit_steps = Some(1000);
    let children = run.start();
    // Every record of the run's tenant lives on the primary of its hash tag.
    let tag = format!("x{{{}}}", hex(&run.tenant));
    for _ in 0..FAILOVERS {
        std::thread::sleep(Duration::from_secs(2));
        let victim = cluster.primary_of(&tag);
        // The primary loses its replica and goes on answering for 100 ms, then dies: what it
        // acknowledged meanwhile never reached the replica that takes over.
        cluster.partition_then_kill(victim, Duration::from_millis(100));
        let alive: Vec<u16> = cluster
            .ports
            .iter()
            .copied()
            .filter(|p| *p != victim)
            .collect();
        // The survivors notice after the node timeout (1 s), then promote the replica.
        std::thread::sleep(Duration::from_millis(1500));
        cluster.wait_until_ok(&alive);
        assert_ne!(cluster.primary_of(&tag), victim, "a replica took over");
        // Back as a replica of the new primary, so the next failover has one to promote.
        cluster.restart(victim);
    }
    let totals = run.finish(children);
    let effects: HashMap<u32, usize> = run.effects();
    let ran: usize = effects.values().sum();
    assert_eq!(
        ran,
        totals.fresh + totals.unrecorded,
        "every effect is a Fresh answer or an error saying the body ran: {totals:?}"
    );
    Failovers {
        calls: totals.calls(),
        fresh: totals.fresh,
        store_errors: totals.store_errors,
        unrecorded: totals.unrecorded,
        duplicated_intents: effects.values().filter(|n| **n > 1).count(),
        extra_effects: effects.values().map(|n| n.saturating_sub(1)).sum(),
    }
}

/// One failover race at a time: each runs 6 servers and 4 workers on two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How many failover races to run (each on a fresh cluster, four failovers each):
/// `IDEM_FAILOVER_ROUNDS`, 1 unless set (the figures in the README come from longer runs).
fn rounds(program: &str, options: &str) -> Vec<Failovers> {
    let rounds: usize = std::env::var("IDEM_FAILOVER_ROUNDS")
        .ok()
        .map_or(1, |n| n.parse().unwrap());
    (0..rounds)
        .map(|round| {
            let figures = race_through_failovers(program, options);
            println!(
                "failover round {round} ({program}, options `{options}`, {FAILOVERS} failovers): {} calls, \
                 {} fresh, {} failed closed, {} escalations (ran but could not record); {} \
                 intents ran twice ({} extra effects)",
                figures.calls,
                figures.fresh,
                figures.store_errors,
                figures.unrecorded,
                figures.duplicated_intents,
                figures.extra_effects
            );
            figures
        })
        .collect()
}

/// The control: without waiting for replicas, claims a primary acknowledged and lost in the
/// partition come back as new to the replica that took over, and run again.
#[test]
fn failovers_without_waiting_for_replicas_run_some_intents_twice() {
    if test_server_url("IDEM_TEST_REDIS_URL").is_none() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runs = rounds("redis-server", "");
    let duplicated: usize = runs.iter().map(|f| f.duplicated_intents).sum();
    assert!(
        duplicated > 0,
        "the partition lost acknowledged claims: {runs:?}"
    );
}

#[test]
fn failovers_with_a_replica_acknowledging_each_claim_run_nothing_twice() {
    if test_server_url("IDEM_TEST_REDIS_URL").is_none() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runs = rounds("redis-server", "&wait_replicas=1&wait_timeout_ms=500");
    for figures in &runs {
        assert_eq!(figures.duplicated_intents, 0, "{figures:?}");
        assert_eq!(figures.unrecorded, 0, "no escalation: {figures:?}");
    }
}

/// The same on Valkey, whose completions are the server's compare-and-set, each followed by
/// `WAIT` and the record read back as the scripts' are.
#[test]
fn failovers_on_valkey_with_a_replica_acknowledging_each_claim_run_nothing_twice() {
    let Some(program) = valkey() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runs = rounds(&program, "&wait_replicas=1&wait_timeout_ms=500");
    for figures in &runs {
        assert_eq!(figures.duplicated_intents, 0, "{figures:?}");
        assert_eq!(figures.unrecorded, 0, "no escalation: {figures:?}");
    }
}
