#![allow(unused_variables)]
// A stream's chunks are kept for replay, as its value is.
use idem::{Emitter, idempotent};

struct Token(u32);

#[idempotent(key = "run_id", mutating)]
async fn draft(run_id: String, out: Emitter<Token>) -> Result<u32, String> {
    out.emit(Token(1)).await;
    Ok(0)
}

fn main() {}
