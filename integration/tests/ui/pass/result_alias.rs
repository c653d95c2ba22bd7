use idem::{Idem, idempotent};

type ToolResult<T> = Result<T, std::io::Error>;

#[idempotent(key = "run_id", mutating, name = "alias.io")]
async fn write(run_id: String) -> ToolResult<u64> {
    Ok(1)
}

#[idempotent(key = "run_id", mutating, name = "alias.std")]
async fn full_path(run_id: String) -> std::result::Result<u64, String> {
    Ok(2)
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let out: Result<idem::Outcome<u64>, idem::Error<std::io::Error>> = idem.scope("t").run(write("r".into())).await;
    assert!(out.unwrap().is_fresh());
    assert!(idem.scope("t").run(full_path("r".into())).await.unwrap().is_fresh());
}
