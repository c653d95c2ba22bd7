#![allow(unused_variables)]
// A broken transactional tool is one error: callers do not pass the transaction, and the
// fallback keeps the signature they see, so the call site adds nothing.
use idem::store::postgres::tokio_postgres::Transaction;
use idem::{Idem, Outcome, idempotent};

#[idempotent(key = "run", mutating, transactional)]
async fn create_order(tx: &mut Transaction<'_>, run_id: String) -> Result<u64, String> {
    tx.execute("SELECT 1", &[]).await.map_err(|e| e.to_string())?;
    Ok(1)
}

async fn agent(idem: Idem) {
    let out: Outcome<u64> = idem.scope("t").run(create_order("r".into())).await.unwrap();
    let _ = out.is_replayed();
}

fn main() {}
