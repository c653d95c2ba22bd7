//! A value that cannot be stored, of a tool with a state check.
pub struct S;
async fn seen(_run_id: &str) -> Result<Option<S>, String> { Ok(None) }
#[idem::idempotent(key = "run_id", mutating, check = seen)]
pub async fn g(run_id: String) -> Result<S, String> {
    Ok(S)
}
fn main() {}
