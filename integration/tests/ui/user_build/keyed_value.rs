//! The value of a keyed tool that cannot be stored: one error, at the user's type, naming none
//! of idem's machinery.
pub struct R;

#[idem::idempotent(key = "run_id", mutating)]
pub async fn f(run_id: String) -> Result<R, String> {
    Ok(R)
}

fn main() {}
