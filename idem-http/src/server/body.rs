//! The bodies the layer passes on and answers with.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};

/// The boxed error of request bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of the requests the layer passes on: the original one (requests it does not guard),
/// or the buffered one.
pub type GuardedRequestBody<B> = Either<B, Full<Bytes>>;

/// The body of the responses the layer answers with: the handler's (requests it does not
/// guard), or the layer's own ([`AnswerBody`]: guarded requests, replays, problems).
pub type GuardedResponseBody<B> = Either<B, AnswerBody>;

/// Where the task that runs a handler sends the response to answer.
pub(super) type Answer = tokio::sync::oneshot::Sender<Response<AnswerBody>>;

/// How many frames of a streamed answer wait for a slow client before the recording waits
/// for it too.
pub(super) const STREAM_BUFFER: usize = 64;

/// The body of a response the layer answers itself: whole (a response recorded whole, its
/// replay, a problem), or streamed (a response recorded frame by frame as it is sent, or
/// replayed or followed from its record). A streamed body that breaks off (its handler's body
/// failed, its record was taken over, its store failed) ends with an error, so that the server
/// cuts the response short rather than end it as if it were complete.
#[derive(Debug)]
pub struct AnswerBody {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Whole(Full<Bytes>),
    Streamed(tokio::sync::mpsc::Receiver<Result<Bytes, BoxError>>),
}

impl AnswerBody {
    /// A body of these bytes.
    pub(super) fn whole(bytes: Bytes) -> Self {
        AnswerBody {
            kind: Kind::Whole(Full::new(bytes)),
        }
    }

    /// A body whose frames come from `frames`, and end when it closes.
    pub(super) fn streamed(frames: tokio::sync::mpsc::Receiver<Result<Bytes, BoxError>>) -> Self {
        AnswerBody {
            kind: Kind::Streamed(frames),
        }
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Whole(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            Kind::Streamed(frames) => frames
                .poll_recv(cx)
                .map(|frame| frame.map(|data| data.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Whole(full) => full.is_end_stream(),
            Kind::Streamed(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Whole(full) => full.size_hint(),
            Kind::Streamed(_) => SizeHint::default(),
        }
    }
}
