//! An error type that cannot be stored, under `on_error = "store"`.
#[derive(Debug)]
pub struct Declined;
#[idem::idempotent(key = "run_id", mutating, on_error = "store")]
pub async fn g(run_id: String) -> Result<u64, Declined> {
    Err(Declined)
}
fn main() {}
