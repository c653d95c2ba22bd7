//! A return type that is not a `Result`.
#[idem::idempotent(key = "run_id", mutating)]
pub async fn g(run_id: String) -> u64 {
    1
}
fn main() {}
