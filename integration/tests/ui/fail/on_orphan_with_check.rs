use idem::idempotent;

async fn already_charged(_run_id: &String) -> Result<Option<u64>, String> {
    Ok(None)
}

#[idempotent(key = "run_id", mutating, check = already_charged, on_orphan = "unknown")]
async fn charge(run_id: String) -> Result<u64, String> {
    Ok(run_id.len() as u64)
}

fn main() {}
