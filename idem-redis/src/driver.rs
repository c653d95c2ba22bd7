//! What crosses the driver (redis-rs): its errors as the store's, and idem's values as the
//! scripts' arguments and the records' fields spell them.

use std::time::Duration;

use idem_core::store::{FencingToken, UnixMillis};
use idem_core::{StoreError, StoreErrorKind};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

/// The backend's name, in errors and reports.
pub(crate) const BACKEND: &str = "redis";

/// Classifies a driver error; the driver's own text stays in `source()`.
pub(crate) fn redis_error(op: &str, e: RedisError) -> StoreError {
    if let Some(tls) = idem_core::store::tls::tls_failure(&e) {
        let cause = format!(
            "{op}: the TLS handshake failed ({tls}): check `tls_ca` (the CA) and the host name in \
             the URL against the server's certificate"
        );
        return StoreError::with_source(BACKEND, StoreErrorKind::Unavailable, cause, e);
    }
    let (kind, cause) = if e.is_timeout() {
        (StoreErrorKind::Timeout, "the server did not answer in time")
    } else if e.is_connection_refusal() {
        (StoreErrorKind::Unavailable, "cannot reach the server")
    } else if e.is_connection_dropped() || e.is_io_error() {
        (StoreErrorKind::Unavailable, "the connection was lost")
    } else {
        match e.kind() {
            ErrorKind::AuthenticationFailed => (
                StoreErrorKind::Unavailable,
                "the server refused the credentials",
            ),
            ErrorKind::Server(ServerErrorKind::NoPerm) => (
                StoreErrorKind::Unavailable,
                "the user lacks a permission idem needs",
            ),
            ErrorKind::Server(ServerErrorKind::BusyLoading) => (
                StoreErrorKind::Unavailable,
                "the server is loading its data",
            ),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown) => (
                StoreErrorKind::Unavailable,
                "the server does not accept writes",
            ),
            ErrorKind::Server(ServerErrorKind::ClusterDown | ServerErrorKind::TryAgain) => {
                (StoreErrorKind::Unavailable, "the cluster is unavailable")
            }
            ErrorKind::Server(_) if e.to_string().contains("DB index is out of range") => (
                StoreErrorKind::Unavailable,
                "the database number does not exist on this server",
            ),
            ErrorKind::Server(_) if e.code() == Some("WRONGTYPE") => (
                StoreErrorKind::Corrupt,
                "a key under idem's prefix holds something else",
            ),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => (
                StoreErrorKind::Corrupt,
                "the server answered something unexpected",
            ),
            _ => (StoreErrorKind::Other, "the server reported an error"),
        }
    };
    StoreError::with_source(BACKEND, kind, format!("{op}: {cause}"), e)
}

pub(crate) fn corrupt(op: &str, what: &str) -> StoreError {
    StoreError::new(BACKEND, StoreErrorKind::Corrupt, format!("{op}: {what}"))
}

/// A time as the record lays it out: 16 digits, below 2^53 so that Lua compares it exactly.
pub(crate) fn time_arg(t: UnixMillis) -> String {
    format!("{:016}", time_bound(t))
}

/// A time bounded below 2^53 (see [`time_arg`]).
pub(crate) fn time_bound(t: UnixMillis) -> UnixMillis {
    t.min(1 << 53)
}

/// A token as the record lays it out: 19 digits.
pub(crate) fn token_arg(token: FencingToken) -> String {
    format!("{:019}", token.get())
}

pub(crate) fn millis_arg(d: Duration) -> String {
    d.as_millis().clamp(1, 1 << 53).to_string()
}

pub(crate) fn int(op: &str, v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt(op, "a number field is not a number")),
        _ => Err(corrupt(op, "a number field has the wrong type")),
    }
}

/// Sends what `send` makes, and once more when the connection broke under it: for commands
/// and scripts that are harmless delivered twice.
pub(crate) async fn again_if_broken<T, F, Fut>(op: &str, send: F) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    match send().await {
        Err(e) if e.is_connection_dropped() || e.is_io_error() => send().await,
        other => other,
    }
    .map_err(|e| redis_error(op, e))
}
