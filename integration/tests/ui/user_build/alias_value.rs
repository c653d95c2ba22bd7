//! A value behind an alias of `Result` that cannot be stored.
pub struct R;
type Out<T> = Result<T, String>;
#[idem::idempotent(key = "run_id", mutating)]
pub async fn g(run_id: String) -> Out<R> {
    Ok(R)
}
fn main() {}
