#![allow(unused_variables)]
// A natural tool records nothing: it cannot stream.
use idem::{Emitter, idempotent};

#[idempotent(natural)]
async fn echo(text: String, out: Emitter<String>) -> Result<u32, String> {
    Ok(0)
}

fn main() {}
