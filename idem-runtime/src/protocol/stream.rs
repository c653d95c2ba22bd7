//! A streaming tool's call: claim → run (each chunk recorded before it is read) → settle, or
//! replay the recorded chunks, or follow a stream still being produced.
//!
//! | the claim finds | the call answers | its [`Streamed`] |
//! |---|---|---|
//! | nothing (or an orphan to take over) | `Fresh` | runs the body; each batch of chunks is appended, fenced by the claim's token, then read; the body's end settles the key as any call's does |
//! | `completed` | `Replayed` | reads the chunks in pages, then the stored value or error |
//! | `in_flight` | `Replayed` | reads the chunks so far, then polls for more (from 1 ms, doubling to 25 ms while none come), until the record completes |
//! | another fingerprint, `unknown` | `Mismatch`, `Unknown` | (none) |
//!
//! A follower never mixes two holders' chunks: if the record it follows changes hands (its
//! holder died and another call took the key over), is released, or ends `unknown`, the stream
//! breaks off with [`Error::StreamInterrupted`]. A holder whose append is fenced out stops its
//! body and answers [`Error::LeaseLost`]; an append the store fails for the whole completion
//! window stops it with [`Error::StreamNotRecorded`]. Appends are tried again through store
//! errors as completions are (they are applied once however often they are sent).

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Instant;

use super::call::{Prepared, prepare, replay, settle};
use super::completion::{backoff, ceiling, may_pass};
use super::follower::{Followed, Follower};
use super::policy::ErrorHandling;
use super::{Claimed, Claiming, Intent, claim};
use crate::registry::ToolInfo;
use crate::runtime::Scope;
use crate::streamed::{Emitter, End, Ready, Streamed, give_way};
use crate::telemetry::Observation;
use crate::value::{Checked, CheckedRef, Replayable};
use idem_core::canonical::CanonicalError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::IdempotencyKey;
use idem_core::store::{ChunkAppend, Fenced};
use idem_core::{Error, Mismatch, Outcome, StoreError, Unknown};

use super::call::KeyParts;

/// The most chunks one append records, and the most bytes (at least one chunk goes): the body
/// goes on while an append is in flight, and what it emitted meanwhile goes in the next one.
const APPEND_CHUNKS: usize = 1024;
const APPEND_BYTES: usize = 1 << 20;

/// Runs a streaming tool (see the module docs): the answer comes once the claim is decided,
/// and its [`Streamed`] does the rest as it is read.
pub fn run_stream<T, V, E, H, B, F>(
    tool: &'static ToolInfo,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    body: B,
) -> impl Future<Output = Result<Outcome<Streamed<T, V, E>>, Error<E>>>
where
    T: Replayable + Send + 'static,
    V: Replayable + Send + 'static,
    E: ErrorHandling<H> + Send + 'static,
    H: 'static,
    B: FnOnce(Emitter<T>) -> F + Send + 'static,
    F: Future<Output = Result<V, E>> + Send + 'static,
{
    let prepared = prepare::<E>(tool, key, fingerprint);
    async move {
        let name = tool.name;
        let (scope, key, fingerprint) = match prepared? {
            Prepared::Keyed {
                scope,
                key,
                fingerprint,
            } => (scope, key, fingerprint),
            Prepared::Unprotected => {
                let scope = Scope::current().expect("prepared in a scope");
                let ready = Ready::default();
                let driver = unrecorded::<T, V, E, H, B, F>(scope, body, ready.clone());
                return Ok(Outcome::Unprotected(Streamed::new(ready, Box::pin(driver))));
            }
        };
        crate::current::note_call(name, key);
        let idem = scope.idem().clone();
        let tenant = scope.shared_tenant();
        let observed = Observation::start(tool, &tenant, key);
        let intent = Intent::of_tool(
            tool,
            &idem,
            tenant.clone(),
            key,
            fingerprint,
            tool.orphans(),
        );
        let result = match observed.within(claim(&idem, &intent)).await {
            Err(e) => Err(Error::Store(e)),
            Ok(Claiming::Acquired(claimed)) => {
                observed.span().record("token", claimed.token().get());
                let ready = Ready::default();
                let driver = produce::<T, V, E, H, B, F>(
                    name,
                    key,
                    scope,
                    claimed,
                    body,
                    ready.clone(),
                    idem.max_result_bytes(),
                );
                Ok(Outcome::Fresh(Streamed::new(ready, Box::pin(driver))))
            }
            Ok(Claiming::Completed(_) | Claiming::InFlight(_)) => {
                let ready = Ready::default();
                let follow = Follow {
                    name,
                    follower: Follower::new(idem, tenant, key, fingerprint),
                };
                let driver = follow.read::<T, V, E, H>(ready.clone());
                Ok(Outcome::Replayed(Streamed::new(ready, Box::pin(driver))))
            }
            Ok(Claiming::Mismatch) => Ok(Outcome::Mismatch(Mismatch::new(name, key.short_hash()))),
            Ok(Claiming::Unknown) => Ok(Outcome::Unknown(Unknown::new(name, key.short_hash()))),
        };
        observed.finish(&result);
        result
    }
}

/// The value of a call that ran or replayed (the only outcomes a settlement or a replay gives
/// with a value).
fn value_of<V>(outcome: Outcome<V>) -> V {
    outcome
        .into_value()
        .expect("a settled or replayed call has a value")
}

/// Runs the body of a claimed call: its chunks recorded as they come, then its end settled.
async fn produce<T, V, E, H, B, F>(
    name: &'static str,
    key: IdempotencyKey,
    scope: Scope,
    claimed: Claimed,
    body: B,
    ready: Ready<T>,
    limit: usize,
) -> End<V, E>
where
    T: Replayable,
    V: Replayable,
    E: ErrorHandling<H>,
    B: FnOnce(Emitter<T>) -> F,
    F: Future<Output = Result<V, E>>,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(Emitter::<T>::BUFFER);
    let user = scope.run(crate::current::run_as(
        name,
        key,
        claimed.lease_state().clone(),
        body(Emitter::new(sender)),
    ));
    let recording = claimed
        .hold(record(Some(&claimed), user, receiver, &ready))
        .await;
    match recording {
        Recording::Ended(result) => {
            settle::<Checked<V>, E, H>(name, key, claimed, result.map(Checked), limit)
                .await
                .map(|outcome| value_of(outcome).0)
        }
        Recording::Lost => Err(Error::LeaseLost {
            tool: name,
            key: key.short_hash(),
        }),
        Recording::NotRecorded { chunk, source } => Err(Error::StreamNotRecorded {
            tool: name,
            key: key.short_hash(),
            chunk,
            source,
        }),
        Recording::NotEncoded(source) => Err(Error::ResultNotStored {
            tool: name,
            key: key.short_hash(),
            source,
        }),
    }
}

/// Runs the body of a call without a key (its optional key omitted): nothing is recorded.
async fn unrecorded<T, V, E, H, B, F>(scope: Scope, body: B, ready: Ready<T>) -> End<V, E>
where
    T: Replayable,
    E: ErrorHandling<H>,
    B: FnOnce(Emitter<T>) -> F,
    F: Future<Output = Result<V, E>>,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(Emitter::<T>::BUFFER);
    let user = scope.run(body(Emitter::new(sender)));
    match record(None, user, receiver, &ready).await {
        Recording::Ended(result) => result.map_err(|error| Error::Tool {
            class: ErrorHandling::<H>::class(&error),
            error,
            replayed: false,
        }),
        Recording::Lost | Recording::NotRecorded { .. } | Recording::NotEncoded(_) => {
            unreachable!("nothing is recorded")
        }
    }
}

/// How the recording of a body's chunks ended.
enum Recording<O> {
    /// The body returned, every chunk it emitted recorded.
    Ended(O),
    /// An append was fenced out: another claim owns the key.
    Lost,
    /// The store failed to record chunk `chunk` for the whole completion window.
    NotRecorded { chunk: u64, source: StoreError },
    /// A chunk could not be encoded.
    NotEncoded(serde_json::Error),
}

/// Runs `user` and records what it emits on `receiver` under `claimed` (nothing without a
/// claim), making each batch ready once it is recorded. The body goes on while a batch is
/// being recorded, and is dropped when recording cannot go on.
async fn record<T, F>(
    claimed: Option<&Claimed>,
    user: F,
    mut receiver: tokio::sync::mpsc::Receiver<T>,
    ready: &Ready<T>,
) -> Recording<F::Output>
where
    T: Replayable,
    F: Future,
{
    let mut user = pin!(user);
    let mut output = None;
    let mut recorded: u64 = 0;
    let encode = claimed.is_some();
    loop {
        // What the body emitted (encoded, when recorded), or its end.
        let mut batch = Vec::new();
        let mut encoded: Vec<Vec<u8>> = Vec::new();
        let mut bytes = 0;
        let mut not_encoded = None;
        let mut take = |chunk: T, batch: &mut Vec<T>| {
            if encode {
                match serde_json::to_vec(&CheckedRef(&chunk)) {
                    Ok(e) => {
                        bytes += e.len();
                        encoded.push(e);
                    }
                    Err(e) => not_encoded = Some(e),
                }
            }
            batch.push(chunk);
            batch.len() < APPEND_CHUNKS && bytes < APPEND_BYTES
        };
        std::future::poll_fn(|cx| {
            if output.is_none()
                && let Poll::Ready(out) = user.as_mut().poll(cx)
            {
                output = Some(out);
            }
            // `try_recv` takes what is there, whatever tokio's budget for the task (which
            // makes `poll_recv` answer `Pending` with chunks waiting): once the body ended,
            // an empty channel is the end of its chunks.
            let mut room = true;
            while room {
                match receiver.try_recv() {
                    Ok(chunk) => room = take(chunk, &mut batch),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() || output.is_some() {
                return Poll::Ready(());
            }
            // Nothing yet: wait for a chunk, or the body's end (its waker is set above).
            match receiver.poll_recv(cx) {
                Poll::Ready(Some(chunk)) => {
                    take(chunk, &mut batch);
                    Poll::Ready(())
                }
                Poll::Ready(None) | Poll::Pending => Poll::Pending,
            }
        })
        .await;
        if let Some(e) = not_encoded {
            return Recording::NotEncoded(e);
        }
        if batch.is_empty() {
            return Recording::Ended(output.expect("the body ended"));
        }
        if let Some(claimed) = claimed {
            let mut append = pin!(claimed.append_retrying(recorded, &encoded));
            let answer = std::future::poll_fn(|cx| {
                if output.is_none()
                    && let Poll::Ready(out) = user.as_mut().poll(cx)
                {
                    output = Some(out);
                }
                append.as_mut().poll(cx)
            })
            .await;
            match answer {
                Ok(Fenced::Applied) => {}
                Ok(Fenced::Lost) => return Recording::Lost,
                Err(source) => {
                    return Recording::NotRecorded {
                        chunk: recorded,
                        source,
                    };
                }
            }
        }
        recorded += batch.len() as u64;
        ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(batch);
        give_way().await;
    }
}

impl Claimed {
    /// Appends `chunks` to this claim's stream at position `first` (how many this claim
    /// appended before), fenced by the claim's token: one attempt, then more through store
    /// errors that may pass, for the completion window (see `completion.rs`). An append sent
    /// again is applied once. [`Fenced::Lost`]: another claim owns the key, and nothing was
    /// appended.
    pub async fn append_retrying(
        &self,
        first: u64,
        chunks: &[Vec<u8>],
    ) -> Result<Fenced, StoreError> {
        let append = || {
            self.idem.store().append_chunks(ChunkAppend {
                tenant: &self.tenant,
                key: self.key,
                token: self.token,
                first,
                chunks,
            })
        };
        let mut error = match append().await {
            Err(e) if may_pass(&e) => e,
            answer => return answer,
        };
        let window = self.idem.completion_retry(self.lease);
        let deadline = Instant::now() + window;
        let ceiling = ceiling(window);
        let mut retry = 0;
        loop {
            let wait = backoff(retry, ceiling);
            if Instant::now() + wait >= deadline {
                return Err(error);
            }
            crate::timer::sleep(wait).await;
            retry += 1;
            error = match append().await {
                Err(e) if may_pass(&e) => e,
                answer => return answer,
            };
        }
    }
}

/// A call that reads the chunks another call recorded.
struct Follow {
    name: &'static str,
    follower: Follower,
}

impl Follow {
    fn interrupted<E>(&self, received: u64) -> Error<E> {
        Error::StreamInterrupted {
            tool: self.name,
            key: self.follower.key().short_hash(),
            received,
        }
    }

    /// Reads the chunks from the first, making each page ready as it is decoded; answers the
    /// stored end once the record is completed and every chunk was read.
    async fn read<T, V, E, H>(mut self, ready: Ready<T>) -> End<V, E>
    where
        T: Replayable,
        V: Replayable,
        E: ErrorHandling<H>,
    {
        let key = self.follower.key();
        loop {
            match self.follower.next().await.map_err(Error::Store)? {
                Followed::Chunks(chunks) => {
                    let decoded: Result<Vec<T>, _> = chunks
                        .iter()
                        .map(|bytes| serde_json::from_slice::<Checked<T>>(bytes).map(|c| c.0))
                        .collect();
                    let decoded = decoded.map_err(|source| Error::StoredResultUnreadable {
                        tool: self.name,
                        key: key.short_hash(),
                        source,
                    })?;
                    ready
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(decoded);
                    give_way().await;
                }
                Followed::Completed(result) => {
                    return replay::<Checked<V>, E, H>(self.name, key, &result)
                        .map(|outcome| value_of(outcome).0);
                }
                Followed::Interrupted { received } => return Err(self.interrupted(received)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::run_stream;
    use crate::protocol::call::KeyParts;
    use crate::protocol::policy::{ReleaseErrors, StoreErrors};
    use crate::registry::ToolInfo;
    use crate::runtime::Idem;
    use crate::streamed::{Emitter, Streamed};
    use idem_core::fingerprint::Fingerprint;
    use idem_core::key::KeyPart;
    use idem_core::store::memory::MemoryStore;
    use idem_core::{Error, Outcome};

    static TOOL: ToolInfo = ToolInfo::new("stream.test", "draft", "m", "f.rs", 1)
        .stable_name()
        .key(&["run"], true);

    fn key(run: &str) -> KeyParts {
        KeyParts::new().part("run", KeyPart::new(run).map(Some))
    }

    type Call = Result<Outcome<Streamed<String, usize, String>>, Error<String>>;

    /// A call of a tool that emits `count` chunks (`chunk-0`, …) and answers how many, after
    /// `gate` (if any) lets it past chunk `stop`; `ran` counts its runs.
    async fn draft<H: 'static>(
        run: &str,
        count: usize,
        ran: &Arc<AtomicUsize>,
        gate: Option<(usize, Arc<tokio::sync::Notify>)>,
        fail: bool,
    ) -> Call
    where
        String: crate::protocol::policy::ErrorHandling<H>,
    {
        let ran = ran.clone();
        let body = move |out: Emitter<String>| async move {
            ran.fetch_add(1, Ordering::SeqCst);
            for i in 0..count {
                if let Some((stop, gate)) = &gate
                    && i == *stop
                {
                    gate.notified().await;
                }
                out.emit(format!("chunk-{i}")).await;
            }
            if fail {
                return Err("the model refused".to_owned());
            }
            Ok(count)
        };
        let fingerprint = Ok(Fingerprint::from_bytes([1; 32]));
        run_stream::<String, usize, String, H, _, _>(&TOOL, key(run), fingerprint, body).await
    }

    fn chunks(range: std::ops::Range<usize>) -> Vec<String> {
        range.map(|i| format!("chunk-{i}")).collect()
    }

    /// Whether `got` is `chunk-0`, `chunk-1`, … `chunk-{n - 1}`; else where it goes wrong.
    #[track_caller]
    fn assert_in_order(got: &[String], n: usize) {
        let wrong = got
            .iter()
            .enumerate()
            .find(|(i, chunk)| **chunk != format!("chunk-{i}"));
        assert!(
            wrong.is_none() && got.len() == n,
            "{} chunks, want {n}; first out of place: {wrong:?}",
            got.len()
        );
    }

    #[tokio::test]
    async fn a_stream_runs_once_and_replays_the_same_chunks_then_its_end() {
        let idem = Idem::with_store(MemoryStore::new());
        let ran = Arc::new(AtomicUsize::new(0));
        idem.scope("t")
            .run(async {
                let Ok(Outcome::Fresh(first)) =
                    draft::<ReleaseErrors>("r", 1000, &ran, None, false).await
                else {
                    panic!("the first call runs");
                };
                let (got, end) = first.collect().await.unwrap();
                assert_in_order(&got, 1000);
                assert_eq!(end, 1000);
                let Ok(Outcome::Replayed(again)) =
                    draft::<ReleaseErrors>("r", 1000, &ran, None, false).await
                else {
                    panic!("a retry replays");
                };
                let (got, end) = again.collect().await.unwrap();
                assert_in_order(&got, 1000);
                assert_eq!(end, 1000);
            })
            .await;
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the body ran once");
    }

    #[tokio::test]
    async fn a_retry_during_the_stream_follows_it_to_its_end() {
        let idem = Idem::with_store(MemoryStore::new());
        let ran = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let tenant = idem.scope("t");
        let Ok(Outcome::Fresh(mut first)) = tenant
            .run(draft::<ReleaseErrors>(
                "r",
                1000,
                &ran,
                Some((500, gate.clone())),
                false,
            ))
            .await
        else {
            panic!("the first call runs");
        };
        let mut got = Vec::new();
        while got.len() < 500 {
            got.push(
                first
                    .next_chunk()
                    .await
                    .expect("500 chunks before the gate"),
            );
        }
        let Ok(Outcome::Replayed(mut follower)) = tenant
            .run(draft::<ReleaseErrors>("r", 1000, &ran, None, false))
            .await
        else {
            panic!("a retry during the stream follows it");
        };
        let producer = tokio::spawn(async move {
            let mut rest = Vec::new();
            while let Some(chunk) = first.next_chunk().await {
                rest.push(chunk);
            }
            (rest, first.finish().await)
        });
        let mut followed = Vec::new();
        while followed.len() < 500 {
            followed.push(follower.next_chunk().await.expect("the prefix"));
        }
        gate.notify_one();
        let (followed_rest, end) = follower.collect().await.unwrap();
        followed.extend(followed_rest);
        assert_eq!(end, 1000);
        assert_in_order(&followed, 1000);
        let (rest, first_end) = producer.await.unwrap();
        got.extend(rest);
        assert_in_order(&got, 1000);
        assert_eq!(first_end.unwrap(), 1000);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_released_error_frees_the_key_and_a_stored_one_replays_after_the_chunks() {
        let idem = Idem::with_store(MemoryStore::new());
        let ran = Arc::new(AtomicUsize::new(0));
        idem.scope("t")
            .run(async {
                let Ok(Outcome::Fresh(first)) =
                    draft::<ReleaseErrors>("released", 3, &ran, None, true).await
                else {
                    panic!("runs");
                };
                let err = first.collect().await.unwrap_err();
                assert_eq!(
                    err.tool_error().map(String::as_str),
                    Some("the model refused")
                );
                let Ok(Outcome::Fresh(again)) =
                    draft::<ReleaseErrors>("released", 3, &ran, None, false).await
                else {
                    panic!("a released key runs again");
                };
                assert_eq!(again.collect().await.unwrap(), (chunks(0..3), 3));

                let Ok(Outcome::Fresh(stored)) =
                    draft::<StoreErrors>("stored", 3, &ran, None, true).await
                else {
                    panic!("runs");
                };
                assert!(stored.collect().await.is_err());
                let Ok(Outcome::Replayed(mut replay)) =
                    draft::<StoreErrors>("stored", 3, &ran, None, true).await
                else {
                    panic!("a stored error replays");
                };
                let mut got = Vec::new();
                while let Some(chunk) = replay.next_chunk().await {
                    got.push(chunk);
                }
                assert_eq!(got, chunks(0..3), "the chunks, then the error");
                match replay.finish().await {
                    Err(Error::Tool {
                        error,
                        replayed: true,
                        ..
                    }) => assert_eq!(error, "the model refused"),
                    other => panic!("the stored error: {other:?}"),
                }
            })
            .await;
        assert_eq!(ran.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_holder_that_lost_its_claim_records_nothing_more_and_is_stopped() {
        let idem = Idem::builder()
            .lease(std::time::Duration::from_millis(30))
            .renew_leases(false)
            .build(MemoryStore::new());
        let ran = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let tenant = idem.scope("t");
        let Ok(Outcome::Fresh(mut zombie)) = tenant
            .run(draft::<ReleaseErrors>(
                "r",
                10,
                &ran,
                Some((3, gate.clone())),
                false,
            ))
            .await
        else {
            panic!("the first call runs");
        };
        for _ in 0..3 {
            zombie.next_chunk().await.expect("recorded before the gate");
        }
        // Its lease lapses (nothing renews it): another call takes the key over and streams.
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        let Ok(Outcome::Fresh(holder)) = tenant
            .run(draft::<ReleaseErrors>("r", 10, &ran, None, false))
            .await
        else {
            panic!("a lapsed claim is taken over");
        };
        let (got, end) = holder.collect().await.unwrap();
        assert_in_order(&got, 10);
        assert_eq!(end, 10);
        gate.notify_one();
        let mut more = 0;
        while zombie.next_chunk().await.is_some() {
            more += 1;
        }
        assert_eq!(more, 0, "the zombie's next append was fenced out");
        assert!(
            matches!(zombie.finish().await, Err(Error::LeaseLost { .. })),
            "and its body was stopped"
        );
        let Ok(Outcome::Replayed(replay)) = tenant
            .run(draft::<ReleaseErrors>("r", 10, &ran, None, false))
            .await
        else {
            panic!("replays");
        };
        let (replayed, _) = replay.collect().await.unwrap();
        assert_eq!(replayed, got, "the new holder's stream, alone");
    }

    #[tokio::test]
    async fn a_call_without_its_optional_key_streams_unrecorded() {
        static OPTIONAL: ToolInfo = ToolInfo::new("stream.optional", "draft", "m", "f.rs", 2)
            .stable_name()
            .key(&["run"], false);
        let idem = Idem::with_store(MemoryStore::new());
        let body = |out: Emitter<String>| async move {
            for n in 0..300 {
                out.emit(format!("chunk-{n}")).await;
            }
            Ok::<usize, String>(300)
        };
        let key = KeyParts::new().part("run", Ok(None));
        let fingerprint = Ok(Fingerprint::from_bytes([1; 32]));
        // As the attribute's code does: the call is made inside the scope.
        let call = idem.scope("t").run(async {
            let call = run_stream::<String, usize, String, ReleaseErrors, _, _>(
                &OPTIONAL,
                key,
                fingerprint,
                body,
            );
            call.await
        });
        let Ok(Outcome::Unprotected(stream)) = call.await else {
            panic!("no key: the call runs unprotected");
        };
        let (got, end) = stream.collect().await.unwrap();
        assert_in_order(&got, 300);
        assert_eq!(end, 300);
    }
}
