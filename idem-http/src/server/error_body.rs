//! How the layer writes its own errors: [`ErrorBody`], and what a custom writer receives
//! ([`LayerError`]).

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};

/// One of the layer's own errors, as [`ErrorBody::Custom`] receives it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LayerError<'a> {
    /// What went wrong: `missing-key`, `malformed-key`, `body-too-large`, `body-unreadable`,
    /// `key-reused`, `in-flight`, `outcome-unknown`, `store-unavailable`,
    /// `stored-response-unreadable`, `service-failed`.
    pub code: &'static str,
    /// The status the layer answers with by default (problem+json).
    pub status: StatusCode,
    /// A one-line title.
    pub title: &'static str,
    /// What happened and what to do, for people.
    pub detail: &'a str,
    /// Where the layer serves its policy.
    pub policy_url: &'a str,
}

/// A function that writes the response for one of the layer's errors.
pub type WriteError = dyn Fn(&LayerError<'_>) -> Response<Bytes> + Send + Sync;

/// How the layer writes its own errors.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum ErrorBody {
    /// RFC 9457 `application/problem+json`, one `type` per error under the policy URL, with
    /// `Link: <policy>; rel="describedby"` (the IETF draft's choice; the default).
    #[default]
    Problem,
    /// Stripe's error envelope, `{"error": {"type": …, "message": …, "doc_url": …}}`, with
    /// Stripe's statuses: a reused key is 400 `idempotency_error` (Stripe's SDKs raise their
    /// `IdempotencyError`), a key in flight 409 `idempotency_error` with the code
    /// `idempotency_key_in_use` (the SDKs retry it), malformed requests 400 or 413
    /// `invalid_request_error`, a store outage 503 and a failed service 500 `api_error`.
    Stripe,
    /// Your own: the response for each error (its status, headers and body).
    Custom(Arc<WriteError>),
}

impl std::fmt::Debug for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorBody::Problem => "Problem",
            ErrorBody::Stripe => "Stripe",
            ErrorBody::Custom(_) => "Custom(…)",
        })
    }
}

impl ErrorBody {
    /// A custom error body (see [`ErrorBody::Custom`]).
    pub fn custom(f: impl Fn(&LayerError<'_>) -> Response<Bytes> + Send + Sync + 'static) -> Self {
        ErrorBody::Custom(Arc::new(f))
    }
}
