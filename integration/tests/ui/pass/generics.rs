use idem::{Idem, idempotent};
use serde::Serialize;
use std::fmt::Debug;

#[idempotent(key = "order_id", mutating, name = "generic.ship")]
async fn ship<T, A>(order_id: u64, item: T, address: A) -> Result<String, String>
where
    T: Serialize + Debug + Send,
    A: Serialize + Send,
{
    Ok(format!("{order_id}: {item:?}"))
}

#[idempotent(key = "order_id", mutating, name = "generic.note")]
async fn note<'a>(order_id: &'a str, text: &'a str, tags: impl Serialize) -> Result<usize, String> {
    Ok(text.len())
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let t = idem.scope("t");
    assert!(t.run(ship(7, vec![1, 2], "street")).await.unwrap().is_fresh());
    assert!(t.run(ship(7, vec![1, 2], "street")).await.unwrap().is_replayed());
    assert!(t.run(note("o-1", "hello", ["a"])).await.unwrap().is_fresh());
}
