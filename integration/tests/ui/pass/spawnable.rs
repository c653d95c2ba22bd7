use idem::{Idem, idempotent};

#[idempotent(key = "run_id", mutating, name = "spawn.charge")]
async fn charge(run_id: String) -> Result<u64, String> {
    tokio::task::yield_now().await;
    Ok(1)
}

#[idempotent(natural)]
async fn set_status(entity: String, status: String) -> Result<String, String> {
    Ok(format!("{entity}: {status}"))
}

fn assert_send<T: Send + 'static>(_: &T) {}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let fut = idem.scope("t").run(charge("r".into()));
    assert_send(&fut);
    assert!(tokio::spawn(fut).await.unwrap().unwrap().is_fresh());
    assert!(set_status("e".into(), "active".into()).await.unwrap().is_fresh());
}
