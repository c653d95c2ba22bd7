//! Batch tools on SQLite, Postgres and Redis.
//!
//! - A batch of 100 mails with 37 already sent (by an earlier call of those 37): the body runs
//!   on exactly the other 63, the call answers 100 outcomes in order (37 `Replayed`, 63
//!   `Fresh`), and the store is asked once to claim and once to settle (no single claim).
//! - Kill -9 mid-batch (`IDEM_BATCH_CRASH_CYCLES` cycles, default 100, on SQLite and Postgres):
//!   a worker charges 400 intents in 20 batches of 20 through a provider that honours an
//!   idempotency key (as Stripe does), sending each item's downstream key
//!   ([`idem::current_batch`]); the parent kills it with SIGKILL at random moments and starts
//!   another, which retries the batches (orphaned items are taken over once their lease lapses
//!   and sent again with the same key). In the end every intent is charged exactly once, every
//!   item's record is completed, and only items a kill left unsettled were ever sent twice.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::key::KeyPart;
use idem::store::conformance::test_server_url;
use idem::store::postgres::PostgresStore;
use idem::store::sqlite::SqliteStore;
use idem::store::{
    BatchClaim, BatchSettlement, Claim, ClaimRequest, Completion, Fenced, FencingToken, Record,
    RecordStatus, Renewal, Store, StoreFuture, StoreHealth, UnixMillis,
};
use idem::{Idem, IdempotencyKey, Outcome, derive_key, idempotent};
use serde::{Deserialize, Serialize};

#[path = "common/kills.rs"]
mod kills;
use kills::{append_synced, env_path, open_store};

/// A mail to send; `id` is its key within the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mail {
    id: u32,
    subject: String,
}

/// The mails each process sent, by run and id.
static SENT: std::sync::Mutex<Vec<(String, u32)>> = std::sync::Mutex::new(Vec::new());

#[idempotent(key = "run_id, mails[].id", mutating, name = "batch.send_mails")]
async fn send_mails(run_id: String, mails: Vec<Mail>) -> Vec<Result<u32, std::io::Error>> {
    let mut sent = SENT.lock().unwrap();
    mails
        .into_iter()
        .map(|mail| {
            sent.push((run_id.clone(), mail.id));
            Ok(mail.id * 10)
        })
        .collect()
}

/// A store that counts what it is asked: single claims and completions, batch claims and
/// settlements.
struct Trips {
    inner: Box<dyn Store>,
    claims: AtomicUsize,
    completions: AtomicUsize,
    batch_claims: AtomicUsize,
    batch_settlements: AtomicUsize,
}

impl Trips {
    fn new(inner: Box<dyn Store>) -> Arc<Self> {
        Arc::new(Trips {
            inner,
            claims: AtomicUsize::new(0),
            completions: AtomicUsize::new(0),
            batch_claims: AtomicUsize::new(0),
            batch_settlements: AtomicUsize::new(0),
        })
    }

    fn counts(&self) -> [usize; 4] {
        [
            &self.claims,
            &self.completions,
            &self.batch_claims,
            &self.batch_settlements,
        ]
        .map(|n| n.load(Ordering::SeqCst))
    }
}

impl Store for Trips {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(req)
    }
    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        self.completions.fetch_add(1, Ordering::SeqCst);
        self.inner.complete(c)
    }
    fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
        self.batch_claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim_batch(batch)
    }
    fn settle_batch<'a>(&'a self, batch: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        self.batch_settlements.fetch_add(1, Ordering::SeqCst);
        self.inner.settle_batch(batch)
    }
    fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        self.inner.renew(r)
    }
    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        self.inner.release(tenant, key, token)
    }
    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>> {
        self.inner.lookup(tenant, key)
    }
    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        self.inner.purge_expired(now, limit)
    }
    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        self.inner.health()
    }
}

/// 100 mails, 37 of them (scattered) sent by an earlier call: the retry sends the other 63 and
/// answers all 100 in order, in one claim and one settlement.
async fn a_batch_with_37_of_100_done(store: Box<dyn Store>) {
    let trips = Trips::new(store);
    let idem = Idem::with_store(trips.clone());
    let tenant = idem.scope("tenant-batch");
    let run = format!("run-{}", uuid::Uuid::new_v4().simple());
    let mail = |id| Mail {
        id,
        subject: format!("invoice {id}"),
    };
    // 7 is prime to 100: i * 7 % 100 walks every item once.
    let done: Vec<u32> = (0..100).filter(|i| i * 7 % 100 < 37).collect();
    assert_eq!(done.len(), 37);
    let first = tenant
        .run(send_mails(
            run.clone(),
            done.iter().map(|&i| mail(i)).collect(),
        ))
        .await
        .unwrap();
    assert_eq!(first.ran(), 37);
    let before = trips.counts();
    let batch = tenant
        .run(send_mails(run.clone(), (0..100).map(mail).collect()))
        .await
        .unwrap();
    let after = trips.counts();
    assert_eq!(
        [0, 1, 2, 3].map(|i| after[i] - before[i]),
        [0, 0, 1, 1],
        "one claim and one settlement for the 100 items, no single call"
    );
    assert_eq!(batch.len(), 100);
    for (i, answer) in (0..100u32).zip(&batch) {
        match answer {
            Ok(Outcome::Replayed(v)) if done.contains(&i) => assert_eq!(*v, i * 10),
            Ok(Outcome::Fresh(v)) if !done.contains(&i) => assert_eq!(*v, i * 10),
            other => panic!("item {i}: {other:?}"),
        }
    }
    let sent: Vec<u32> = SENT
        .lock()
        .unwrap()
        .iter()
        .filter(|(r, _)| *r == run)
        .map(|(_, id)| *id)
        .collect();
    let mut expected = done.clone();
    expected.extend((0..100).filter(|i| !done.contains(i)));
    assert_eq!(
        sent, expected,
        "each mail once: 37, then exactly the other 63 in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_37_of_100_done_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_path(dir.path().join("idem.db")).unwrap();
    a_batch_with_37_of_100_done(Box::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_37_of_100_done_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let store = PostgresStore::open_url(&url).await.unwrap();
    a_batch_with_37_of_100_done(Box::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_37_of_100_done_on_redis() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let store = idem::store::redis::RedisStore::open_url(&url)
        .await
        .unwrap();
    a_batch_with_37_of_100_done(Box::new(store)).await;
}

// The kill test.

const ROUNDS: u32 = 20;
const PER_ROUND: u32 = 20;
const LEASE: Duration = Duration::from_millis(150);

fn mark(phase: char, intent: u32) {
    append_synced(
        &env_path("IDEM_BATCH_PHASES"),
        &format!("{phase} {intent}\n"),
    );
}

/// `key intent` lines of a provider file.
fn read_pairs(path: &Path) -> Vec<(String, u32)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, i)| (k.to_owned(), i.parse().unwrap()))
        .collect()
}

/// A provider that honours idempotency keys: every request is logged; a key it has charged
/// before is answered without charging again.
fn provider_charge(key: &str, intent: u32) {
    append_synced(
        &env_path("IDEM_BATCH_REQUESTS"),
        &format!("{key} {intent}\n"),
    );
    let charges = env_path("IDEM_BATCH_CHARGES");
    if read_pairs(&charges).iter().all(|(k, _)| k != key) {
        append_synced(&charges, &format!("{key} {intent}\n"));
    }
}

/// Charges each intent of a round through the provider, with its item's downstream key.
#[idempotent(key = "round, intents[]", mutating, name = "batch.crash.charge")]
async fn charge_all(round: u32, intents: Vec<u32>) -> Vec<Result<u32, std::io::Error>> {
    let batch = idem::current_batch().expect("inside a batch");
    let mut out = Vec::with_capacity(intents.len());
    for (i, intent) in intents.iter().enumerate() {
        let key = batch.item(i).expect("one call per item").derive("provider");
        mark('E', *intent);
        provider_charge(key.as_str(), *intent);
        mark('F', *intent);
        tokio::time::sleep(Duration::from_millis(1)).await;
        out.push(Ok(*intent));
    }
    let _ = round;
    out
}

/// One worker: every round until all its items are answered `Fresh` or `Replayed`, waiting out
/// the leases of items a killed predecessor left in flight.
#[test]
#[ignore = "run by the kill tests below as a child process"]
fn batch_worker() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = open_store(
            std::env::var("IDEM_BATCH_POSTGRES").ok().as_deref(),
            &env_path("IDEM_BATCH_DB"),
        )
        .await;
        let idem = Idem::builder().lease(LEASE).build(store);
        let tenant = idem.scope("tenant-batch-crash");
        for round in 0..ROUNDS {
            let intents: Vec<u32> = (round * PER_ROUND..(round + 1) * PER_ROUND).collect();
            loop {
                mark('B', intents[0]);
                let batch = tenant
                    .run(charge_all(round, intents.clone()))
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
                let mut waiting = false;
                for answer in &batch {
                    match answer {
                        Ok(out) if out.is_fresh() || out.is_replayed() => {}
                        Ok(out) if out.is_in_flight() => waiting = true,
                        other => panic!("round {round}: {other:?}"),
                    }
                }
                if !waiting {
                    mark('D', intents[0]);
                    break;
                }
                tokio::time::sleep(LEASE / 4).await;
            }
        }
    });
}

fn kill_9_mid_batch(postgres: Option<String>) {
    let cycles = kills::cycles("IDEM_BATCH_CRASH_CYCLES", 100);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let (requests, charges) = (dir.path().join("requests"), dir.path().join("charges"));
    let child = |phases: &Path| {
        let files = [
            ("IDEM_BATCH_DB", db.as_path()),
            ("IDEM_BATCH_REQUESTS", &requests),
            ("IDEM_BATCH_CHARGES", &charges),
            ("IDEM_BATCH_PHASES", phases),
        ];
        kills::worker(
            "batch_worker",
            &files,
            ("IDEM_BATCH_POSTGRES", postgres.as_deref()),
        )
    };
    let kills = kills::kill_cycles(dir.path(), cycles, 0xba7c_0000, (15, 60), child);

    let intents = ROUNDS * PER_ROUND;
    let mut charged: HashMap<u32, usize> = HashMap::new();
    for (_, intent) in read_pairs(&charges) {
        *charged.entry(intent).or_default() += 1;
    }
    let twice: Vec<_> = charged.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "intents charged twice: {twice:?}");
    assert_eq!(charged.len(), intents as usize, "every intent charged once");
    let mut requested: HashMap<u32, Vec<String>> = HashMap::new();
    for (key, intent) in read_pairs(&requests) {
        requested.entry(intent).or_default().push(key);
    }
    for (intent, keys) in &requested {
        assert!(
            keys.iter().all(|k| *k == keys[0]),
            "intent {intent}: one downstream key across every retry and takeover"
        );
    }
    let sent_again = requested.values().filter(|keys| keys.len() > 1).count();
    let killed: usize = kills.values().sum();
    assert!(
        sent_again <= killed * PER_ROUND as usize,
        "{sent_again} items sent again, more than {killed} kills could leave unsettled"
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = open_store(postgres.as_deref(), &db).await;
        for intent in 0..intents {
            let parts = [
                KeyPart::new(&(intent / PER_ROUND)).unwrap(),
                KeyPart::new(&intent).unwrap(),
            ];
            let key = derive_key("tenant-batch-crash", "batch.crash.charge", &parts);
            let record = store.lookup("tenant-batch-crash", key).await.unwrap();
            let status = record.expect("every item has a record").status;
            assert_eq!(status, RecordStatus::Completed, "intent {intent}");
        }
    });
    let mut phases: Vec<_> = kills.iter().collect();
    phases.sort();
    let store = if postgres.is_some() {
        "Postgres"
    } else {
        "SQLite"
    };
    println!(
        "{store}: {cycles} cycles, kills by the last moment reached ({{B: before a batch call, \
         E: inside an item's effect, F: an item's effect done, D: a batch answered, -: before \
         the first call}}): {phases:?}; {intents} intents in {ROUNDS} batches of {PER_ROUND}, \
         each charged exactly once and completed; {sent_again} items sent to the provider again \
         (with their one key) after a kill left them unsettled"
    );
}

#[test]
fn kill_9_mid_batch_on_sqlite() {
    kill_9_mid_batch(None);
}

/// The same against Postgres (a schema of its own), when `IDEM_TEST_POSTGRES_URL` names one.
#[test]
fn kill_9_mid_batch_on_postgres() {
    kills::in_private_schema("idem_batch", |url| kill_9_mid_batch(Some(url)));
}
