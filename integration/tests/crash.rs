//! Kill -9 at random moments: a child process runs a stream of intents against a SQLite file,
//! the parent kills it with SIGKILL after a random delay, and a fresh process retries the same
//! intents, cycle after cycle. The tools charge a provider whose ledger is an append-only file,
//! synced on every write. Even intents go through a tool with a state check that asks the
//! provider (by the call's downstream key) whether the charge happened; odd intents through a
//! tool without one, whose orphans become `unknown` (`on_orphan = "unknown"`). From the ledger
//! and the store: no intent is charged twice; every checked intent is charged exactly once and
//! completed; every unchecked one is completed (charged once) or visibly blocked as unknown.
//!
//! The same runs against Postgres when `IDEM_TEST_POSTGRES_URL` names a server, and a third
//! test kills the worker of a transactional tool (`transactional`) the same way: there, every
//! intent ends with its rows exactly once and a completed record, never unknown.
//!
//! The child marks each moment in a phase file (`B` before the call, `C` claimed, `E` inside the
//! effect, `F` effect done but not yet completed, `R` a completion attempt failed and is being
//! tried again, `D` completed, `G` a completion given up when its window closed, the call to be
//! tried again), so the parent knows where each kill landed. Every third intent's completion
//! blips (its first attempt fails, its second lands with its answer lost), so that kills land
//! while the runtime tries a completion again. `IDEM_CRASH_CYCLES` sets the number of cycles
//! (default 60; the full run in the notes used 300).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use idem::key::KeyPart;
use idem::store::conformance::test_server_url;
use idem::store::postgres::PostgresStore;
use idem::store::{Claim, ClaimRequest, Completion, Fenced, RecordStatus, Store, StoreFuture};
use idem::{Idem, derive_key, idempotent};

#[path = "common/kills.rs"]
mod kills;
use kills::{append_synced, env_path, open_store};

const INTENTS: u32 = 400;
const LEASE: Duration = Duration::from_millis(150);

fn mark(phase: char, intent: u32) {
    append_synced(
        &env_path("IDEM_CRASH_PHASES"),
        &format!("{phase} {intent}\n"),
    );
}

/// The provider's charges: `downstream-key intent` lines.
fn provider_charges() -> HashMap<String, u32> {
    std::fs::read_to_string(env_path("IDEM_CRASH_LEDGER"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, i)| (k.to_owned(), i.parse().unwrap()))
        .collect()
}

async fn provider_has_charge(intent: &u32) -> Result<Option<u32>, std::io::Error> {
    let key = idem::current()
        .expect("the check runs as the call")
        .derive("provider");
    Ok(provider_charges().get(key.as_str()).map(|_| *intent))
}

#[idempotent(key = "intent", mutating, check = provider_has_charge, name = "crash.charge")]
async fn charge(intent: u32) -> Result<u32, std::io::Error> {
    charge_provider(intent).await
}

/// No check: after a crash between the claim and the completion, nobody can tell whether the
/// charge happened, so the key is blocked rather than charged again.
#[idempotent(
    key = "intent",
    mutating,
    on_orphan = "unknown",
    name = "crash.charge_blind"
)]
async fn charge_blind(intent: u32) -> Result<u32, std::io::Error> {
    charge_provider(intent).await
}

async fn charge_provider(intent: u32) -> Result<u32, std::io::Error> {
    mark('E', intent);
    tokio::time::sleep(Duration::from_millis(3)).await;
    let key = idem::current().expect("keyed").derive("provider");
    append_synced(
        &env_path("IDEM_CRASH_LEDGER"),
        &format!("{} {intent}\n", key.as_str()),
    );
    mark('F', intent);
    tokio::time::sleep(Duration::from_millis(3)).await;
    Ok(intent)
}

/// The store under test, marking the claims and completions it answers.
struct Marking(Box<dyn Store>);

/// The intent being called (one call at a time in a child).
static CURRENT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

/// How many completions of each intent this process sent.
static COMPLETION_ATTEMPTS: std::sync::Mutex<Option<HashMap<u32, u32>>> =
    std::sync::Mutex::new(None);

fn current_intent() -> Option<u32> {
    let intent = CURRENT.load(std::sync::atomic::Ordering::SeqCst);
    (intent != u32::MAX).then_some(intent)
}

fn tool_of(intent: u32) -> &'static str {
    if intent.is_multiple_of(2) {
        "crash.charge"
    } else {
        "crash.charge_blind"
    }
}

impl Store for Marking {
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            let claim = self.0.claim(req).await?;
            if let (Claim::Acquired { .. }, Some(intent)) = (&claim, current_intent()) {
                mark('C', intent);
                // A window after the claim, before the effect.
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            Ok(claim)
        })
    }
    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            // Every third intent's completion blips: its first attempt fails unapplied, its
            // second is applied and its answer lost; the runtime tries again and recognises
            // its own record. The kills land in these windows too (`R`).
            let attempt = current_intent().map(|intent| {
                let mut attempts = COMPLETION_ATTEMPTS.lock().unwrap();
                let n = attempts
                    .get_or_insert_with(HashMap::new)
                    .entry(intent)
                    .or_default();
                *n += 1;
                (intent, *n)
            });
            if let Some((intent, 1)) = attempt.filter(|(i, _)| i.is_multiple_of(3)) {
                mark('R', intent);
                tokio::time::sleep(Duration::from_millis(5)).await;
                return Err(idem::StoreError::new(
                    "marking",
                    idem::StoreErrorKind::Unavailable,
                    "complete: the store blipped",
                ));
            }
            let fenced = self.0.complete(c).await?;
            if let (Fenced::Applied, Some(intent)) = (fenced, current_intent()) {
                mark('D', intent);
                // A window after the completion, before the caller hears of it.
                tokio::time::sleep(Duration::from_millis(3)).await;
                if let Some((intent, 2)) = attempt.filter(|(i, _)| i.is_multiple_of(3)) {
                    mark('R', intent);
                    return Err(idem::StoreError::new(
                        "marking",
                        idem::StoreErrorKind::Unavailable,
                        "complete: the answer was lost",
                    ));
                }
            }
            Ok(fenced)
        })
    }
    fn renew<'a>(&'a self, renewal: idem::store::Renewal<'a>) -> StoreFuture<'a, Fenced> {
        self.0.renew(renewal)
    }
    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: idem::IdempotencyKey,
        token: idem::store::FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        self.0.release(tenant, key, token)
    }
    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: idem::IdempotencyKey,
    ) -> StoreFuture<'a, Option<idem::store::Record>> {
        self.0.lookup(tenant, key)
    }
    fn purge_expired(&self, now: idem::store::UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        self.0.purge_expired(now, limit)
    }
    fn health(&self) -> StoreFuture<'_, idem::store::StoreHealth> {
        self.0.health()
    }
}

/// One child: calls every intent in order until each is answered `Fresh`, `Replayed` or
/// `Unknown`, waiting out leases of orphans left by killed predecessors.
#[test]
#[ignore = "run by `kill_9_at_random_moments` as a child process"]
fn crash_worker() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let idem = Idem::builder().lease(LEASE).build(Marking(
            open_store(
                std::env::var("IDEM_CRASH_POSTGRES").ok().as_deref(),
                &env_path("IDEM_CRASH_DB"),
            )
            .await,
        ));
        let tenant = idem.scope("tenant-crash");
        for intent in 0..INTENTS {
            CURRENT.store(intent, std::sync::atomic::Ordering::SeqCst);
            loop {
                mark('B', intent);
                let out = match tool_of(intent) {
                    "crash.charge" => tenant.run(charge(intent)).await,
                    _ => tenant.run(charge_blind(intent)).await,
                };
                match out {
                    Ok(out) if out.is_in_flight() => tokio::time::sleep(LEASE / 4).await,
                    Ok(out) if out.is_fresh() || out.is_replayed() || out.is_unknown() => break,
                    Ok(out) => panic!("intent {intent}: {out:?}"),
                    // The completion's window (the lease) closed before an attempt was
                    // answered: on a loaded machine the blips and the synced marks can outlast
                    // it. The key stays in flight until its lease lapses; the caller tries
                    // again with the same key, as an agent would, and finds the record a late
                    // attempt wrote, or takes the key over as an orphan.
                    Err(idem::Error::CompletionFailed { .. }) => {
                        mark('G', intent);
                        tokio::time::sleep(LEASE / 4).await;
                    }
                    Err(e) => panic!("intent {intent}: {e}"),
                }
            }
        }
    });
}

#[test]
fn kill_9_at_random_moments() {
    kill_9_cycles(None);
}

/// The same against Postgres (a schema of its own), when `IDEM_TEST_POSTGRES_URL` names one.
#[test]
fn kill_9_at_random_moments_on_postgres() {
    kills::in_private_schema("idem_crash", |url| kill_9_cycles(Some(url)));
}

fn kill_9_cycles(postgres: Option<String>) {
    let cycles = kills::cycles("IDEM_CRASH_CYCLES", 60);
    let dir = tempfile::tempdir().unwrap();
    let (db, ledger) = (dir.path().join("idem.db"), dir.path().join("provider.log"));
    let child = |phases: &Path| {
        let files = [
            ("IDEM_CRASH_DB", db.as_path()),
            ("IDEM_CRASH_LEDGER", &ledger),
            ("IDEM_CRASH_PHASES", phases),
        ];
        kills::worker(
            "crash_worker",
            &files,
            ("IDEM_CRASH_POSTGRES", postgres.as_deref()),
        )
    };
    // Killed at random moments; the last child finishes what is left (waiting out orphans'
    // leases).
    let kills = kills::kill_cycles(dir.path(), cycles, 0x1de3_0000, (15, 60), child);
    let escalated = kills::marks(dir.path(), 'G');

    let mut charged: HashMap<u32, usize> = HashMap::new();
    for line in std::fs::read_to_string(&ledger).unwrap().lines() {
        let intent: u32 = line.split_once(' ').unwrap().1.parse().unwrap();
        *charged.entry(intent).or_default() += 1;
    }
    let twice: Vec<_> = charged.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "intents charged twice: {twice:?}");

    // What the store says of each intent, read as an operator would.
    let statuses: Vec<RecordStatus> = {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let store = open_store(postgres.as_deref(), &db).await;
            let mut statuses = Vec::new();
            for intent in 0..INTENTS {
                let parts = [KeyPart::new(&intent).unwrap()];
                let key = derive_key("tenant-crash", tool_of(intent), &parts);
                let record = store.lookup("tenant-crash", key).await.unwrap();
                statuses.push(record.expect("every intent has a record").status);
            }
            statuses
        })
    };
    let mut unknown = 0;
    for (intent, status) in (0..INTENTS).zip(&statuses) {
        let times = charged.get(&intent).copied().unwrap_or(0);
        match (tool_of(intent), status) {
            (_, RecordStatus::Completed) => {
                assert_eq!(times, 1, "intent {intent} completed, charged {times} times")
            }
            ("crash.charge_blind", RecordStatus::Unknown) => unknown += 1,
            (tool, status) => panic!("intent {intent} ({tool}) ended {status:?}"),
        }
    }
    let mut phases: Vec<_> = kills.iter().collect();
    phases.sort();
    let store = if postgres.is_some() {
        "Postgres"
    } else {
        "SQLite"
    };
    println!(
        "{store}: {cycles} cycles, kills by the last moment reached ({{B: before the claim, C: claimed, \
         E: inside the effect, F: effect done, not completed, R: completion being tried again, \
         D: completed, G: completion given up, call to be retried, -: before the first call}}): \
         {phases:?}; {escalated} completions given up when their window closed (the call tried \
         again); {INTENTS} intents, none charged twice: {} checked ones completed, charged once; \
         of {} unchecked ones {} completed, charged once, and {unknown} blocked as unknown ({} of \
         those charged)",
        INTENTS / 2,
        INTENTS / 2,
        INTENTS / 2 - unknown,
        (0..INTENTS)
            .zip(&statuses)
            .filter(|(i, s)| **s == RecordStatus::Unknown && charged.contains_key(i))
            .count()
    );
}

/// The transactional tool of the transactional crash test: two writes (an order and its line)
/// in the transaction that also holds the claim and the record.
#[idempotent(key = "intent", mutating, transactional, name = "crash.order")]
async fn place_order(
    tx: &mut idem::store::postgres::tokio_postgres::Transaction<'_>,
    intent: u32,
) -> Result<i64, idem::store::postgres::tokio_postgres::Error> {
    let intent_i32 = i32::try_from(intent).expect("small");
    mark('C', intent);
    let id: i64 = tx
        .query_one(
            "INSERT INTO crash_orders (intent) VALUES ($1) RETURNING id",
            &[&intent_i32],
        )
        .await?
        .get(0);
    mark('W', intent);
    // A window between the two writes.
    tokio::time::sleep(Duration::from_millis(3)).await;
    tx.execute(
        "INSERT INTO crash_order_lines (order_id, intent) VALUES ($1, $2)",
        &[&id, &intent_i32],
    )
    .await?;
    mark('X', intent);
    // A window after the body's last write, before the record and the commit.
    tokio::time::sleep(Duration::from_millis(3)).await;
    Ok(id)
}

/// One child of the transactional crash test: places every order in turn until it is `Fresh`
/// or `Replayed` (in flight: a killed predecessor's transaction not yet rolled back).
#[test]
#[ignore = "run by `kill_9_of_a_transactional_tool_on_postgres` as a child process"]
fn transactional_crash_worker() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let url = std::env::var("IDEM_CRASH_POSTGRES").expect("set by the parent");
        let idem = Idem::open(&url).await.expect("open");
        let tenant = idem.scope("tenant-crash");
        for intent in 0..INTENTS {
            loop {
                mark('B', intent);
                match tenant.run(place_order(intent)).await {
                    Ok(out) if out.is_in_flight() => tokio::time::sleep(LEASE / 4).await,
                    Ok(out) if out.is_fresh() || out.is_replayed() => {
                        mark('D', intent);
                        // A window after the commit, before the next call.
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        break;
                    }
                    Ok(out) => panic!("intent {intent}: {out:?}"),
                    Err(e) => panic!("intent {intent}: {e}"),
                }
            }
        }
    });
}

/// Kill -9 of a transactional tool's worker at random moments (before the claim, inside the
/// body between its two writes, after the body before the commit, after the commit): every
/// intent ends with exactly one order, one line and one completed record, and nothing is
/// unknown. `IDEM_CRASH_CYCLES` sets the cycles (default 200).
#[test]
fn kill_9_of_a_transactional_tool_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let cycles = kills::cycles("IDEM_CRASH_CYCLES", 200);
    let schema = format!("idem_crash_tx_{}", uuid::Uuid::new_v4().simple());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {schema};
                 CREATE TABLE {schema}.crash_orders (id bigserial PRIMARY KEY, intent int NOT NULL);
                 CREATE TABLE {schema}.crash_order_lines (order_id bigint NOT NULL, intent int NOT NULL);"
            ))
            .await
            .unwrap();
        client
    });
    let sep = if url.contains('?') { '&' } else { '?' };
    let store_url = format!("{url}{sep}schema={schema}&options=-csearch_path%3D{schema}");
    let dir = tempfile::tempdir().unwrap();
    let child = |phases: &Path| {
        let files = [("IDEM_CRASH_PHASES", phases)];
        kills::worker(
            "transactional_crash_worker",
            &files,
            ("IDEM_CRASH_POSTGRES", Some(store_url.as_str())),
        )
    };
    let kills = kills::kill_cycles(dir.path(), cycles, 0x7a5c_0000, (20, 80), child);

    let (orders, lines, statuses) = runtime.block_on(async {
        let count = |table: &'static str| {
            let sql = format!("SELECT intent, count(*) FROM {schema}.{table} GROUP BY intent");
            let client = &client;
            async move {
                client
                    .query(&sql, &[])
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| (r.get::<_, i32>(0) as u32, r.get::<_, i64>(1)))
                    .collect::<HashMap<u32, i64>>()
            }
        };
        let (orders, lines) = (
            count("crash_orders").await,
            count("crash_order_lines").await,
        );
        let store = PostgresStore::open_url(&store_url).await.expect("open");
        let mut statuses = Vec::new();
        for intent in 0..INTENTS {
            let key = derive_key(
                "tenant-crash",
                "crash.order",
                &[KeyPart::new(&intent).unwrap()],
            );
            let record = store.lookup("tenant-crash", key).await.unwrap();
            statuses.push(record.map(|r| r.status));
        }
        (orders, lines, statuses)
    });
    let (mut duplicated, mut lost, mut unknown) = (0, 0, 0);
    for intent in 0..INTENTS {
        let (o, l) = (
            orders.get(&intent).copied().unwrap_or(0),
            lines.get(&intent).copied().unwrap_or(0),
        );
        duplicated += usize::from(o > 1 || l > 1);
        lost += usize::from(o == 0 || l == 0);
        match statuses[intent as usize] {
            Some(RecordStatus::Completed) => {}
            Some(RecordStatus::Unknown) => unknown += 1,
            other => panic!("intent {intent} ended {other:?}"),
        }
    }
    let mut phases: Vec<_> = kills.iter().collect();
    phases.sort();
    println!(
        "Postgres, transactional: {cycles} cycles, kills by the last moment reached ({{B: before \
         the claim, C: claimed, in the body before its first write, W: between the two writes, \
         X: body done, before the commit, D: committed, -: before the first call}}): {phases:?}; \
         {INTENTS} intents: {duplicated} duplicated, {lost} lost, {unknown} unknown; every one \
         has one order, one line and one completed record"
    );
    assert_eq!((duplicated, lost, unknown), (0, 0, 0));
    runtime.block_on(async {
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    });
}
