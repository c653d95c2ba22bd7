//! The layer's own answers (400, 409, 413, 422, 503, …): RFC 9457 `application/problem+json` by
//! default, one `type` per problem, each linking the policy; or Stripe's error envelope, or your
//! own ([`ErrorBody`](super::ErrorBody)).

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Either;

use super::body::{AnswerBody, GuardedResponseBody};
use super::config::Config;
use super::error_body::{ErrorBody, LayerError};
use crate::KeyHeaderError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Problem {
    MissingKey,
    MalformedKey,
    UnidentifiedCaller,
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
    /// Every problem, in the order the policy lists them.
    pub(super) const ALL: [Problem; 11] = [
        Problem::MissingKey,
        Problem::MalformedKey,
        Problem::UnidentifiedCaller,
        Problem::BodyTooLarge,
        Problem::BodyUnreadable,
        Problem::KeyReused,
        Problem::InFlight,
        Problem::OutcomeUnknown,
        Problem::StoreUnavailable,
        Problem::StoredResponseUnreadable,
        Problem::ServiceFailed,
    ];

    pub(super) fn code(self) -> &'static str {
        match self {
            Problem::MissingKey => "missing-key",
            Problem::MalformedKey => "malformed-key",
            Problem::UnidentifiedCaller => "unidentified-caller",
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
            Problem::MissingKey
            | Problem::MalformedKey
            | Problem::UnidentifiedCaller
            | Problem::BodyUnreadable => StatusCode::BAD_REQUEST,
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InFlight => StatusCode::CONFLICT,
            // Not 409: a client retries a request in flight, and retrying cannot settle this.
            Problem::OutcomeUnknown => StatusCode::LOCKED,
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
            Problem::UnidentifiedCaller => "The caller of a keyed request cannot be identified",
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

impl Problem {
    /// Stripe's status and error type for this problem.
    pub(super) fn stripe(self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            Problem::KeyReused => (StatusCode::BAD_REQUEST, "idempotency_error", None),
            Problem::InFlight => (
                StatusCode::CONFLICT,
                "idempotency_error",
                Some("idempotency_key_in_use"),
            ),
            Problem::OutcomeUnknown => (StatusCode::LOCKED, "idempotency_error", None),
            Problem::MissingKey
            | Problem::MalformedKey
            | Problem::UnidentifiedCaller
            | Problem::BodyUnreadable => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
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
            let mut response = Response::new(Either::Right(AnswerBody::whole(Bytes::from(
                body.to_string(),
            ))));
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
            .map(|bytes| Either::Right(AnswerBody::whole(bytes))),
        };
        if let Ok(link) =
            HeaderValue::from_str(&format!("<{}>; rel=\"describedby\"", self.policy_url))
        {
            response.headers_mut().entry(header::LINK).or_insert(link);
        }
        response
    }

    pub(super) fn policy_response<ResB>(&self) -> Response<GuardedResponseBody<ResB>> {
        let mut response =
            Response::new(Either::Right(AnswerBody::whole(Bytes::from(self.policy()))));
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

impl Config {
    /// A problem as the layer's own answer.
    pub(super) fn own_problem(&self, problem: Problem, detail: String) -> Response<AnswerBody> {
        self.problem::<AnswerBody>(problem, detail)
            .map(|body| match body {
                Either::Left(body) | Either::Right(body) => body,
            })
    }
}
