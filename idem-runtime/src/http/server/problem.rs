//! The layer's own answers (400, 409, 413, 422, 503, …): RFC 9457 `application/problem+json` by
//! default, one `type` per problem, each linking the policy; or Stripe's error envelope, or your
//! own ([`ErrorBody`]).

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{Either, Full};

use super::GuardedResponseBody;
use super::layer::Config;
use crate::http::KeyHeaderError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Problem {
    MissingKey,
    MalformedKey,
    BodyTooLarge,
    BodyUnreadable,
    KeyReused,
    InFlight,
    OutcomeUnknown,
    StoreUnavailable,
    StoredResponseUnreadable,
    ServiceFailed,
}

impl Problem {
    pub(super) fn code(self) -> &'static str {
        match self {
            Problem::MissingKey => "missing-key",
            Problem::MalformedKey => "malformed-key",
            Problem::BodyTooLarge => "body-too-large",
            Problem::BodyUnreadable => "body-unreadable",
            Problem::KeyReused => "key-reused",
            Problem::InFlight => "in-flight",
            Problem::OutcomeUnknown => "outcome-unknown",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::StoredResponseUnreadable => "stored-response-unreadable",
            Problem::ServiceFailed => "service-failed",
        }
    }

    pub(super) fn status(self) -> StatusCode {
        match self {
            Problem::MissingKey | Problem::MalformedKey | Problem::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InFlight | Problem::OutcomeUnknown => StatusCode::CONFLICT,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::StoredResponseUnreadable | Problem::ServiceFailed => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    pub(super) fn title(self) -> &'static str {
        match self {
            Problem::MissingKey => "An Idempotency-Key header is required",
            Problem::MalformedKey => "The Idempotency-Key header is malformed",
            Problem::BodyTooLarge => "The request body is too large",
            Problem::BodyUnreadable => "The request body could not be read",
            Problem::KeyReused => "The idempotency key was used with another request",
            Problem::InFlight => "A request with this idempotency key is still being processed",
            Problem::OutcomeUnknown => "The outcome of the first request with this key is unknown",
            Problem::StoreUnavailable => "Idempotency records are unavailable",
            Problem::StoredResponseUnreadable => "The stored response cannot be replayed",
            Problem::ServiceFailed => "The service failed",
        }
    }
}

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

impl Problem {
    /// Stripe's status and error type for this problem.
    fn stripe(self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            Problem::KeyReused => (StatusCode::BAD_REQUEST, "idempotency_error", None),
            Problem::InFlight => (
                StatusCode::CONFLICT,
                "idempotency_error",
                Some("idempotency_key_in_use"),
            ),
            Problem::OutcomeUnknown => (StatusCode::CONFLICT, "idempotency_error", None),
            Problem::MissingKey | Problem::MalformedKey | Problem::BodyUnreadable => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", None)
            }
            Problem::BodyTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", None),
            Problem::StoreUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "api_error", None),
            Problem::StoredResponseUnreadable | Problem::ServiceFailed => {
                (StatusCode::INTERNAL_SERVER_ERROR, "api_error", None)
            }
        }
    }
}

impl Config {
    pub(super) fn problem<ResB>(
        &self,
        problem: Problem,
        detail: String,
    ) -> Response<GuardedResponseBody<ResB>> {
        let json = |status: StatusCode, content_type: &'static str, body: serde_json::Value| {
            let mut response =
                Response::new(Either::Right(Full::new(Bytes::from(body.to_string()))));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        };
        let mut response = match &self.errors {
            ErrorBody::Problem => {
                let status = problem.status();
                let body = serde_json::json!({
                    "type": format!("{}#{}", self.policy_url, problem.code()),
                    "title": problem.title(),
                    "status": status.as_u16(),
                    "detail": detail,
                });
                json(status, "application/problem+json", body)
            }
            ErrorBody::Stripe => {
                let (status, kind, code) = problem.stripe();
                let mut error = serde_json::json!({
                    "type": kind,
                    "message": format!("{}: {detail}", problem.title()),
                    "doc_url": format!("{}#{}", self.policy_url, problem.code()),
                });
                if let Some(code) = code {
                    error["code"] = code.into();
                }
                json(
                    status,
                    "application/json",
                    serde_json::json!({ "error": error }),
                )
            }
            ErrorBody::Custom(f) => f(&LayerError {
                code: problem.code(),
                status: problem.status(),
                title: problem.title(),
                detail: &detail,
                policy_url: &self.policy_url,
            })
            .map(|bytes| Either::Right(Full::new(bytes))),
        };
        if let Ok(link) =
            HeaderValue::from_str(&format!("<{}>; rel=\"describedby\"", self.policy_url))
        {
            response.headers_mut().entry(header::LINK).or_insert(link);
        }
        response
    }

    pub(super) fn policy_response<ResB>(&self) -> Response<GuardedResponseBody<ResB>> {
        let mut response = Response::new(Either::Right(Full::new(Bytes::from(self.policy()))));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/markdown; charset=utf-8"),
        );
        response
    }
}

pub(super) fn malformed(e: &KeyHeaderError) -> String {
    format!("{e}; a key is 1 to 255 visible ASCII characters, sent once per request")
}

pub(super) fn unwrap_full(
    response: Response<GuardedResponseBody<Full<Bytes>>>,
) -> Response<Full<Bytes>> {
    response.map(|body| match body {
        Either::Left(full) | Either::Right(full) => full,
    })
}
