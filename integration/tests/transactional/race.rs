//! Several processes on the same intents, and a completion that fails after the body ran.

use super::*;

/// One order per intent, for the race between processes.
#[idempotent(key = "intent", mutating, transactional, name = "orders.race")]
async fn race_order(tx: &mut Transaction<'_>, intent: u32) -> Result<i64, OrderError> {
    let row = tx
        .query_one(
            "INSERT INTO orders (run_id, step_id, item, qty) VALUES ('race', $1, 'race', 1) \
             RETURNING id",
            &[&intent.to_string()],
        )
        .await?;
    Ok(row.get(0))
}

const PROCESSES: usize = 4;
const TASKS: u32 = 16;
const INTENTS: u32 = 200;

/// One process of the race: 16 tasks calling every intent, each in its own order, until each
/// answers `Fresh` or `Replayed`. Prints how many were fresh, replayed, and answered in flight.
#[test]
#[ignore = "run by `four_processes_race_on_the_same_intents_and_write_each_once` as a child"]
fn race_worker() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (fresh, replayed, in_flight) = runtime.block_on(async {
        let url = std::env::var("IDEM_RACE_URL").expect("set by the parent");
        let idem = Idem::open(&url).await.expect("open");
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..TASKS {
            let scope = idem.scope("tenant-race");
            tasks.spawn(async move {
                let (mut fresh, mut replayed, mut in_flight) = (0, 0, 0);
                for i in 0..INTENTS {
                    let intent = (i + task * 37) % INTENTS;
                    loop {
                        let out = scope.run(race_order(intent)).await.expect("no error");
                        if out.is_in_flight() {
                            in_flight += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        fresh += usize::from(out.is_fresh());
                        replayed += usize::from(out.is_replayed());
                        break;
                    }
                }
                (fresh, replayed, in_flight)
            });
        }
        let mut total = (0, 0, 0);
        while let Some(done) = tasks.join_next().await {
            let (f, r, i) = done.unwrap();
            total = (total.0 + f, total.1 + r, total.2 + i);
        }
        total
    });
    println!("COUNTS {fresh} {replayed} {in_flight}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_race_on_the_same_intents_and_write_each_once() {
    let Some(db) = Db::new().await else { return };
    // The schema is created by the first process to open it; open it once here first.
    let _ = db.idem().await;
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["race::race_worker", "--exact", "--ignored", "--nocapture"])
                .env("IDEM_RACE_URL", db.store_url(""))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let (mut fresh, mut replayed, mut in_flight) = (0, 0, 0);
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find(|l| l.starts_with("COUNTS "))
            .expect("counts");
        let n: Vec<usize> = line[7..]
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        (fresh, replayed, in_flight) = (fresh + n[0], replayed + n[1], in_flight + n[2]);
    }
    let rows = db
        .client
        .query(
            &format!(
                "SELECT step_id, count(*) FROM {}.orders WHERE run_id = 'race' GROUP BY step_id",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let twice = rows.iter().filter(|r| r.get::<_, i64>(1) != 1).count();
    println!(
        "{PROCESSES} processes x {TASKS} tasks x {INTENTS} intents: {} intents with rows, {twice} \
         with more than one; {fresh} fresh, {replayed} replayed, {in_flight} in flight (retried)",
        rows.len()
    );
    assert_eq!(rows.len(), INTENTS as usize, "every intent has its row");
    assert_eq!(twice, 0, "no intent has two");
    assert_eq!(fresh, INTENTS as usize, "one fresh call per intent");
    assert_eq!(
        fresh + replayed,
        PROCESSES * TASKS as usize * INTENTS as usize,
        "every call answered"
    );
    db.drop().await;
}

/// Inserts an order, and with `vandal` also deletes idem's records in its own transaction: its
/// completion then finds no row to complete.
#[idempotent(
    key = "run_id",
    mutating,
    transactional,
    skip = "vandal",
    name = "orders.vandal"
)]
async fn vandal_order(
    tx: &mut Transaction<'_>,
    run_id: String,
    vandal: bool,
) -> Result<i64, OrderError> {
    common::effect(&run_id);
    let row = tx
        .query_one(
            "INSERT INTO orders (run_id, step_id, item, qty) VALUES ($1, 'v', 'v', 1) RETURNING id",
            &[&run_id],
        )
        .await?;
    if vandal {
        tx.execute("DELETE FROM idem_records", &[]).await?;
    }
    Ok(row.get(0))
}

#[tokio::test]
async fn a_completion_that_fails_takes_the_writes_with_it() {
    let Some(db) = Db::new().await else { return };
    let idem = db.idem().await;
    let scope = idem.scope("tenant-tx");
    let run = common::unique("run");
    let failed = scope
        .run(vandal_order(run.clone(), true))
        .await
        .expect_err("nothing to complete");
    assert!(
        matches!(failed, idem::Error::NotCommitted { .. }),
        "{failed:?}"
    );
    assert!(failed.body_ran());
    assert_eq!(db.rows(&run, "v").await, 0, "the insert rolled back");
    let retry = scope
        .run(vandal_order(run.clone(), false))
        .await
        .expect("retry");
    assert!(retry.is_fresh());
    assert_eq!(db.rows(&run, "v").await, 1);
    assert_eq!(
        common::effects(&run),
        2,
        "the body ran twice, its writes once"
    );
    db.drop().await;
}
