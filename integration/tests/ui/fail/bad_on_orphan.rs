use idem::idempotent;

#[idempotent(key = "run_id", mutating, on_orphan = "retry")]
async fn charge(run_id: String) -> Result<u64, String> {
    Ok(run_id.len() as u64)
}

fn main() {}
