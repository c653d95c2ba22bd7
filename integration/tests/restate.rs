//! Under a real Restate server (`restate-server` 1.7.12, started here on free loopback ports):
//! the `restate_payment` example's service, killed with SIGKILL at random moments of its
//! actions (before the charge, inside it after the effect, after it before `ctx.run` returns),
//! restarted each time, while Restate retries every invocation. The effect is a line in a ledger
//! file that is not idem's store. With idem every order is charged exactly once; through the
//! same service's handler without idem, Restate alone charges some orders twice.
//!
//! `IDEM_RESTATE_ORDERS` sets the number of orders per handler (default 100). Without a server
//! binary (and no npm to install one) the test is skipped, unless `IDEM_REQUIRE_BACKENDS=1`.

#[path = "common/examples.rs"]
mod examples;
#[path = "common/restate.rs"]
mod restate;

use std::collections::BTreeMap;
use std::path::Path;

use examples::{example, kills_by_point};
use idem::store::RecordStatus;

fn orders() -> usize {
    std::env::var("IDEM_RESTATE_ORDERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100)
}

/// How many times each line appears in the ledger.
fn ledger_counts(ledger: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in std::fs::read_to_string(ledger).unwrap_or_default().lines() {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    counts
}

/// Pays `n` orders named `PREFIX-i` through `handler`, 8 at a time; every call must succeed.
async fn pay_all(server: &restate::Restate, handler: &str, prefix: &str, n: usize) {
    let limit = tokio::sync::Semaphore::new(8);
    let limit = &limit;
    let calls = (0..n).map(|i| async move {
        let _permit = limit.acquire().await.unwrap();
        let order = format!("{prefix}-{i}");
        let body = serde_json::json!({"order_id": order, "amount_cents": 100 + i});
        let answer = server.call("Payments", handler, &body).await;
        let answer = answer.unwrap_or_else(|e| panic!("{order}: {e}"));
        assert!(answer.contains(&order), "{order}: {answer}");
    });
    join_all(calls).await;
}

/// Joins futures that borrow from this frame, polling them together.
async fn join_all<F: Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    std::future::poll_fn(move |cx| {
        pending.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if pending.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_is_charged_once_with_idem_and_some_twice_without_under_kills() {
    let server = match restate::Restate::start() {
        Ok(server) => server,
        Err(reason) if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") => {
            panic!("no Restate server, and IDEM_REQUIRE_BACKENDS=1 requires one: {reason}")
        }
        Err(reason) => {
            eprintln!("skipped: no Restate server: {reason}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let (ledger, crashes) = (dir.path().join("ledger.txt"), dir.path().join("crashes"));
    std::fs::create_dir_all(&crashes).unwrap();
    let store_url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let env = vec![
        ("IDEM_STORE_URL".to_owned(), store_url.clone()),
        ("LEDGER".to_owned(), ledger.display().to_string()),
        ("CRASH_DIR".to_owned(), crashes.display().to_string()),
        ("CRASH_PERCENT".to_owned(), "35".to_owned()),
    ];
    let service = restate::Service::start(&example("restate_payment"), env);
    server.register(service.port()).await.unwrap();
    let n = orders();

    // With idem.
    pay_all(&server, "pay", "idem", n).await;
    let with_idem_kills = service.restarts();
    let counts = ledger_counts(&ledger);
    let kills = kills_by_point(&crashes, "idem-");
    for i in 0..n {
        let order = format!("idem-{i}");
        let own: Vec<String> = std::fs::read_dir(&crashes)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(&format!("{order}.")))
            .collect();
        assert_eq!(
            counts.get(&order).copied().unwrap_or(0),
            1,
            "{order} must be charged exactly once (its kills: {own:?}; all: {kills:?})"
        );
    }
    for point in ["before", "inside", "after"] {
        assert!(
            kills.get(point).copied().unwrap_or(0) > 0,
            "no kill {point} the charge: the test proves nothing ({kills:?})"
        );
    }
    // Every record settled: none in flight, none unknown.
    let store = idem::store::admin::open(&store_url).await.unwrap();
    let page = store.scan(None, None, 10 * n).await.unwrap();
    assert_eq!(page.records.len(), n, "one record per order");
    assert!(
        page.records
            .iter()
            .all(|r| r.status == RecordStatus::Completed),
        "every record completed"
    );

    // Without idem: Restate alone runs an action again after a kill that followed the effect.
    pay_all(&server, "pay_bare", "bare", n).await;
    let bare_kills = service.restarts() - with_idem_kills;
    let counts = ledger_counts(&ledger);
    let bare = (0..n).map(|i| counts.get(&format!("bare-{i}")).copied().unwrap_or(0));
    let (lost, twice): (Vec<usize>, Vec<usize>) = bare.partition(|c| *c == 0);
    let duplicated = twice.iter().filter(|c| **c > 1).count();
    let extra: usize = twice.iter().map(|c| c - 1).sum();
    eprintln!(
        "restate kill test, {n} orders each: with idem {with_idem_kills} kills \
         ({kills:?}), 0 duplicates; without idem {bare_kills} kills, {duplicated} orders charged \
         more than once ({extra} extra charges), {} lost",
        lost.len()
    );
    assert!(lost.is_empty(), "Restate loses no order");
    assert!(
        duplicated > 0,
        "Restate alone charges again after a kill between the effect and its journal entry"
    );
}
