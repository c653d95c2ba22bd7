use idem::{Emitter, Idem, Outcome, idempotent};

/// A streaming tool: its emitter is filled in by idem (callers never pass it), and is neither
/// a key part nor fingerprinted; its chunks and its value are kept for replay.
#[idempotent(key = "run_id, step_id", mutating, name = "docs.draft")]
async fn draft(run_id: String, step_id: u32, topic: String, out: Emitter<String>) -> Result<usize, String> {
    if topic.is_empty() {
        return Err("no topic".into());
    }
    for word in topic.split(' ') {
        out.emit(word.to_owned()).await;
    }
    Ok(topic.len())
}

/// The emitter anywhere in the signature, a result alias, and `on_error = "store"`.
type Drafted = Result<u32, std::io::Error>;

#[idempotent(key = "run_id", mutating, on_error = "unknown")]
async fn count(out: Emitter<u32>, run_id: String) -> Drafted {
    out.emit(1).await;
    Ok(1)
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let t = idem.scope("t");
    let Outcome::Fresh(first) = t.run(draft("r".into(), 1, "a b c".into())).await.unwrap() else {
        panic!("runs");
    };
    let (words, len): (Vec<String>, usize) = first.collect().await.unwrap();
    assert_eq!((words.len(), len), (3, 5));
    let Outcome::Replayed(again) = t.run(draft("r".into(), 1, "a b c".into())).await.unwrap() else {
        panic!("replays");
    };
    assert_eq!(again.collect().await.unwrap(), (words, 5));
    // The stream is spawnable: Send and 'static.
    let Outcome::Fresh(counted) = t.run(count("r".into())).await.unwrap() else {
        panic!("runs");
    };
    let counted = tokio::spawn(counted.finish()).await.unwrap();
    assert_eq!(counted.unwrap(), 1);
}
