//! What crosses the driver (tokio-postgres, deadpool): its errors as the store's, and idem's
//! values as the schema's columns hold them.

use std::time::Duration;

use deadpool_postgres::PoolError;
use idem_core::store::{Orphans, UnixMillis};
use idem_core::{StoreError, StoreErrorKind};
use tokio_postgres::error::SqlState;

/// The backend's name, in errors and reports.
pub(crate) const BACKEND: &str = "postgres";

/// Classifies a driver error; the driver's own text stays in `source()`.
pub(crate) fn pg_error(op: &str, e: tokio_postgres::Error) -> StoreError {
    if let Some(tls) = idem_core::store::tls::tls_failure(&e) {
        let cause = format!(
            "{op}: the TLS handshake failed ({tls}): check `sslrootcert` (the CA) and the host \
             name in the URL against the server's certificate"
        );
        return StoreError::with_source(BACKEND, StoreErrorKind::Unavailable, cause, e);
    }
    if e.code() == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
        && e.as_db_error()
            .is_some_and(|db| db.message().contains("no encryption"))
    {
        let cause = format!(
            "{op}: the server accepts only encrypted connections: set `sslmode=require` or \
             stronger"
        );
        return StoreError::with_source(BACKEND, StoreErrorKind::Unavailable, cause, e);
    }
    if let Some(db) = e.as_db_error() {
        let message = db.message();
        if message.contains("unsupported startup parameter")
            || (message.contains("prepared statement") && message.contains("exist"))
        {
            let cause = format!(
                "{op}: the server is behind a transaction pooler (PgBouncer?): add \
                 `pooler=transaction` to the URL"
            );
            return StoreError::with_source(BACKEND, StoreErrorKind::Other, cause, e);
        }
    }
    let (kind, cause) = match e.code() {
        Some(code)
            if *code == SqlState::UNDEFINED_TABLE || *code == SqlState::UNDEFINED_FUNCTION =>
        {
            (
                StoreErrorKind::Schema,
                "idem's tables are missing (dropped?); reopen the store to recreate them",
            )
        }
        Some(code)
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            (
                StoreErrorKind::Unavailable,
                "the server refused the credentials",
            )
        }
        Some(code) if *code == SqlState::INVALID_CATALOG_NAME => {
            (StoreErrorKind::Unavailable, "the database does not exist")
        }
        Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => (
            StoreErrorKind::Unavailable,
            "the user lacks a privilege idem needs",
        ),
        Some(code) if *code == SqlState::QUERY_CANCELED => {
            (StoreErrorKind::Timeout, "the statement timed out")
        }
        Some(code)
            if *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::TOO_MANY_CONNECTIONS =>
        {
            (
                StoreErrorKind::Unavailable,
                "the server is shutting down, starting up or full",
            )
        }
        Some(code) if *code == SqlState::T_R_SERIALIZATION_FAILURE => (
            StoreErrorKind::Timeout,
            "the record kept changing under the claim",
        ),
        Some(_) => (StoreErrorKind::Other, "the server reported an error"),
        None if e.is_closed() => (StoreErrorKind::Unavailable, "the connection was closed"),
        None => (StoreErrorKind::Unavailable, "cannot reach the server"),
    };
    StoreError::with_source(BACKEND, kind, format!("{op}: {cause}"), e)
}

pub(crate) fn pool_error(op: &str, e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => pg_error(op, e),
        PoolError::Timeout(_) => StoreError::new(
            BACKEND,
            StoreErrorKind::Timeout,
            format!("{op}: no connection became available in time (server down or pool exhausted)"),
        ),
        PoolError::Closed => StoreError::new(
            BACKEND,
            StoreErrorKind::Closed,
            format!("{op}: the pool is closed"),
        ),
        other => StoreError::with_source(
            BACKEND,
            StoreErrorKind::Unavailable,
            format!("{op}: cannot get a connection"),
            other,
        ),
    }
}

/// Whether an operation may have failed only because its connection broke, so that sending it
/// again on another connection is the right thing to do.
pub(crate) fn connection_broke(e: &StoreError) -> bool {
    e.kind() == StoreErrorKind::Unavailable
        && std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
            .is_some_and(|pg| match pg.code() {
                None => true,
                // The server ended the session (a restart, an administrator): a new connection
                // may well work.
                Some(code) => {
                    pg.is_closed()
                        || *code == SqlState::ADMIN_SHUTDOWN
                        || *code == SqlState::CRASH_SHUTDOWN
                        || *code == SqlState::CANNOT_CONNECT_NOW
                }
            })
}

pub(crate) fn db_time(t: UnixMillis) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

/// The claim function's `p_orphans`: 0 take over, 1 reconcile, 2 block.
pub(crate) fn orphans_code(orphans: Orphans) -> i16 {
    match orphans {
        Orphans::TakeOver => 0,
        Orphans::Reconcile => 1,
        Orphans::Block => 2,
    }
}

pub(crate) fn db_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn corrupt(op: &str, what: &str) -> StoreError {
    StoreError::new(BACKEND, StoreErrorKind::Corrupt, format!("{op}: {what}"))
}

pub(crate) fn bytes32(op: &str, bytes: &[u8]) -> Result<[u8; 32], StoreError> {
    bytes
        .try_into()
        .map_err(|_| corrupt(op, "a 32-byte column has another length"))
}
