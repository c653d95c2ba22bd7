use idem::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Declined;

#[idempotent(key = "run_id", mutating, on_error = "classify")]
async fn charge(run_id: String) -> Result<u64, Declined> {
    Err(Declined)
}

fn main() {}
