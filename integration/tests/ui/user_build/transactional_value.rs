//! A value that cannot be stored, of a transactional tool.
use idem::store::postgres::tokio_postgres::Transaction;
pub struct R;
#[idem::idempotent(key = "run_id", mutating, transactional)]
pub async fn f(tx: &mut Transaction<'_>, run_id: String) -> Result<R, String> {
    let _ = tx;
    Ok(R)
}
fn main() {}
