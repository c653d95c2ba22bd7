//! Streamed responses: recorded as the key's stream while they are sent (its head, then each
//! batch of data frames before the client gets them), replayed from it, and followed by a
//! retry while they are still being sent.

use std::pin::pin;
use std::task::Poll;

use bytes::Bytes;
use http::Response;
use http::header;
use http_body::Body;

use super::body::{Answer, AnswerBody, BoxError, STREAM_BUFFER};
use super::config::Config;
use super::problem::Problem;
use super::stored::{STREAMED, decode_response, encode_response, replayed, unknown};
use idem_core::StoreErrorKind;
use idem_core::store::{ChunkRead, Fenced, RecordStatus};
use idem_runtime::protocol::{Claimed, Followed, Follower, Intent};

impl Config {
    /// A follower of the stream recorded under `intent`'s key.
    pub(super) fn follower(&self, intent: &Intent) -> Follower {
        Follower::new(
            self.idem.clone(),
            intent.tenant.clone(),
            intent.key,
            intent.fingerprint,
        )
    }

    /// The response of a request whose key is held by a response being streamed: its head,
    /// and its frames as they are recorded. `None` when the holder has not streamed (it is
    /// still running its handler, or its response is not a stream).
    pub(super) async fn attach(&self, intent: &Intent) -> Option<Response<AnswerBody>> {
        let probe = self
            .idem
            .store()
            .read_chunks(ChunkRead {
                tenant: &intent.tenant,
                key: intent.key,
                from: 0,
                limit: 1,
            })
            .await;
        // A store that records no streams, or fails now: the caller answers as it would have.
        let page = probe.ok().flatten()?;
        if page.chunks.is_empty() || page.record.fingerprint != intent.fingerprint {
            return None;
        }
        match self.follow(self.follower(intent)).await {
            Ok(response) => response,
            Err(response) => Some(response),
        }
    }

    /// Follows a recorded stream: its head now, its frames as the answer's body (from a task
    /// of its own, which stops when the client hangs up). `Ok(None)`: the stream broke off
    /// before its head was read (its record was deleted, or taken over); `Err`: the problem to
    /// answer.
    pub(super) async fn follow(
        &self,
        mut follower: Follower,
    ) -> Result<Option<Response<AnswerBody>>, Response<AnswerBody>> {
        let unreadable = || {
            self.own_problem(
                Problem::StoredResponseUnreadable,
                "the stored response of this key is damaged".to_owned(),
            )
        };
        let mut chunks = match follower.next().await {
            Ok(Followed::Chunks(chunks)) => chunks.into_iter(),
            Ok(Followed::Completed(_)) => return Err(unreadable()),
            Ok(Followed::Interrupted { .. }) => return Ok(None),
            Err(e) => {
                return Err(self.own_problem(
                    Problem::StoreUnavailable,
                    format!("{e}; retry it with the same key"),
                ));
            }
        };
        let head = chunks.next().expect("a page of chunks holds one");
        let Some(response) = decode_response(head) else {
            return Err(unreadable());
        };
        let (frames, body) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        tokio::spawn(async move {
            let mut page = chunks;
            loop {
                for chunk in page {
                    if frames.send(Ok(Bytes::from(chunk))).await.is_err() {
                        return; // The client hung up.
                    }
                }
                page = match follower.next().await {
                    Ok(Followed::Chunks(chunks)) => chunks.into_iter(),
                    Ok(Followed::Completed(_)) => return,
                    Ok(Followed::Interrupted { received }) => {
                        let broke = format!(
                            "the response broke off after {} frames: the request that \
                             produced it stopped before its end",
                            received.saturating_sub(1)
                        );
                        let _ = frames.send(Err(BoxError::from(broke))).await;
                        return;
                    }
                    Err(e) => {
                        let _ = frames.send(Err(BoxError::from(e))).await;
                        return;
                    }
                };
            }
        });
        Ok(Some(replayed(response.map(|_| AnswerBody::streamed(body)))))
    }

    /// Records a streamed response as it is sent: its head (status and selected headers) as
    /// chunk 0 of the key's stream, each batch of frames after it before the client gets
    /// them, then the key completed as a stream. A response whose status says nothing
    /// happened is passed on unrecorded, its key released; a store that records no streams
    /// gets the response whole.
    pub(super) async fn record_stream<ResB>(
        &self,
        claimed: Claimed,
        parts: http::response::Parts,
        body: ResB,
        answer: Answer,
    ) where
        ResB: Body<Data = Bytes>,
        ResB::Error: Into<BoxError>,
    {
        let (frames, streamed) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        if !(self.stores)(parts.status) {
            let _ = claimed.release().await;
            let _ = answer.send(Response::from_parts(parts, AnswerBody::streamed(streamed)));
            pump(None, body, frames).await;
            return;
        }
        let head = encode_response(parts.status, &parts.headers, &self.replay_headers, &[]);
        let headed = claimed.hold(claimed.append_retrying(0, &[head])).await;
        match headed {
            Ok(Fenced::Applied) => {}
            Err(e) if e.kind() == StoreErrorKind::Unsupported => {
                return self.record_whole(claimed, parts, body, answer).await;
            }
            Ok(Fenced::Lost) | Err(_) => {
                // The key was taken over, or the store failed for the whole completion
                // window: nothing of this response can be recorded, and it is not sent
                // unrecorded. The handler ran: its key is blocked as unknown.
                unknown(&claimed).await;
                let _ = answer.send(
                    self.own_problem(
                        Problem::ServiceFailed,
                        "the streamed response could not be recorded; whether the request took \
                         effect is unknown, and its key is blocked"
                            .to_owned(),
                    ),
                );
                return;
            }
        }
        let _ = answer.send(Response::from_parts(parts, AnswerBody::streamed(streamed)));
        match claimed.hold(pump(Some(&claimed), body, frames)).await {
            Pumped::Ended => {
                let _ = claimed
                    .complete_retrying(RecordStatus::Completed, STREAMED)
                    .await;
            }
            // The handler ran and its body broke off: its outcome is unknown.
            Pumped::BodyFailed => unknown(&claimed).await,
            // Another claim owns the key, or the store failed for the whole completion window
            // (the key is blocked as unknown once its lease lapses).
            Pumped::NotRecorded => {}
        }
    }
}

/// The most frames one append records, and the most bytes (at least one frame goes).
const APPEND_FRAMES: usize = 256;
const APPEND_BYTES: usize = 1 << 20;

/// Whether a response is streamed: its type is `text/event-stream`, or its body's length is
/// not known before it is sent (a chunked body).
pub(super) fn is_streamed<B: Body>(parts: &http::response::Parts, body: &B) -> bool {
    let event_stream = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"));
    event_stream || body.size_hint().exact().is_none()
}

/// How a [`pump`] ended.
pub(super) enum Pumped {
    /// The body ended, every frame recorded (when there is a claim).
    Ended,
    /// The body failed.
    BodyFailed,
    /// An append was fenced out, or failed for the whole completion window.
    NotRecorded,
}

/// Passes `body`'s data frames on to `frames`, each batch first appended to `claimed`'s stream
/// (after its head) when there is a claim; answers how it ended. A client that hangs up stops nothing: the rest is recorded for its retry. A
/// body that fails, an append fenced out or failed for good, ends `frames` with an error and
/// stops reading the body.
async fn pump<B>(
    claimed: Option<&Claimed>,
    body: B,
    frames: tokio::sync::mpsc::Sender<Result<Bytes, BoxError>>,
) -> Pumped
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    let mut client = Some(frames);
    let mut recorded: u64 = 1;
    loop {
        let mut batch: Vec<Bytes> = Vec::new();
        let mut bytes = 0;
        let mut end: Option<Result<(), BoxError>> = None;
        // The frames the body has ready (waiting for one), up to an append's worth.
        std::future::poll_fn(|cx| {
            while batch.len() < APPEND_FRAMES && bytes < APPEND_BYTES {
                match body.as_mut().poll_frame(cx) {
                    Poll::Ready(None) => end = Some(Ok(())),
                    Poll::Ready(Some(Err(e))) => end = Some(Err(e.into())),
                    Poll::Ready(Some(Ok(frame))) => {
                        // Trailers are not recorded (see the guide's limits).
                        if let Ok(data) = frame.into_data()
                            && !data.is_empty()
                        {
                            bytes += data.len();
                            batch.push(data);
                        }
                        continue;
                    }
                    Poll::Pending if batch.is_empty() => return Poll::Pending,
                    Poll::Pending => {}
                }
                break;
            }
            Poll::Ready(())
        })
        .await;
        let mut broke: Option<BoxError> = None;
        if let (Some(claimed), false) = (claimed, batch.is_empty()) {
            let chunks: Vec<Vec<u8>> = batch.iter().map(|data| data.to_vec()).collect();
            match claimed.append_retrying(recorded, &chunks).await {
                Ok(Fenced::Applied) => recorded += chunks.len() as u64,
                Ok(Fenced::Lost) => {
                    broke = Some("the request's key was taken over by another request".into());
                    batch.clear();
                }
                Err(e) => {
                    broke = Some(BoxError::from(e));
                    batch.clear();
                }
            }
        }
        for data in batch {
            if let Some(to) = &client
                && to.send(Ok(data)).await.is_err()
            {
                client = None;
            }
        }
        let (broke, pumped) = match (broke, end) {
            (Some(broke), _) => (broke, Pumped::NotRecorded),
            (None, Some(Err(broke))) => (broke, Pumped::BodyFailed),
            (None, Some(Ok(()))) => return Pumped::Ended,
            (None, None) => continue,
        };
        if let Some(to) = client {
            let _ = to.send(Err(broke)).await;
        }
        return pumped;
    }
}
