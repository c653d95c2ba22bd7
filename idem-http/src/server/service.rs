//! The service: a guarded request is buffered, fingerprinted, claimed through the call protocol,
//! and either answered from its record or run once, in a task of its own, and recorded.

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, Limited};
use sha2::{Digest, Sha256};
use tower_service::Service;

use super::body::{Answer, AnswerBody, BoxError, GuardedRequestBody, GuardedResponseBody};
use super::config::{ANONYMOUS, Config};
use super::problem::{Problem, malformed};
use super::stored::{STREAMED, decode_response, encode_response, replayed, unknown};
use super::streamed::is_streamed;
use crate::parse_key_header;
use idem_core::StoreError;
use idem_core::fingerprint::{ArgsFingerprint, Fingerprint};
use idem_core::key::{KeyPart, derive_key};
use idem_core::store::{Orphans, RecordStatus};
use idem_runtime::protocol::{Claimed, Claiming, Intent, claim, claim_waiting};

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around another.
#[derive(Clone)]
pub struct Idempotent<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
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
        let principal = match (self.principal)(&parts) {
            Some(principal) => principal,
            None if self.shared_anonymous => ANONYMOUS.to_owned(),
            None => {
                return self.problem(
                    Problem::UnidentifiedCaller,
                    "a request with an Idempotency-Key must say who sends it (an Authorization \
                     header), so that no other caller can reach its key; nothing was run"
                        .to_owned(),
                );
            }
        };
        let fingerprint = fingerprint(&parts, &bytes, &self.skip);
        let req = Request::from_parts(parts, Either::Right(Full::new(bytes)));
        self.guarded(inner, key, principal, fingerprint, req)
            .await
            .map(Either::Right)
    }

    /// Claims the key and answers from the record (attaching to a response still being
    /// streamed), or runs the handler.
    async fn guarded<S, B, ResB>(
        self: Arc<Self>,
        inner: S,
        key: String,
        principal: String,
        fingerprint: Fingerprints,
        req: Request<GuardedRequestBody<B>>,
    ) -> Response<AnswerBody>
    where
        S: Service<Request<GuardedRequestBody<B>>, Response = Response<ResB>> + Send + 'static,
        S::Error: Into<BoxError> + Send,
        S::Future: Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        ResB: Body<Data = Bytes> + Send + 'static,
        ResB::Error: Into<BoxError>,
    {
        let idem = &self.idem;
        let parts = [KeyPart::new(&key).expect("a validated key string is a key part")];
        let key = derive_key(&principal, "http", &parts);
        let intent = Intent {
            tenant: principal.into(),
            key,
            tool: "http",
            fingerprint: fingerprint.current,
            lease: self.lease.unwrap_or(idem.default_lease()),
            ttl: self.ttl.unwrap_or(idem.default_ttl()),
            orphans: if self.rerun_orphans {
                Orphans::TakeOver
            } else {
                Orphans::Block
            },
            wait: self.wait(),
        };
        let (intent, claiming) = self.claim_key(intent, fingerprint.before_queries).await;
        let claiming = match claiming {
            // A response being streamed is followed at once, even by a request that may wait
            // (its wait would last until the stream's end).
            Ok(Claiming::InFlight(wait)) => match self.attach(&intent).await {
                Some(response) => return response,
                None if intent.wait.is_zero() => Ok(Claiming::InFlight(wait)),
                None => claim_waiting(idem, &intent).await,
            },
            claiming => claiming,
        };
        let claimed = match claiming {
            Ok(Claiming::Acquired(claimed)) => claimed,
            Err(e) => {
                return self.own_problem(
                    Problem::StoreUnavailable,
                    format!("{e}; the request was not processed, retry it with the same key"),
                );
            }
            Ok(Claiming::Mismatch) => {
                return self.own_problem(
                    Problem::KeyReused,
                    "this idempotency key was already used with another method, path, query or \
                     body; a new request needs a new key"
                        .to_owned(),
                );
            }
            Ok(Claiming::InFlight(wait)) => {
                let mut response = self.own_problem(
                    Problem::InFlight,
                    "the first request with this key is still being processed; retry later \
                     with the same key"
                        .to_owned(),
                );
                // Retry soon: the first request usually ends long before its lease, and
                // clients take `Retry-After` as a floor (never less than a second, unless
                // the lease has already lapsed).
                let seconds = (wait.min(Duration::from_secs(1)).as_millis() as u64).div_ceil(1000);
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
                return response;
            }
            Ok(Claiming::Unknown) => {
                return self.own_problem(
                    Problem::OutcomeUnknown,
                    "whether the first request with this key took effect is unknown; retrying \
                     cannot settle it: the service's operator resolves the key"
                        .to_owned(),
                );
            }
            Ok(Claiming::Completed(result)) if result == STREAMED => {
                let follower = self.follower(&intent);
                return match self.follow(follower).await {
                    Ok(Some(response)) => response,
                    Ok(None) => self.own_problem(
                        Problem::StoredResponseUnreadable,
                        "the stored response of this key was deleted while it was replayed"
                            .to_owned(),
                    ),
                    Err(response) => response,
                };
            }
            Ok(Claiming::Completed(result)) => {
                return match decode_response(result) {
                    Some(response) => replayed(response.map(AnswerBody::whole)),
                    None => self.own_problem(
                        Problem::StoredResponseUnreadable,
                        "the stored response of this key is damaged".to_owned(),
                    ),
                };
            }
        };
        // The key is ours: the handler runs in a task of its own, so a client that hangs up
        // cancels neither the handler nor the recording of its response.
        let (answer, answered) = tokio::sync::oneshot::channel();
        let config = self.clone();
        tokio::spawn(async move { config.run_handler(inner, claimed, req, answer).await });
        match answered.await {
            Ok(response) => response,
            Err(_) => self.own_problem(
                Problem::ServiceFailed,
                "the handler panicked; the key stays held until its lease lapses".to_owned(),
            ),
        }
    }

    /// Claims `intent`'s key; a request with a query whose key holds a record of another
    /// fingerprint claims it again by the fingerprint builds before queries counted gave it
    /// (`before_queries`), so that a record they wrote still answers its retries. Answers the
    /// intent the claim stands for.
    async fn claim_key(
        &self,
        intent: Intent,
        before_queries: Option<Fingerprint>,
    ) -> (Intent, Result<Claiming, StoreError>) {
        let claiming = claim(&self.idem, &intent).await;
        let (Ok(Claiming::Mismatch), Some(before)) = (&claiming, before_queries) else {
            return (intent, claiming);
        };
        let older = Intent {
            fingerprint: before,
            ..intent.clone()
        };
        match claim(&self.idem, &older).await {
            Ok(Claiming::Mismatch) => (intent, claiming),
            // The record went between the two claims: this one is not the older build's.
            Ok(Claiming::Acquired(claimed)) => {
                let _ = claimed.release().await;
                let again = claim(&self.idem, &intent).await;
                (intent, again)
            }
            other => (older, other),
        }
    }

    /// Runs the handler on a claimed key and records its response (or releases the key when
    /// its status says nothing happened); sends the response to `answer` once the client may
    /// have it (a streamed one at its head).
    async fn run_handler<S, B, ResB>(
        self: Arc<Self>,
        mut inner: S,
        claimed: Claimed,
        req: Request<GuardedRequestBody<B>>,
        answer: Answer,
    ) where
        S: Service<Request<GuardedRequestBody<B>>, Response = Response<ResB>>,
        S::Error: Into<BoxError>,
        ResB: Body<Data = Bytes>,
        ResB::Error: Into<BoxError>,
    {
        // The handler runs, and its response body is produced, under the claim's lease,
        // renewed all along.
        let called = claimed
            .hold(async {
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                inner.call(req).await
            })
            .await;
        let Ok(response) = called else {
            let _ = claimed.release().await;
            let _ = answer.send(self.own_problem(
                Problem::ServiceFailed,
                "the service failed before answering; retry with the same key".to_owned(),
            ));
            return;
        };
        let (parts, body) = response.into_parts();
        if is_streamed(&parts, &body) {
            self.record_stream(claimed, parts, body, answer).await;
        } else {
            self.record_whole(claimed, parts, body, answer).await;
        }
    }

    /// Collects a response's body, records the response, and answers it.
    pub(super) async fn record_whole<ResB>(
        &self,
        claimed: Claimed,
        parts: http::response::Parts,
        body: ResB,
        answer: Answer,
    ) where
        ResB: Body<Data = Bytes>,
        ResB::Error: Into<BoxError>,
    {
        let Ok(collected) = claimed.hold(body.collect()).await else {
            // The handler ran but its answer broke off: whether it took effect is unknown, and
            // the key says so (a retry cannot settle it, and must not run it again).
            unknown(&claimed).await;
            let _ = answer.send(
                self.own_problem(
                    Problem::ServiceFailed,
                    "the response body failed while it was produced; whether the request took \
                 effect is unknown, and its key is blocked"
                        .to_owned(),
                ),
            );
            return;
        };
        let body = collected.to_bytes();
        if (self.stores)(parts.status) {
            let encoded =
                encode_response(parts.status, &parts.headers, &self.replay_headers, &body);
            // Tried again through store errors while the lease lasts (the handler's task
            // outlives a client that hangs up). A completion that fails for good or was fenced
            // out leaves the key to its lease; the client still gets the handler's answer.
            let _ = claimed
                .complete_retrying(RecordStatus::Completed, &encoded)
                .await;
        } else {
            let _ = claimed.release().await;
        }
        let _ = answer.send(Response::from_parts(parts, AnswerBody::whole(body)));
    }
}

/// What a guarded request is fingerprinted by: its method, path, query and body. The query is
/// read as its name-value pairs, decoded and sorted; a JSON or form body as its fields (`skip`
/// leaves some out; order and spacing do not count), any other body as its bytes.
fn fingerprint(parts: &http::request::Parts, body: &Bytes, skip: &[Vec<String>]) -> Fingerprints {
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim())
        .unwrap_or_default();
    let canonical = if content_type.eq_ignore_ascii_case("application/json") {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .map(|mut json| {
                for path in skip {
                    remove_path(&mut json, path);
                }
                CanonicalBody::Json(json)
            })
    } else if content_type.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        // A skipped path's segments came from splitting at dots, so a name is skipped when it
        // splits into them.
        let skipped = |name: &str| {
            skip.iter()
                .any(|path| name.split('.').eq(path.iter().map(String::as_str)))
        };
        Some(CanonicalBody::Form(sorted_pairs(body, |name| {
            !skipped(name)
        })))
    } else {
        None
    }
    .unwrap_or_else(|| CanonicalBody::Bytes(idem_core::hex::encode(&Sha256::digest(body))));
    let of = |query: Option<&[(Cow<'_, str>, Cow<'_, str>)]>| {
        let mut args = ArgsFingerprint::new(&[])
            .arg("method", parts.method.as_str())
            .arg("path", parts.uri.path());
        if let Some(query) = query {
            args = args.arg("query", &query);
        }
        args.arg("body", &canonical)
            .finish(idem_runtime::DEFAULT_MAX_ARGUMENT_BYTES)
            .unwrap_or_else(|_| {
                // JSON parsed from text always canonicalizes; keep the bytes if it ever did not.
                Fingerprint::from_bytes(Sha256::digest(body).into())
            })
    };
    // The query as its name-value pairs, as a form body's: `?b=2&a=%31` is `?a=1&b=2`.
    let query = parts
        .uri
        .query()
        .filter(|q| !q.is_empty())
        .map(|q| sorted_pairs(q.as_bytes(), |_| true));
    match query {
        // A request without a query is fingerprinted as before queries counted.
        None => Fingerprints {
            current: of(None),
            before_queries: None,
        },
        Some(query) => Fingerprints {
            current: of(Some(&query)),
            before_queries: Some(of(None)),
        },
    }
}

/// The name-value pairs of a form-encoded text (a form body, a query) whose names `keep`
/// keeps, decoded and sorted, so that neither their order nor their encoding counts; they
/// borrow the text where they need no decoding.
fn sorted_pairs(encoded: &[u8], keep: impl Fn(&str) -> bool) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    let mut pairs: Vec<_> = form_urlencoded::parse(encoded)
        .filter(|(name, _)| keep(name))
        .collect();
    pairs.sort();
    pairs
}

/// A request's fingerprint, and for a request with a query the fingerprint earlier builds gave
/// it (the query left out: they did not count queries), which records they wrote still hold.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fingerprints {
    pub(super) current: Fingerprint,
    pub(super) before_queries: Option<Fingerprint>,
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
            let mut response = Response::new(Either::Right(AnswerBody::whole(Bytes::new())));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    }
}

/// What a request body is fingerprinted as.
#[derive(serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum CanonicalBody<'a> {
    Json(serde_json::Value),
    Form(Vec<(Cow<'a, str>, Cow<'a, str>)>),
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::Request;

    use super::fingerprint;

    fn hex_of(content_type: &str, body: &'static str, skip: &[Vec<String>]) -> String {
        let (parts, ()) = Request::post("/v1/payment_intents")
            .header("content-type", content_type)
            .body(())
            .expect("request")
            .into_parts();
        let fp = fingerprint(&parts, &Bytes::from_static(body.as_bytes()), skip);
        assert!(fp.before_queries.is_none(), "no query");
        idem_core::hex::encode(fp.current.as_bytes())
    }

    /// A stored fingerprint must still match after an upgrade, or every retry of a request
    /// made before it would be refused as a reused key: these values are pinned. The form's
    /// fields in another order, its media type in other case with a parameter, and skipped
    /// fields (a dotted name too), all fingerprint as the form itself.
    #[test]
    fn request_fingerprints_are_pinned() {
        let none: &[Vec<String>] = &[];
        const FORM: &str = "7c9e0662e849250a9de2245d2ed3f9d7bbf1778f932e88989569ee7418774b22";
        let form = "amount=500&currency=eur&customer=cus_42&memo=caf%C3%A9+noir";
        let pinned = [
            (
                hex_of("application/x-www-form-urlencoded", form, none),
                FORM,
            ),
            (
                hex_of(
                    "Application/X-WWW-Form-Urlencoded; charset=utf-8",
                    form,
                    none,
                ),
                FORM,
            ),
            (
                hex_of(
                    "application/x-www-form-urlencoded",
                    "memo=caf%C3%A9+noir&customer=cus_42&meta.trace=t1&currency=eur&amount=500&nonce=7",
                    &[
                        vec!["nonce".to_owned()],
                        vec!["meta".to_owned(), "trace".to_owned()],
                    ],
                ),
                FORM,
            ),
            (
                hex_of(
                    "application/json",
                    r#"{"b": [1, "x"], "a": {"c": null}}"#,
                    none,
                ),
                "dac70908d934f23a66ca1db0702f3993eddbfbbe7af23e56259a554f676fe85d",
            ),
            (
                hex_of("text/plain", "hello", none),
                "d3287a65df2f984b64c9e32a43d66d4d7c4aab9c384f7acada0f54fef024b711",
            ),
        ];
        for (got, want) in pinned {
            assert_eq!(got, want);
        }
    }
}

#[cfg(test)]
mod before_queries {
    use std::convert::Infallible;
    use std::future::Ready;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use tower_layer::Layer;
    use tower_service::Service;

    use super::fingerprint;
    use crate::server::IdempotencyLayer;
    use crate::server::body::GuardedRequestBody;
    use crate::server::config::default_principal;
    use crate::server::stored::encode_response;
    use idem_core::key::{KeyPart, derive_key};
    use idem_core::store::{Claim, ClaimRequest, Completion, Orphans, RecordStatus};
    use idem_runtime::Idem;

    /// A handler that counts its runs and answers `new answer`.
    #[derive(Clone)]
    struct Counted(Arc<AtomicUsize>);

    impl Service<Request<GuardedRequestBody<Full<Bytes>>>> for Counted {
        type Response = Response<Full<Bytes>>;
        type Error = Infallible;
        type Future = Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<GuardedRequestBody<Full<Bytes>>>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(
                b"new answer",
            )))))
        }
    }

    fn charge(query: &str) -> Request<Full<Bytes>> {
        Request::post(format!("/v1/charges?{query}"))
            .header("authorization", "Bearer sk_test_old")
            .header("idempotency-key", "charge-7")
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    /// A record an earlier build wrote for a request with a query (fingerprinted without it)
    /// still answers that request's retries after the upgrade, instead of a 422.
    #[tokio::test]
    async fn a_record_from_before_queries_counted_still_replays() {
        let idem = Idem::open("memory://").await.unwrap();
        let (parts, ()) = charge("amount=1").map(|_| ()).into_parts();
        let fingerprints = fingerprint(&parts, &Bytes::new(), &[]);
        let before = fingerprints.before_queries.expect("a request with a query");
        assert_ne!(before, fingerprints.current);
        // What the earlier build wrote: the key under the caller's principal, completed.
        let tenant = default_principal(&parts).unwrap();
        let key = derive_key(&tenant, "http", &[KeyPart::new("charge-7").unwrap()]);
        let now = idem.clock().now();
        let claim = idem
            .store()
            .claim(ClaimRequest {
                tenant: &tenant,
                key,
                tool: "http",
                fingerprint: before,
                now,
                lease: idem.default_lease(),
                ttl: idem.default_ttl(),
                orphans: Orphans::Block,
            })
            .await
            .unwrap();
        let Claim::Acquired { token, .. } = claim else {
            panic!("a new key: {claim:?}");
        };
        let stored = encode_response(StatusCode::CREATED, &http::HeaderMap::new(), &[], b"old");
        let completion = Completion {
            tenant: &tenant,
            key,
            token,
            status: RecordStatus::Completed,
            result: &stored,
            now,
            ttl: idem.default_ttl(),
            notify: false,
        };
        idem.store().complete(completion).await.unwrap();

        let runs = Arc::new(AtomicUsize::new(0));
        let mut service = IdempotencyLayer::new(idem).layer(Counted(runs.clone()));
        let answer = service.call(charge("amount=1")).await.unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
        assert_eq!(answer.headers()["idempotent-replayed"], "true");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"old", "the earlier build's answer");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "not run again");
    }
}
