//! An error type that does not classify itself, under `on_error = "classify"`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Declined;
#[idem::idempotent(key = "run_id", mutating, on_error = "classify")]
pub async fn g(run_id: String) -> Result<u64, Declined> {
    Err(Declined)
}
fn main() {}
