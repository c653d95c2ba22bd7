//! What a layer was configured with, shared by its services: the builder's settings
//! ([`IdempotencyLayer`](super::IdempotencyLayer)) and the policy text they make.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::{Method, StatusCode};
use sha2::{Digest, Sha256};

use super::error_body::ErrorBody;
use idem_runtime::Idem;

pub(super) type Principal = dyn Fn(&http::request::Parts) -> String + Send + Sync;
pub(super) type Enforced = dyn Fn(&Method, &str) -> bool + Send + Sync;

/// The settings of a layer.
pub(super) struct Config {
    pub(super) idem: Idem,
    pub(super) methods: Vec<Method>,
    pub(super) enforced: Option<Arc<Enforced>>,
    pub(super) required: bool,
    pub(super) lenient: bool,
    pub(super) max_body: usize,
    pub(super) skip: Vec<Vec<String>>,
    pub(super) replay_headers: Vec<HeaderName>,
    pub(super) principal: Arc<Principal>,
    pub(super) policy_url: String,
    pub(super) serve_policy: bool,
    pub(super) ttl: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) wait: Option<Duration>,
    pub(super) stores: fn(StatusCode) -> bool,
    pub(super) errors: ErrorBody,
}

/// Statuses that say the request had no effect, so its key is released rather than stored.
pub(super) fn default_stores(status: StatusCode) -> bool {
    !matches!(
        status.as_u16(),
        400 | 401 | 403 | 404 | 405 | 409 | 413 | 415 | 422 | 429
    )
}

/// The default principal: a hash of the `Authorization` header (`anonymous` without one).
pub(super) fn default_principal(parts: &http::request::Parts) -> String {
    match parts.headers.get(header::AUTHORIZATION) {
        Some(value) => {
            let digest = Sha256::digest(value.as_bytes());
            const PREFIX: &str = "authorization:";
            let mut out = String::with_capacity(PREFIX.len() + 32);
            out.push_str(PREFIX);
            idem_core::hex::push(&mut out, &digest[..16]);
            out
        }
        None => "anonymous".to_owned(),
    }
}

impl Config {
    /// How long a request whose key is in flight waits for the first (the runtime's default
    /// wait unless set).
    pub(super) fn wait(&self) -> Duration {
        self.wait.unwrap_or(self.idem.default_wait())
    }

    pub(super) fn policy(&self) -> String {
        let methods: Vec<&str> = self.methods.iter().map(Method::as_str).collect();
        let ttl = self.ttl.unwrap_or(self.idem.default_ttl());
        let lease = self.lease.unwrap_or(self.idem.default_lease());
        let wait = self.wait();
        let mut out = String::from("# Idempotency policy\n\n");
        let _ = writeln!(
            out,
            "- Requests: {} {}carry an `Idempotency-Key` header.",
            methods.join(", "),
            if self.required { "must " } else { "may " }
        );
        let _ = writeln!(
            out,
            "- Key: 1 to 255 visible ASCII characters, as a structured-field String (`\"…\"`){}. \
             One header, not empty. Otherwise: 400.",
            if self.lenient { " or bare" } else { "" }
        );
        out.push_str(
            "- Scope: keys belong to the caller (the credentials of the request); two callers \
             never share a key.\n",
        );
        out.push_str(
            "- Fingerprint: method, path and body (JSON canonicalized per RFC 8785, form fields \
             sorted, other bodies as bytes)",
        );
        if self.skip.is_empty() {
            out.push_str(". ");
        } else {
            let fields: Vec<String> = self.skip.iter().map(|p| p.join(".")).collect();
            let _ = write!(out, ", without the fields {}. ", fields.join(", "));
        }
        out.push_str("The same key with another fingerprint: 422.\n");
        if wait.is_zero() {
            let _ = writeln!(
                out,
                "- While the first request runs: 409 with `Retry-After: 1` (retry soon, with the \
                 same key; a request holds its key for up to {} s).",
                lease.as_secs()
            );
        } else {
            let _ = writeln!(
                out,
                "- While the first request runs: a request with its key waits up to {} ms for it \
                 and receives its response; past that, 409 with `Retry-After: 1` (retry soon, \
                 with the same key; a request holds its key for up to {} s).",
                wait.as_millis(),
                lease.as_secs()
            );
        }
        let _ = writeln!(
            out,
            "- After it: its status, headers and body, replayed with `Idempotent-Replayed: true`, \
             errors included, for {} h. Responses 400, 401, 403, 404, 405, 409, 413, 415, 422 and \
             429 are not kept: a corrected retry runs.",
            ttl.as_secs() / 3600
        );
        out.push_str(
            "- Streamed responses (`text/event-stream`, or a chunked body): each frame is \
             recorded before it is sent. A request with the key of a response still being \
             streamed receives its status, headers and frames so far, then the rest as they \
             come; one that comes after it, the whole stream again. A stream that broke off is \
             cut short, never ended as if complete.\n",
        );
        let _ = writeln!(
            out,
            "- Request bodies over {} bytes: 413. Errors are `application/problem+json`.",
            self.max_body
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, StatusCode, header};

    use super::{default_principal, default_stores};

    #[test]
    fn no_effect_statuses_are_released() {
        for s in [400, 401, 403, 404, 405, 409, 413, 415, 422, 429] {
            assert!(!default_stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [200, 201, 202, 204, 302, 402, 500, 502, 503] {
            assert!(default_stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
    }

    #[test]
    fn principals_are_hashed() {
        let (parts, ()) = Request::builder()
            .header(header::AUTHORIZATION, "Bearer sk_test_secret")
            .body(())
            .unwrap()
            .into_parts();
        let p = default_principal(&parts);
        assert!(
            p.starts_with("authorization:") && !p.contains("secret"),
            "{p}"
        );
        let (anon, ()) = Request::new(()).into_parts();
        assert_eq!(default_principal(&anon), "anonymous");
    }
}
