//! The layer and its builder: which requests it guards, how it scopes and fingerprints them, and
//! what it keeps ([`Config`] holds the settings).

use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::{Method, StatusCode};
use tower_layer::Layer;

use super::config::{Config, default_principal, default_stores};
use super::error_body::ErrorBody;
use super::service::Idempotent;
use idem_runtime::Idem;

/// A tower [`Layer`] that guards requests with the `Idempotency-Key` header. See the module docs.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config;
        f.debug_struct("IdempotencyLayer")
            .field("methods", &c.methods)
            .field("required", &c.required)
            .field("lenient", &c.lenient)
            .field("max_body", &c.max_body)
            .field("policy_url", &c.policy_url)
            .finish_non_exhaustive()
    }
}

/// The path the layer serves its policy at, unless [`IdempotencyLayer::policy_url`] moves it.
pub const DEFAULT_POLICY_PATH: &str = "/idempotency-policy";

impl IdempotencyLayer {
    /// Guards POST and PATCH requests of every route, keys required, records in `idem`'s store
    /// with its TTL and lease.
    pub fn new(idem: Idem) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                idem,
                methods: vec![Method::POST, Method::PATCH],
                enforced: None,
                required: true,
                lenient: true,
                max_body: 1 << 20,
                skip: Vec::new(),
                replay_headers: vec![header::CONTENT_TYPE, header::LOCATION],
                principal: Arc::new(default_principal),
                default_principal: true,
                shared_anonymous: false,
                rerun_orphans: false,
                policy_url: DEFAULT_POLICY_PATH.to_owned(),
                serve_policy: true,
                ttl: None,
                lease: None,
                wait: None,
                stores: default_stores,
                errors: ErrorBody::Problem,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::get_mut(&mut self.config).expect("configured before it is shared"));
        self
    }

    /// The methods guarded (default POST and PATCH). GET, PUT and DELETE are idempotent by
    /// definition and pass through unless listed here.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.with(|c| c.methods = methods)
    }

    /// Guards only the requests for which `enforced(method, path)` is true (default: every
    /// request with a guarded method).
    pub fn routes(self, enforced: impl Fn(&Method, &str) -> bool + Send + Sync + 'static) -> Self {
        self.with(|c| c.enforced = Some(Arc::new(enforced)))
    }

    /// Lets a request without a key through, unprotected (default: 400).
    pub fn key_optional(self) -> Self {
        self.with(|c| c.required = false)
    }

    /// Accepts only structured-field Strings (`"…"`), not bare keys (default: both).
    pub fn strict_syntax(self) -> Self {
        self.with(|c| c.lenient = false)
    }

    /// The largest request body read (default 1 MiB); a larger one is 413 before anything is stored.
    pub fn max_body(self, bytes: usize) -> Self {
        self.with(|c| c.max_body = bytes)
    }

    /// Body fields left out of the fingerprint, as dotted paths into JSON bodies (`meta.trace`)
    /// or names of form fields (`metadata[trace]`): volatile values a client adds on retries.
    pub fn skip<'a>(self, fields: impl IntoIterator<Item = &'a str>) -> Self {
        let fields = fields
            .into_iter()
            .map(|f| f.split('.').map(str::to_owned).collect())
            .collect();
        self.with(|c| c.skip = fields)
    }

    /// Response headers stored and replayed with the status and body (default `Content-Type`
    /// and `Location`).
    pub fn replay_headers(self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let headers = headers.into_iter().collect();
        self.with(|c| c.replay_headers = headers)
    }

    /// Who a request acts for: keys are scoped by this value (default: a hash of the
    /// `Authorization` header). Two principals never share a key. With the default, a keyed
    /// request without credentials is refused (400 `unidentified-caller`), unless
    /// [`shared_anonymous_scope`](IdempotencyLayer::shared_anonymous_scope).
    pub fn principal(
        self,
        principal: impl Fn(&http::request::Parts) -> String + Send + Sync + 'static,
    ) -> Self {
        self.with(|c| {
            c.principal = Arc::new(move |parts| Some(principal(parts)));
            c.default_principal = false;
        })
    }

    /// Who a request acts for, or `None` when the service cannot tell its caller apart: such a
    /// keyed request is refused (400 `unidentified-caller`), unless
    /// [`shared_anonymous_scope`](IdempotencyLayer::shared_anonymous_scope).
    pub fn principal_if_known(
        self,
        principal: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.with(|c| {
            c.principal = Arc::new(principal);
            c.default_principal = false;
        })
    }

    /// Callers the principal cannot tell apart (with the default principal: requests without
    /// an `Authorization` header) share one scope, `anonymous`, instead of being refused: two
    /// of them sending the same key see each other's responses. Only for services whose
    /// unauthenticated callers are one party (a single internal client, a test).
    pub fn shared_anonymous_scope(self) -> Self {
        self.with(|c| c.shared_anonymous = true)
    }

    /// A request whose server stopped (a crash, a kill, a panic) before it answered runs again
    /// with the next retry once its lease lapses (default: its key is blocked as unknown, 423,
    /// and the handler never runs twice). Only for handlers that are safe to run twice.
    pub fn rerun_orphans(self) -> Self {
        self.with(|c| c.rerun_orphans = true)
    }

    /// Where the policy is published: problem `type`s are `URL#code` and every problem links
    /// to it. A path (default `/idempotency-policy`) is served by the layer itself; an absolute
    /// URL is yours to publish.
    pub fn policy_url(self, url: impl Into<String>) -> Self {
        let url = url.into();
        self.with(|c| {
            c.serve_policy = url.starts_with('/');
            c.policy_url = url;
        })
    }

    /// How long a response is kept for replays (default: the runtime's TTL, 24 h).
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|c| c.ttl = Some(ttl))
    }

    /// How long a running request blocks its key before another may take it over (default: the
    /// runtime's lease). Set it above your slowest handler.
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|c| c.lease = Some(lease))
    }

    /// How long a request whose key is held by a request still running waits for it (default:
    /// the runtime's default wait, none unless set): it then receives the first request's
    /// stored response, replayed with `Idempotent-Replayed: true`, instead of a 409. Past the
    /// wait it gets the 409. A client that sends its retry while the first attempt still runs
    /// (a timeout fired) gets the answer in one round trip. A request whose key is held by a
    /// response being streamed does not wait: it follows the stream at once.
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|c| c.wait = Some(wait))
    }

    /// How the layer writes its own errors: RFC 9457 problem+json (the default),
    /// [`ErrorBody::Stripe`] for Stripe's envelope and statuses (so that Stripe's SDKs understand
    /// them), or [`ErrorBody::custom`].
    pub fn error_body(self, errors: ErrorBody) -> Self {
        self.with(|c| c.errors = errors)
    }

    /// Which responses are stored for replay (default: all but 400, 401, 403, 404, 405, 409,
    /// 413, 415, 422 and 429, which say the request had no effect: their key is released, so a
    /// corrected retry runs). A 500 that ran is stored.
    pub fn store_responses(self, stores: fn(StatusCode) -> bool) -> Self {
        self.with(|c| c.stores = stores)
    }

    /// The policy this layer applies, in Markdown, as it serves it.
    pub fn policy(&self) -> String {
        self.config.policy()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotent {
            inner,
            config: self.config.clone(),
        }
    }
}
