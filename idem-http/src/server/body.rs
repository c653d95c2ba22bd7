//! The bodies the layer passes on and answers with.

use bytes::Bytes;
use http_body_util::{Either, Full};

/// The boxed error of request bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of the requests the layer passes on: the original one (requests it does not guard),
/// or the buffered one.
pub type GuardedRequestBody<B> = Either<B, Full<Bytes>>;

/// The body of the responses the layer answers with: the handler's (requests it does not
/// guard), or a buffered one (guarded requests, replays, problems).
pub type GuardedResponseBody<B> = Either<B, Full<Bytes>>;
