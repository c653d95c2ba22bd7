//! The layer's own answers: RFC 9457 `application/problem+json`, one `type` per problem, each
//! linking the policy.

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

impl Config {
    pub(super) fn problem<ResB>(
        &self,
        problem: Problem,
        detail: String,
    ) -> Response<GuardedResponseBody<ResB>> {
        let status = problem.status();
        let body = serde_json::json!({
            "type": format!("{}#{}", self.policy_url, problem.code()),
            "title": problem.title(),
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = Response::new(Either::Right(Full::new(Bytes::from(body.to_string()))));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Ok(link) =
            HeaderValue::from_str(&format!("<{}>; rel=\"describedby\"", self.policy_url))
        {
            headers.insert(header::LINK, link);
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
