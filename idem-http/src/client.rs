//! The client side: send one `Idempotency-Key` per intent and retry with it.
//!
//! ```no_run
//! # async fn f() -> Result<(), idem_http::client::ClientError> {
//! use idem_http::client::IdemClient;
//!
//! let client = IdemClient::new(reqwest::Client::new());
//! let answer = client
//!     .post("http://127.0.0.1:4242/v1/payment_intents")
//!     .form(&[("amount", "500"), ("currency", "eur")])
//!     .send()
//!     .await?;
//! println!("{} (replayed: {})", answer.status(), answer.replayed());
//! # Ok(()) }
//! ```
//!
//! POST and PATCH carry a key: the one you give ([`IdemRequest::key`]), else one derived from
//! the running tool's own key ([`idem_runtime::current`], named by [`IdemRequest::derive`] or by the
//! method and path), else a random one made once for this request. Every retry sends the same
//! key. GET, PUT and DELETE carry none.
//!
//! Retried, with exponential backoff and full jitter: timeouts and connection errors, 409 (the
//! first attempt still runs), 429, and 5xx that are not replays. Never retried: 400, 422 and
//! every other answer, which a retry would not change. A 423 (the first request's outcome is
//! unknown, and its key blocked) stops with [`ClientError::OutcomeUnknown`].
//!
//! A `Retry-After` (seconds, or an HTTP date) is a floor: the next attempt waits at least that
//! long, even beyond the policy's `max_delay`. When the wait would run past the retry budget,
//! the client gives up with [`ClientError::RetryAfterBeyondBudget`] rather than retry early.

use std::time::{Duration, Instant, SystemTime};

use http::{HeaderValue, Method, StatusCode};
use reqwest::{IntoUrl, RequestBuilder, Response};

use super::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

pub use idem_runtime::retry::RetryPolicy;

/// A reqwest client that makes POST and PATCH safe to retry.
#[derive(Debug, Clone)]
pub struct IdemClient {
    http: reqwest::Client,
    policy: RetryPolicy,
}

/// What went wrong, after the retries the policy allows.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request could not be sent, or no answer came, on the last attempt.
    #[error("the request failed after {attempts} attempt(s)")]
    Transport {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        #[source]
        source: reqwest::Error,
    },
    /// The server asked to wait (`Retry-After`) longer than the retry budget has left, so the
    /// client gave up rather than retry before the server said it may.
    #[error(
        "the server answered {status} and asked to wait {retry_after:?} before a retry, beyond the {left:?} left of the retry budget; given up after {attempts} attempt(s)"
    )]
    RetryAfterBeyondBudget {
        /// Attempts made.
        attempts: u32,
        /// The status of the last answer (429, 503, …).
        status: StatusCode,
        /// How long the server asked to wait.
        retry_after: Duration,
        /// What was left of the budget.
        left: Duration,
    },
    /// The request body is a stream that cannot be sent twice, so it cannot be retried safely.
    #[error("the request body cannot be cloned, so the request cannot be retried")]
    NotRetryable,
    /// The request could not be built (a bad URL, a header that is not valid).
    #[error("the request could not be built")]
    Build(#[source] reqwest::Error),
    /// The explicit key is not 1 to 255 visible ASCII characters.
    #[error("the idempotency key is invalid: {0}")]
    InvalidKey(idem_core::key::InvalidKey),
    /// The server answered 423: it ran the first request with this key, but whether that
    /// request took effect is unknown (its response broke off, or its server stopped), and the
    /// key is blocked until its operator resolves it. Retrying cannot settle it: check the
    /// effect with the service (or its operator), and send a new request with a new key only if
    /// it did not happen.
    #[error(
        "the outcome of the first request with this key is unknown (423); retrying cannot settle it: {detail}"
    )]
    OutcomeUnknown {
        /// Attempts made.
        attempts: u32,
        /// What the server said (its error body, as text).
        detail: String,
    },
}

/// The answer to a request, after retries.
#[derive(Debug)]
pub struct IdemAnswer {
    response: Response,
    attempts: u32,
    key: Option<String>,
}

impl IdemAnswer {
    /// The status of the final response.
    pub fn status(&self) -> StatusCode {
        self.response.status()
    }

    /// Whether the server replayed a stored response (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.response
            .headers()
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    }

    /// How many attempts it took.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The key that was sent on every attempt (`None` for GET, PUT, DELETE).
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The response, to read its headers and body.
    pub fn into_response(self) -> Response {
        self.response
    }
}

/// Where the key of a request comes from.
#[derive(Debug, Clone)]
enum KeySource {
    /// Derived from the running tool's key by this name, or by method and path when `None`;
    /// a random key outside a tool.
    Derived(Option<String>),
    Explicit(String),
}

/// A request being built; [`IdemRequest::send`] sends it with retries.
#[derive(Debug)]
pub struct IdemRequest {
    client: IdemClient,
    method: Method,
    builder: RequestBuilder,
    key: KeySource,
}

impl IdemClient {
    /// Wraps a reqwest client (set its timeouts: a request that times out is retried).
    pub fn new(http: reqwest::Client) -> Self {
        IdemClient {
            http,
            policy: RetryPolicy::default(),
        }
    }

    /// Another retry policy.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// A request with any method.
    pub fn request(&self, method: Method, url: impl IntoUrl) -> IdemRequest {
        IdemRequest {
            client: self.clone(),
            builder: self.http.request(method.clone(), url),
            method,
            key: KeySource::Derived(None),
        }
    }

    /// A POST (carries a key).
    pub fn post(&self, url: impl IntoUrl) -> IdemRequest {
        self.request(Method::POST, url)
    }

    /// A PATCH (carries a key).
    pub fn patch(&self, url: impl IntoUrl) -> IdemRequest {
        self.request(Method::PATCH, url)
    }

    /// A GET (no key; retried on transport errors and 5xx).
    pub fn get(&self, url: impl IntoUrl) -> IdemRequest {
        self.request(Method::GET, url)
    }
}

impl IdemRequest {
    /// Sends this key (1 to 255 visible ASCII characters) instead of a derived one.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = KeySource::Explicit(key.into());
        self
    }

    /// Derives the key from the running tool's key under `name` (one name per downstream call
    /// the tool makes), the same on every retry and re-execution of the tool.
    pub fn derive(mut self, name: impl Into<String>) -> Self {
        self.key = KeySource::Derived(Some(name.into()));
        self
    }

    /// Changes the reqwest request (headers, timeout, body…).
    pub fn with(mut self, f: impl FnOnce(RequestBuilder) -> RequestBuilder) -> Self {
        self.builder = f(self.builder);
        self
    }

    /// A form body.
    pub fn form<T: serde::Serialize + ?Sized>(self, form: &T) -> Self {
        self.with(|b| b.form(form))
    }

    /// A JSON body.
    pub fn json<T: serde::Serialize + ?Sized>(self, json: &T) -> Self {
        self.with(|b| b.json(json))
    }

    /// A header.
    pub fn header(self, name: &str, value: &str) -> Self {
        let (name, value) = (name.to_owned(), value.to_owned());
        self.with(|b| b.header(name, value))
    }

    /// Sends the request, retrying as the policy says, with the same key every time.
    pub async fn send(self) -> Result<IdemAnswer, ClientError> {
        let IdemRequest {
            client,
            method,
            builder,
            key,
        } = self;
        let mut request = builder.build().map_err(ClientError::Build)?;
        let key = (method == Method::POST || method == Method::PATCH).then(|| match key {
            KeySource::Explicit(key) => key,
            KeySource::Derived(name) => {
                let name = name.unwrap_or_else(|| format!("{method} {}", request.url().path()));
                match idem_runtime::current() {
                    Some(call) => call.derive(&name).as_str().to_owned(),
                    None => uuid::Uuid::new_v4().to_string(),
                }
            }
        });
        if let Some(key) = &key {
            idem_core::key::validate_key_string(key).map_err(ClientError::InvalidKey)?;
            let value = HeaderValue::from_str(key).expect("a valid key is a valid header value");
            request.headers_mut().insert(IDEMPOTENCY_KEY, value);
        }
        let policy = client.policy;
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= policy.max_attempts || started.elapsed() >= policy.budget;
            let this = request.try_clone().ok_or(ClientError::NotRetryable)?;
            let wait = match client.http.execute(this).await {
                Ok(response) => {
                    let replay = response
                        .headers()
                        .get(IDEMPOTENT_REPLAYED)
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                    let status = response.status();
                    if status == StatusCode::LOCKED && key.is_some() {
                        let detail = response.text().await.unwrap_or_default();
                        return Err(ClientError::OutcomeUnknown {
                            attempts: attempt,
                            detail,
                        });
                    }
                    let retryable = status == StatusCode::CONFLICT
                        || status == StatusCode::TOO_MANY_REQUESTS
                        || (status.is_server_error() && !replay);
                    if !retryable || last {
                        return Ok(IdemAnswer {
                            response,
                            attempts: attempt,
                            key,
                        });
                    }
                    match retry_after(&response, SystemTime::now()) {
                        Some(floor) => {
                            let left = policy.budget.saturating_sub(started.elapsed());
                            if floor > left {
                                return Err(ClientError::RetryAfterBeyondBudget {
                                    attempts: attempt,
                                    status,
                                    retry_after: floor,
                                    left,
                                });
                            }
                            policy.delay_at_least(attempt, floor)
                        }
                        None => policy.delay(attempt, None),
                    }
                }
                Err(e) if last || !(e.is_timeout() || e.is_connect() || e.is_request()) => {
                    return Err(ClientError::Transport {
                        attempts: attempt,
                        source: e,
                    });
                }
                Err(_) => policy.delay(attempt, None),
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// How long `Retry-After` asks to wait, read at `now`: seconds (`120`) or an HTTP date (`Wed, 21
/// Oct 2015 07:28:00 GMT`, zero once past); `None` when absent or unreadable.
fn retry_after(response: &Response, now: SystemTime) -> Option<Duration> {
    let value = response
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_in_seconds_or_as_an_http_date() {
        let response = |value: &str| {
            Response::from(
                http::Response::builder()
                    .status(429)
                    .header(http::header::RETRY_AFTER, value)
                    .body(Vec::<u8>::new())
                    .unwrap(),
            )
        };
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let read = |value: &str| retry_after(&response(value), now);
        assert_eq!(read("3"), Some(Duration::from_secs(3)));
        assert_eq!(read(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            read("Wed, 21 Oct 2015 07:28:30 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            read("Wed, 21 Oct 2015 07:27:00 GMT"),
            Some(Duration::ZERO),
            "past"
        );
        // The other two forms RFC 9110 asks recipients to accept.
        assert_eq!(
            read("Wednesday, 21-Oct-15 07:29:00 GMT"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            read("Wed Oct 21 07:28:05 2015"),
            Some(Duration::from_secs(5))
        );
        assert_eq!(read("-1"), None);
        assert_eq!(read("soon"), None);
    }
}
