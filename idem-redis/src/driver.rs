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

/// Appends `n` in decimal, zero-padded to `width` digits (`format!("{n:0width$}")` without the
/// formatter: records are spelled on every claim and completion, and `write!` with padding
/// cost 2,000 instructions a record by callgrind).
pub(crate) fn push_padded(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(n).as_bytes();
    out.extend(std::iter::repeat_n(
        b'0',
        width.saturating_sub(digits.len()),
    ));
    out.extend_from_slice(digits);
}

/// `n` zero-padded to `width` digits, as [`push_padded`] spells it.
fn padded(n: u64, width: usize) -> String {
    let mut out = Vec::with_capacity(20);
    push_padded(&mut out, n, width);
    String::from_utf8(out).expect("decimal digits are ASCII")
}

/// A time as the record lays it out: 16 digits, below 2^53 so that Lua compares it exactly.
pub(crate) fn time_arg(t: UnixMillis) -> String {
    padded(time_bound(t), 16)
}

/// A time bounded below 2^53 (see [`time_arg`]).
pub(crate) fn time_bound(t: UnixMillis) -> UnixMillis {
    t.min(1 << 53)
}

/// A token as the record lays it out: 19 digits.
pub(crate) fn token_arg(token: FencingToken) -> String {
    padded(token.get(), 19)
}

/// A duration in whole milliseconds, at least 1 and below 2^53 (as `PX` and the scripts read it).
pub(crate) fn millis_arg(d: Duration) -> String {
    let millis = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    padded(millis.clamp(1, 1 << 53), 1)
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

#[cfg(test)]
mod tests {
    use super::{millis_arg, push_padded, time_arg, token_arg};
    use idem_core::store::FencingToken;
    use std::time::Duration;

    /// The digits are the formatter's, at every width, for numbers shorter and longer than it.
    #[test]
    fn padded_numbers_are_spelled_as_the_formatter_spells_them() {
        let mut numbers = vec![0, 1, 9, 10, 99, 100, u64::MAX, u64::MAX / 10, 1 << 53];
        numbers.extend((0..64).map(|shift| (1u64 << shift) - 1));
        numbers.extend((0..20).map(|power| 10u64.pow(power)));
        for n in numbers {
            for width in [0, 1, 4, 16, 19, 20, 24] {
                let mut out = b"x".to_vec();
                push_padded(&mut out, n, width);
                assert_eq!(out, format!("x{n:0width$}").into_bytes(), "{n} at {width}");
            }
        }
        assert_eq!(time_arg(42), "0000000000000042");
        assert_eq!(time_arg(u64::MAX), format!("{:016}", 1u64 << 53));
        assert_eq!(token_arg(FencingToken::from_raw(7)), "0000000000000000007");
        assert_eq!(millis_arg(Duration::from_micros(10)), "1");
        assert_eq!(millis_arg(Duration::from_secs(86_400)), "86400000");
        assert_eq!(millis_arg(Duration::MAX), (1u64 << 53).to_string());
    }
}
