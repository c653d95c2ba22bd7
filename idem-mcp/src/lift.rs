//! The key a client sends beside a `tools/call`'s arguments (`params.idempotencyKey`, as MCP's
//! idempotency proposal puts it), moved into the request's `_meta` before rmcp reads the
//! request: rmcp keeps no params it does not know, and [`MetaKeys`](crate::MetaKeys) reads
//! `_meta`. Over stdio: [`lift_keys`]; over streamable HTTP: [`LiftKeysLayer`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Request;
use http_body::Body;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};

/// How much a line may wait in the pipe between the lifting task and rmcp.
const PIPE: usize = 64 * 1024;

/// Moves a `tools/call` request's `params.idempotencyKey` into `params._meta.idempotencyKey`
/// (the field left in place: rmcp ignores it); answers whether it moved one. A `_meta` that
/// already holds another `idempotencyKey` keeps it, and the moved key goes to
/// `_meta.idempotency_key`, so that [`MetaKeys`](crate::MetaKeys) refuses the two.
pub fn lift_key(message: &mut Value) -> bool {
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return false;
    }
    let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
        return false;
    };
    let Some(key) = params.get("idempotencyKey").cloned() else {
        return false;
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Default::default()));
    let Some(meta) = meta.as_object_mut() else {
        return false;
    };
    match meta.get("idempotencyKey") {
        None => {
            meta.insert("idempotencyKey".to_owned(), key);
        }
        Some(held) if *held == key => {}
        Some(_) => {
            meta.insert("idempotency_key".to_owned(), key);
        }
    }
    true
}

/// `input` (newline-delimited JSON-RPC, as MCP's stdio transport sends it) with each line's
/// keys lifted into `_meta` as [`LiftKeysLayer`] lifts a body's (one message, or a batch);
/// lines that are not JSON pass as they are, for rmcp to answer. Serve rmcp on `(lift_keys(tokio::io::stdin()), tokio::io::stdout())`. A task of
/// the current runtime does the reading; it ends with `input`.
pub fn lift_keys<R>(input: R) -> impl AsyncRead + Send + Unpin + 'static
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let (mut to_rmcp, from_input) = tokio::io::duplex(PIPE);
    tokio::spawn(async move {
        let mut lines = BufReader::new(input).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let line = lift_in_body(Bytes::from(line));
            if to_rmcp.write_all(&line).await.is_err() || to_rmcp.write_all(b"\n").await.is_err() {
                return;
            }
        }
    });
    from_input
}

/// A tower layer for MCP over streamable HTTP: each request's JSON body (one message or a
/// batch) has its `tools/call`s' keys lifted into `_meta` ([`lift_key`]) before the service it
/// wraps (rmcp's `StreamableHttpService`) reads it. Other bodies pass as they are; a body that
/// cannot be read goes on empty, for the service to refuse.
#[derive(Debug, Clone, Copy, Default)]
pub struct LiftKeysLayer;

impl<S> tower_layer::Layer<S> for LiftKeysLayer {
    type Service = LiftKeys<S>;

    fn layer(&self, inner: S) -> LiftKeys<S> {
        LiftKeys { inner }
    }
}

/// The service [`LiftKeysLayer`] wraps around another.
#[derive(Debug, Clone)]
pub struct LiftKeys<S> {
    inner: S,
}

impl<S, B> tower_service::Service<Request<B>> for LiftKeys<S>
where
    S: tower_service::Service<Request<Full<Bytes>>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was made ready serves this request; the fresh one waits for the next.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .unwrap_or_default();
            inner
                .call(Request::from_parts(parts, Full::new(lift_in_body(bytes))))
                .await
        })
    }
}

/// A JSON-RPC body (a message, or a batch) with its `tools/call`s' keys lifted; anything else
/// as it came.
fn lift_in_body(bytes: Bytes) -> Bytes {
    let Ok(mut message) = serde_json::from_slice::<Value>(&bytes) else {
        return bytes;
    };
    let lifted = match &mut message {
        Value::Array(batch) => batch
            .iter_mut()
            .fold(false, |any, message| lift_key(message) | any),
        one => lift_key(one),
    };
    if lifted {
        Bytes::from(message.to_string())
    } else {
        bytes
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::json;
    use tokio::io::AsyncReadExt;

    use super::{lift_in_body, lift_key, lift_keys};

    #[test]
    fn bodies_and_batches_are_lifted_and_others_pass() {
        let call = json!({"method": "tools/call", "params": {"idempotencyKey": "k"}});
        let one = lift_in_body(Bytes::from(call.to_string()));
        let one: serde_json::Value = serde_json::from_slice(&one).unwrap();
        assert_eq!(one["params"]["_meta"]["idempotencyKey"], "k");
        let batch = json!([call, {"method": "ping"}]);
        let batch = lift_in_body(Bytes::from(batch.to_string()));
        let batch: serde_json::Value = serde_json::from_slice(&batch).unwrap();
        assert_eq!(batch[0]["params"]["_meta"]["idempotencyKey"], "k");
        assert_eq!(batch[1], json!({"method": "ping"}));
        let untouched = Bytes::from_static(b"{\"method\": \"ping\"}");
        assert_eq!(lift_in_body(untouched.clone()), untouched, "byte for byte");
        assert_eq!(lift_in_body(Bytes::from_static(b"nope")), "nope");
    }

    #[test]
    fn a_params_key_moves_into_meta() {
        let mut call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "refund", "arguments": {}, "idempotencyKey": "r-3"}});
        assert!(lift_key(&mut call));
        assert_eq!(call["params"]["_meta"]["idempotencyKey"], "r-3");
        let mut both = json!({"method": "tools/call",
            "params": {"idempotencyKey": "r-3", "_meta": {"idempotencyKey": "r-4"}}});
        assert!(lift_key(&mut both));
        assert_eq!(both["params"]["_meta"]["idempotencyKey"], "r-4");
        assert_eq!(
            both["params"]["_meta"]["idempotency_key"], "r-3",
            "for MetaKeys to refuse"
        );
        let mut other = json!({"method": "tools/list", "params": {"idempotencyKey": "x"}});
        assert!(!lift_key(&mut other));
        assert!(other["params"].get("_meta").is_none());
        let mut keyless = json!({"method": "tools/call", "params": {"name": "refund"}});
        assert!(!lift_key(&mut keyless));
    }

    #[tokio::test]
    async fn lines_are_lifted_in_order_and_others_pass() {
        let input = concat!(
            "{\"method\":\"tools/call\",\"params\":{\"idempotencyKey\":\"k\"}}\n",
            "not json\n",
            "[{\"method\":\"tools/call\",\"params\":{\"idempotencyKey\":\"b\"}}]\n",
        )
        .as_bytes();
        let mut lifted = lift_keys(input);
        let mut out = String::new();
        lifted.read_to_string(&mut out).await.unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(first["params"]["_meta"]["idempotencyKey"], "k");
        assert_eq!(lines[1], "not json");
        let batch: serde_json::Value = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(
            batch[0]["params"]["_meta"]["idempotencyKey"], "b",
            "a batch too"
        );
    }
}
