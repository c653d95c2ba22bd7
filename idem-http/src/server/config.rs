//! What a layer was configured with, shared by its services: the builder's settings
//! ([`IdempotencyLayer`](super::IdempotencyLayer)); `policy.rs` writes the policy they make.

use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::{Method, StatusCode};
use sha2::{Digest, Sha256};

use super::error_body::ErrorBody;
use idem_runtime::Idem;

/// Who a request acts for; `None`: the layer cannot tell its caller apart from another.
pub(super) type Principal = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;
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
    /// Whether the principal is the default one (the `Authorization` header's hash).
    pub(super) default_principal: bool,
    /// Whether callers the principal cannot tell apart share one scope (else they are refused).
    pub(super) shared_anonymous: bool,
    /// Whether a request whose holder stopped before it answered runs again once its lease
    /// lapses (else its key is blocked as unknown).
    pub(super) rerun_orphans: bool,
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

/// The default principal: a hash of the `Authorization` header; none without one.
pub(super) fn default_principal(parts: &http::request::Parts) -> Option<String> {
    let value = parts.headers.get(header::AUTHORIZATION)?;
    let digest = Sha256::digest(value.as_bytes());
    const PREFIX: &str = "authorization:";
    let mut out = String::with_capacity(PREFIX.len() + 32);
    out.push_str(PREFIX);
    idem_core::hex::push(&mut out, &digest[..16]);
    Some(out)
}

/// The scope of callers the principal cannot tell apart, when they share one.
pub(super) const ANONYMOUS: &str = "anonymous";

impl Config {
    /// How long a request whose key is in flight waits for the first (the runtime's default
    /// wait unless set).
    pub(super) fn wait(&self) -> Duration {
        self.wait.unwrap_or(self.idem.default_wait())
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
        let p = default_principal(&parts).unwrap();
        assert!(
            p.starts_with("authorization:") && !p.contains("secret"),
            "{p}"
        );
        let (anon, ()) = Request::new(()).into_parts();
        assert_eq!(
            default_principal(&anon),
            None,
            "no credentials, no principal"
        );
    }
}
