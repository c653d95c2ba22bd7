use idem::idempotent;

// `step_id` comes from the durable run, and step ids repeat from run to run.
#[idempotent(key = "step_id", mutating)]
async fn charge(amount_cents: u64) -> Result<u64, String> {
    Ok(amount_cents)
}

fn main() {}
