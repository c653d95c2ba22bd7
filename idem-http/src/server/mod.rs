//! The server side: a tower [`Layer`](tower_layer::Layer) that makes POST and PATCH routes idempotent.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::Idem;
//! use idem_http::server::IdempotencyLayer;
//!
//! let idem = Idem::open("sqlite://payments.db").await?;
//! let layer = IdempotencyLayer::new(idem);
//! // axum: Router::new().route("/v1/charges", post(create)).layer(layer)
//! # let _ = layer; Ok(()) }
//! ```
//!
//! It implements draft-ietf-httpapi-idempotency-key-header-07 as Stripe behaves:
//!
//! | the request | answer | the handler runs? |
//! |---|---|---|
//! | not POST/PATCH (configurable), or a route that is not enforced | passed through | yes |
//! | no `Idempotency-Key` (when required, the default) | 400 `missing-key` | no |
//! | a repeated, empty or malformed key (1 to 255 visible ASCII; a structured-field String `"…"`, or bare) | 400 | no |
//! | a key from a caller the layer cannot tell apart (no `Authorization`, by default) | 400 `unidentified-caller` (unless [`IdempotencyLayer::shared_anonymous_scope`]) | no |
//! | a body over the limit | 413 `body-too-large` | no |
//! | a key already used with another method, path, query or body | 422 `key-reused` (checked first) | no |
//! | a key whose first request is still running | 409 `in-flight` with `Retry-After: 1` (retry soon, same key) | no |
//! | a key whose first request ran but did not finish its response, or whose server stopped before it answered (once its lease lapsed) | 423 `outcome-unknown`: retrying cannot settle it (unless [`IdempotencyLayer::rerun_orphans`] for the second) | no |
//! | a key whose first request completed | its status, selected headers and body, byte for byte, with `Idempotent-Replayed: true` | no |
//! | a key whose first request is streaming its response (below) | its status, selected headers and the frames recorded so far, then the rest as they are recorded, with `Idempotent-Replayed: true` | no |
//! | a new key | the handler's response, stored unless its status says nothing happened (400, 401, 403, 404, 405, 409, 413, 415, 422, 429 by default) | yes, once |
//! | the store cannot be reached | 503 `store-unavailable` | no |
//!
//! Keys are scoped by principal: by default a hash of the `Authorization` header, so two
//! clients with the same key never see each other's responses ([`IdempotencyLayer::principal`]).
//! The fingerprint is the method, the path, the query (its pairs, decoded and sorted) and the
//! canonical body: JSON canonicalized (RFC 8785), form bodies as sorted pairs, other bodies as
//! bytes; fields named in
//! [`IdempotencyLayer::skip`] are left out. Errors are RFC 9457 `application/problem+json`, each
//! with its own `type` under the policy URL and a `Link: <policy>; rel="describedby"`; the layer
//! serves the policy itself (`GET /idempotency-policy` by default, generated from its settings).
//! [`IdempotencyLayer::error_body`] chooses Stripe's error envelope instead (so that Stripe's
//! own SDKs raise their `IdempotencyError` for a reused key), or your own.
//!
//! Once a request holds its key, the handler runs in a task of its own: a client that hangs up
//! does not cancel it, and its response is stored for the retry.
//!
//! A streamed response (`Content-Type: text/event-stream`, or a body whose length is not known
//! before it is sent, as chunked bodies are) is recorded as it is sent: its status and
//! selected headers as the first chunk of the key's stream, then each batch of data frames,
//! each appended (fenced by the request's claim) before the client gets it. A retry after it
//! replays the same frames, byte for byte; a retry during it follows it: the frames so far,
//! then the rest as they are recorded. A stream that breaks off (its body fails, its request's
//! key is taken over, the store fails for the whole completion window) ends the client's body
//! with an error, so that the server cuts the response short. Trailers are not recorded. On a
//! store that records no streams, the response is collected and stored whole.

mod body;
mod config;
mod error_body;
mod layer;
mod policy;
mod problem;
mod service;
mod stored;
mod streamed;

pub use body::{AnswerBody, BoxError, GuardedRequestBody, GuardedResponseBody};
pub use error_body::{ErrorBody, LayerError, WriteError};
pub use layer::{DEFAULT_POLICY_PATH, IdempotencyLayer};
pub use service::Idempotent;
