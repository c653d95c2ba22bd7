//! The server side: a tower [`Layer`] that makes POST and PATCH routes idempotent.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::Idem;
//! use idem_runtime::http::server::IdempotencyLayer;
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
//! | a body over the limit | 413 `body-too-large` | no |
//! | a key already used with another method, path or body | 422 `key-reused` (checked first) | no |
//! | a key whose first request is still running | 409 `in-flight` with `Retry-After` | no |
//! | a key whose first request completed | its status, selected headers and body, byte for byte, with `Idempotent-Replayed: true` | no |
//! | a new key | the handler's response, stored unless its status says nothing happened (400, 401, 403, 404, 405, 409, 413, 415, 422, 429 by default) | yes, once |
//! | the store cannot be reached | 503 `store-unavailable` | no |
//!
//! Keys are scoped by principal: by default a hash of the `Authorization` header, so two
//! clients with the same key never see each other's responses ([`IdempotencyLayer::principal`]).
//! The fingerprint is the method, the path and the canonical body: JSON canonicalized (RFC 8785),
//! form bodies as sorted pairs, other bodies as bytes; fields named in
//! [`IdempotencyLayer::skip`] are left out. Errors are RFC 9457 `application/problem+json`, each
//! with its own `type` under the policy URL and a `Link: <policy>; rel="describedby"`; the layer
//! serves the policy itself (`GET /idempotency-policy` by default, generated from its settings).
//!
//! Once a request holds its key, the handler runs in a task of its own: a client that hangs up
//! does not cancel it, and its response is stored for the retry.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, Limited};
use sha2::{Digest, Sha256};
use tower_layer::Layer;
use tower_service::Service;

use super::{IDEMPOTENT_REPLAYED, KeyHeaderError, parse_key_header};
use crate::fingerprint::{ArgsFingerprint, Fingerprint};
use crate::key::{IdempotencyKey, KeyPart, derive_key};
use crate::runtime::Idem;
use crate::store::{Claim, ClaimRequest, Completion, Fenced, Orphans, RecordStatus};

/// The boxed error of request bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of the requests the layer passes on: the original one (requests it does not guard),
/// or the buffered one.
pub type GuardedRequestBody<B> = Either<B, Full<Bytes>>;

/// The body of the responses the layer answers with: the handler's (requests it does not
/// guard), or a buffered one (guarded requests, replays, problems).
pub type GuardedResponseBody<B> = Either<B, Full<Bytes>>;

type Principal = dyn Fn(&http::request::Parts) -> String + Send + Sync;
type Enforced = dyn Fn(&Method, &str) -> bool + Send + Sync;

/// A tower [`Layer`] that guards requests with the `Idempotency-Key` header. See the module docs.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

struct Config {
    idem: Idem,
    methods: Vec<Method>,
    enforced: Option<Arc<Enforced>>,
    required: bool,
    lenient: bool,
    max_body: usize,
    skip: Vec<Vec<String>>,
    replay_headers: Vec<HeaderName>,
    principal: Arc<Principal>,
    policy_url: String,
    serve_policy: bool,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    stores: fn(StatusCode) -> bool,
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

/// Statuses that say the request had no effect, so its key is released rather than stored.
fn default_stores(status: StatusCode) -> bool {
    !matches!(
        status.as_u16(),
        400 | 401 | 403 | 404 | 405 | 409 | 413 | 415 | 422 | 429
    )
}

/// The default principal: a hash of the `Authorization` header (`anonymous` without one).
fn default_principal(parts: &http::request::Parts) -> String {
    match parts.headers.get(header::AUTHORIZATION) {
        Some(value) => {
            let digest = Sha256::digest(value.as_bytes());
            let mut out = String::from("authorization:");
            crate::hex::push(&mut out, &digest[..16]);
            out
        }
        None => "anonymous".to_owned(),
    }
}

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
                policy_url: DEFAULT_POLICY_PATH.to_owned(),
                serve_policy: true,
                ttl: None,
                lease: None,
                stores: default_stores,
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
    /// `Authorization` header, `anonymous` without one). Two principals never share a key.
    pub fn principal(
        self,
        principal: impl Fn(&http::request::Parts) -> String + Send + Sync + 'static,
    ) -> Self {
        self.with(|c| c.principal = Arc::new(principal))
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

/// The service [`IdempotencyLayer`] wraps around another.
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> std::fmt::Debug for Idempotent<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent").finish_non_exhaustive()
    }
}

impl<S, B, ResB> Service<Request<B>> for Idempotent<S>
where
    S: Service<Request<GuardedRequestBody<B>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Error: Into<BoxError> + Send,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<GuardedResponseBody<ResB>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is made ready on the clone that serves each request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let config = self.config.clone();
        Box::pin(async move { Ok(config.handle(inner, req).await) })
    }
}

/// One of the answers of the layer itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Problem {
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
    fn code(self) -> &'static str {
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

    fn status(self) -> StatusCode {
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

    fn title(self) -> &'static str {
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
    async fn handle<S, B, ResB>(
        self: Arc<Self>,
        inner: S,
        req: Request<B>,
    ) -> Response<GuardedResponseBody<ResB>>
    where
        S: Service<Request<GuardedRequestBody<B>>, Response = Response<ResB>>
            + Clone
            + Send
            + 'static,
        S::Error: Into<BoxError> + Send,
        S::Future: Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
        ResB: Body<Data = Bytes> + Send + 'static,
        ResB::Error: Into<BoxError>,
    {
        if self.serve_policy && req.method() == Method::GET && req.uri().path() == self.policy_url {
            return self.policy_response();
        }
        let guarded = self.methods.contains(req.method())
            && self
                .enforced
                .as_ref()
                .is_none_or(|f| f(req.method(), req.uri().path()));
        if !guarded {
            return pass(inner, req.map(Either::Left)).await;
        }
        let key = match parse_key_header(req.headers(), self.lenient) {
            Ok(Some(key)) => key,
            Ok(None) if !self.required => return pass(inner, req.map(Either::Left)).await,
            Ok(None) => {
                return self.problem(
                    Problem::MissingKey,
                    format!(
                        "{} {} requires an Idempotency-Key header: 1 to 255 visible ASCII \
                         characters naming this request, the same on every retry",
                        req.method(),
                        req.uri().path()
                    ),
                );
            }
            Err(e) => return self.problem(Problem::MalformedKey, malformed(&e)),
        };
        let too_large = || {
            format!(
                "the request body is over {} bytes; nothing was stored",
                self.max_body
            )
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body as u64) {
            return self.problem(Problem::BodyTooLarge, too_large());
        }
        let (parts, body) = req.into_parts();
        let bytes = match Limited::new(body, self.max_body).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return self.problem(Problem::BodyTooLarge, too_large());
            }
            Err(_) => {
                return self.problem(
                    Problem::BodyUnreadable,
                    "the request body ended before it was complete".to_owned(),
                );
            }
        };
        let principal = (self.principal)(&parts);
        let fingerprint = self.fingerprint(&parts, &bytes);
        let req = Request::from_parts(parts, Either::Right(Full::new(bytes)));
        self.guarded(inner, key, principal, fingerprint, req)
            .await
            .map(Either::Right)
    }

    /// Claims the key and answers from the record, or runs the handler.
    async fn guarded<S, B, ResB>(
        self: Arc<Self>,
        inner: S,
        key: String,
        principal: String,
        fingerprint: Fingerprint,
        req: Request<GuardedRequestBody<B>>,
    ) -> Response<Full<Bytes>>
    where
        S: Service<Request<GuardedRequestBody<B>>, Response = Response<ResB>> + Send + 'static,
        S::Error: Into<BoxError> + Send,
        S::Future: Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        ResB: Body<Data = Bytes> + Send + 'static,
        ResB::Error: Into<BoxError>,
    {
        let idem = &self.idem;
        let store = idem.store();
        let parts = [KeyPart::new(&key).expect("a validated key string is a key part")];
        let key: IdempotencyKey = derive_key(&principal, "http", &parts);
        let lease = self.lease.unwrap_or(idem.default_lease());
        let ttl = self.ttl.unwrap_or(idem.default_ttl());
        let now = idem.clock().now();
        let claim = store
            .claim(ClaimRequest {
                tenant: &principal,
                key,
                tool: "http",
                fingerprint,
                now,
                lease,
                ttl,
                orphans: Orphans::TakeOver,
            })
            .await;
        let token =
            match claim {
                Err(e) => {
                    return unwrap_full(self.problem(
                        Problem::StoreUnavailable,
                        format!("{e}; the request was not processed, retry it with the same key"),
                    ));
                }
                Ok(Claim::Mismatch) => {
                    return unwrap_full(self.problem(
                    Problem::KeyReused,
                    "this idempotency key was already used with another method, path or body; \
                     a new request needs a new key"
                        .to_owned(),
                ));
                }
                Ok(Claim::InFlight { lease_expires_at }) => {
                    let wait = lease_expires_at
                        .saturating_sub(now)
                        .min(lease.as_millis() as u64);
                    let mut response = unwrap_full(self.problem(
                    Problem::InFlight,
                    "the first request with this key is still being processed; retry later \
                     with the same key"
                        .to_owned(),
                ));
                    response.headers_mut().insert(
                        header::RETRY_AFTER,
                        HeaderValue::from(wait.div_ceil(1000).max(1)),
                    );
                    return response;
                }
                Ok(Claim::Unknown) => {
                    return unwrap_full(self.problem(
                    Problem::OutcomeUnknown,
                    "whether the first request with this key took effect is unknown; it must \
                     be resolved before the key can be used"
                        .to_owned(),
                ));
                }
                Ok(Claim::Completed { result }) => {
                    return match decode_response(&result) {
                        Some(mut response) => {
                            response
                                .headers_mut()
                                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                            response
                        }
                        None => unwrap_full(self.problem(
                            Problem::StoredResponseUnreadable,
                            "the stored response of this key is damaged".to_owned(),
                        )),
                    };
                }
                Ok(Claim::Acquired { token, .. }) => token,
            };
        // The key is ours: the handler runs in a task of its own, so a client that hangs up
        // cancels neither the handler nor the recording of its response.
        let config = self.clone();
        let run = tokio::spawn(async move {
            config
                .run_handler(inner, principal, key, token, ttl, req)
                .await
        });
        match run.await {
            Ok(response) => response,
            Err(_) => unwrap_full(self.problem(
                Problem::ServiceFailed,
                "the handler panicked; the key stays held until its lease lapses".to_owned(),
            )),
        }
    }

    /// Runs the handler on a claimed key and records its response (or releases the key when
    /// its status says nothing happened).
    async fn run_handler<S, B, ResB>(
        self: Arc<Self>,
        mut inner: S,
        principal: String,
        key: IdempotencyKey,
        token: crate::store::FencingToken,
        ttl: Duration,
        req: Request<GuardedRequestBody<B>>,
    ) -> Response<Full<Bytes>>
    where
        S: Service<Request<GuardedRequestBody<B>>, Response = Response<ResB>>,
        S::Error: Into<BoxError>,
        ResB: Body<Data = Bytes>,
        ResB::Error: Into<BoxError>,
    {
        let idem = &self.idem;
        let store = idem.store();
        let answered = match std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
            Ok(()) => inner.call(req).await,
            Err(e) => Err(e),
        };
        let response = match answered {
            Ok(response) => response,
            Err(_) => {
                let _ = store.release(&principal, key, token).await;
                return unwrap_full(self.problem(
                    Problem::ServiceFailed,
                    "the service failed before answering; retry with the same key".to_owned(),
                ));
            }
        };
        let (parts, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                // The handler ran but its answer broke off: the key stays held (the lease
                // protects it) rather than inviting a second run.
                return unwrap_full(self.problem(
                    Problem::ServiceFailed,
                    "the response body failed while it was produced".to_owned(),
                ));
            }
        };
        if (self.stores)(parts.status) {
            let encoded =
                encode_response(parts.status, &parts.headers, &self.replay_headers, &body);
            let completion = Completion {
                tenant: &principal,
                key,
                token,
                status: RecordStatus::Completed,
                result: &encoded,
                now: idem.clock().now(),
                ttl,
            };
            // A completion that fails or was fenced out leaves the key to its lease; the
            // client still gets the answer the handler gave.
            let _: Result<Fenced, _> = store.complete(completion).await;
        } else {
            let _ = store.release(&principal, key, token).await;
        }
        Response::from_parts(parts, Full::new(body))
    }

    fn fingerprint(&self, parts: &http::request::Parts, body: &Bytes) -> Fingerprint {
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .unwrap_or_default();
        let canonical = match content_type.as_str() {
            "application/json" => {
                serde_json::from_slice::<serde_json::Value>(body)
                    .ok()
                    .map(|mut json| {
                        for path in &self.skip {
                            remove_path(&mut json, path);
                        }
                        CanonicalBody::Json(json)
                    })
            }
            "application/x-www-form-urlencoded" => {
                let mut pairs: Vec<(String, String)> = form_urlencoded::parse(body)
                    .into_owned()
                    .filter(|(name, _)| !self.skip.iter().any(|p| p.join(".") == *name))
                    .collect();
                pairs.sort();
                Some(CanonicalBody::Form(pairs))
            }
            _ => None,
        }
        .unwrap_or_else(|| CanonicalBody::Bytes(crate::hex::encode(&Sha256::digest(body))));
        ArgsFingerprint::new(&[])
            .arg("method", parts.method.as_str())
            .arg("path", parts.uri.path())
            .arg("body", &canonical)
            .finish()
            .unwrap_or_else(|_| {
                // JSON parsed from text always canonicalizes; keep the bytes if it ever did not.
                Fingerprint::from_bytes(Sha256::digest(body).into())
            })
    }

    fn problem<ResB>(
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

    fn policy_response<ResB>(&self) -> Response<GuardedResponseBody<ResB>> {
        let mut response = Response::new(Either::Right(Full::new(Bytes::from(self.policy()))));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/markdown; charset=utf-8"),
        );
        response
    }

    fn policy(&self) -> String {
        let methods: Vec<&str> = self.methods.iter().map(Method::as_str).collect();
        let ttl = self.ttl.unwrap_or(self.idem.default_ttl());
        let lease = self.lease.unwrap_or(self.idem.default_lease());
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
        let _ = writeln!(
            out,
            "- While the first request runs: 409 with `Retry-After` (a request holds its key for \
             up to {} s).",
            lease.as_secs()
        );
        let _ = writeln!(
            out,
            "- After it: its status, headers and body, replayed with `Idempotent-Replayed: true`, \
             errors included, for {} h. Responses 400, 401, 403, 404, 405, 409, 413, 415, 422 and \
             429 are not kept: a corrected retry runs.",
            ttl.as_secs() / 3600
        );
        let _ = writeln!(
            out,
            "- Request bodies over {} bytes: 413. Errors are `application/problem+json`.",
            self.max_body
        );
        out
    }
}

fn malformed(e: &KeyHeaderError) -> String {
    format!("{e}; a key is 1 to 255 visible ASCII characters, sent once per request")
}

fn unwrap_full(response: Response<GuardedResponseBody<Full<Bytes>>>) -> Response<Full<Bytes>> {
    response.map(|body| match body {
        Either::Left(full) | Either::Right(full) => full,
    })
}

async fn pass<S, B, ResB>(
    mut inner: S,
    req: Request<GuardedRequestBody<B>>,
) -> Response<GuardedResponseBody<ResB>>
where
    S: Service<Request<GuardedRequestBody<B>>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    let answered = match std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
        Ok(()) => inner.call(req).await,
        Err(e) => Err(e),
    };
    match answered {
        Ok(response) => response.map(Either::Left),
        Err(_) => {
            let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    }
}

/// What a request body is fingerprinted as.
#[derive(serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum CanonicalBody {
    Json(serde_json::Value),
    Form(Vec<(String, String)>),
    Bytes(String),
}

fn remove_path(value: &mut serde_json::Value, path: &[String]) {
    match path {
        [] => {}
        [last] => {
            if let Some(object) = value.as_object_mut() {
                object.remove(last);
            }
        }
        [first, rest @ ..] => {
            if let Some(inner) = value.get_mut(first) {
                remove_path(inner, rest);
            }
        }
    }
}

const STORED_MAGIC: &[u8; 4] = b"IDR1";

/// A stored response: magic, status, the selected headers (name and value, length-prefixed),
/// then the body.
fn encode_response(
    status: StatusCode,
    headers: &http::HeaderMap,
    selected: &[HeaderName],
    body: &[u8],
) -> Vec<u8> {
    let kept: Vec<(&HeaderName, &HeaderValue)> = headers
        .iter()
        .filter(|(name, _)| selected.contains(name))
        .collect();
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(STORED_MAGIC);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
    for (name, value) in kept {
        out.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(body);
    out
}

fn decode_response(stored: &[u8]) -> Option<Response<Full<Bytes>>> {
    let mut rest = stored.strip_prefix(STORED_MAGIC)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(head)
    };
    let status = StatusCode::from_u16(u16::from_be_bytes(take(2)?.try_into().ok()?)).ok()?;
    let count = u16::from_be_bytes(take(2)?.try_into().ok()?);
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    for _ in 0..count {
        let len = u16::from_be_bytes(take(2)?.try_into().ok()?) as usize;
        let name = HeaderName::from_bytes(take(len)?).ok()?;
        let len = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let value = HeaderValue::from_bytes(take(len)?).ok()?;
        response.headers_mut().append(name, value);
    }
    *response.body_mut() = Full::new(Bytes::copy_from_slice(rest));
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_responses_round_trip_byte_for_byte() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("secret=1"));
        headers.append(header::LOCATION, HeaderValue::from_static("/v1/x/1"));
        let body = b"{\"id\": \"pi_1\",\n \"amount\": 500}\xff";
        let selected = [header::CONTENT_TYPE, header::LOCATION];
        let stored = encode_response(StatusCode::CREATED, &headers, &selected, body);
        let replay = decode_response(&stored).expect("decodes");
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(replay.headers()[header::LOCATION], "/v1/x/1");
        assert!(
            replay.headers().get(header::SET_COOKIE).is_none(),
            "not selected"
        );
        let bytes = futures_body(replay.into_body());
        assert_eq!(&bytes[..], &body[..]);
        assert!(decode_response(b"IDR1\x00").is_none());
        assert!(decode_response(b"nope").is_none());
    }

    fn futures_body(body: Full<Bytes>) -> Bytes {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async { body.collect().await.unwrap().to_bytes() })
    }

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
