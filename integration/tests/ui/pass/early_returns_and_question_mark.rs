#![deny(warnings)]
use idem::{Idem, idempotent};

#[derive(Debug)]
struct AppError;

impl From<std::num::ParseIntError> for AppError {
    fn from(_: std::num::ParseIntError) -> Self {
        AppError
    }
}

/// The body keeps `?`, `return`, inner attributes and its own error conversions.
#[idempotent(key = "run_id", mutating, name = "body.parse")]
async fn parse(run_id: String, text: String) -> Result<u64, AppError> {
    #![allow(clippy::needless_return)]
    if text.is_empty() {
        return Err(AppError);
    }
    let n: u64 = text.parse()?;
    Ok(n)
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let t = idem.scope("t");
    assert!(t.run(parse("r".into(), "42".into())).await.unwrap().is_fresh());
    assert!(t.run(parse("s".into(), "x".into())).await.is_err());
}
