#![allow(unused_variables)]
// A transactional tool's claim commits with its writes: no lease, no orphan, nothing unknown.
use idem::idempotent;
use idem::store::postgres::tokio_postgres::Transaction;

async fn already_ordered(run_id: &String) -> Result<Option<u64>, String> {
    Ok(None)
}

#[idempotent(
    key = "run_id",
    mutating,
    transactional,
    check = already_ordered,
    lease = "10s",
    on_error = "unknown"
)]
async fn create_order(tx: &mut Transaction<'_>, run_id: String) -> Result<u64, String> {
    Ok(1)
}

fn main() {}
