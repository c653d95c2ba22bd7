use idem::{Idem, Outcome, idempotent};
use serde::Serialize;

#[derive(Clone, Serialize)]
struct Mail {
    id: u32,
    subject: String,
    queued_at: u64,
}

/// A batch tool: a key per item (`mails[].id`), a fingerprint per item (the other arguments
/// with that item, `skip` applied to it), one result per item run.
#[idempotent(key = "run_id, mails[].id", mutating, skip = "mails.queued_at")]
async fn send_all(run_id: String, mut mails: Vec<Mail>) -> Vec<Result<u32, String>> {
    mails.sort_by_key(|m| m.id);
    mails.into_iter().map(|m| Ok(m.id * 10)).collect()
}

/// The items themselves as the key part, from the durable run's ids.
#[idempotent(key = "run_id, step_id, ids[]", mutating)]
async fn touch_all(ids: Vec<String>) -> Vec<Result<usize, std::io::Error>> {
    ids.iter().map(|id| Ok(id.len())).collect()
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let t = idem.scope("t");
    let mail = |id, queued_at| Mail { id, subject: "hi".into(), queued_at };
    let first = t.run(send_all("r".into(), vec![mail(1, 1), mail(2, 1)])).await.unwrap();
    assert_eq!(first.ran(), 2);
    let again = t
        .run(send_all("r".into(), vec![mail(2, 9), mail(3, 9), mail(1, 9)]))
        .await
        .unwrap();
    let answers: Vec<_> = again.into_iter().map(|a| a.unwrap()).collect();
    assert!(matches!(answers[0], Outcome::Replayed(20)));
    assert!(matches!(answers[1], Outcome::Fresh(30)));
    assert!(matches!(answers[2], Outcome::Replayed(10)));
    let run = idem::run::Run::new("run-1").unwrap();
    let step = run.step("touch", touch_all(vec!["a".into(), "bb".into()])).unwrap();
    let touched = t.run(step).await.unwrap();
    assert_eq!(touched.ran(), 2);
}
