//! What crosses the driver (rusqlite): its errors as the store's, and idem's values as SQLite's
//! columns hold them.

use idem_core::store::{RecordStatus, UnixMillis};
use idem_core::{StoreError, StoreErrorKind};
use rusqlite::ErrorCode;

/// The backend's name, in errors and reports.
pub(crate) const BACKEND: &str = "sqlite";

/// A driver error as the store's, by SQLite's error code.
pub(crate) fn sql_error(op: &str, e: rusqlite::Error) -> StoreError {
    let kind = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreErrorKind::Timeout,
        Some(
            ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure,
        ) => StoreErrorKind::Unavailable,
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreErrorKind::Corrupt,
        _ if matches!(e, rusqlite::Error::SqliteFailure(_, Some(ref m)) if m.starts_with("no such table")) => {
            StoreErrorKind::Schema
        }
        _ => StoreErrorKind::Other,
    };
    StoreError::with_source(BACKEND, kind, format!("{op} failed"), e)
}

pub(crate) fn closed() -> StoreError {
    StoreError::new(
        BACKEND,
        StoreErrorKind::Closed,
        "a writer panicked while holding the write connection",
    )
}

/// Clamps a time to SQLite's signed 64-bit integers.
pub(crate) fn db_time(t: UnixMillis) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

pub(crate) fn bytes32(op: &str, blob: Vec<u8>) -> Result<[u8; 32], StoreError> {
    blob.try_into().map_err(|_| {
        StoreError::new(
            BACKEND,
            StoreErrorKind::Corrupt,
            format!("{op}: a 32-byte column has another length"),
        )
    })
}

pub(crate) fn status(op: &str, s: &str) -> Result<RecordStatus, StoreError> {
    RecordStatus::parse(s).ok_or_else(|| {
        StoreError::new(
            BACKEND,
            StoreErrorKind::Corrupt,
            format!("{op}: unknown status `{s}`"),
        )
    })
}

pub(crate) fn unexpected() -> StoreError {
    StoreError::new(
        BACKEND,
        StoreErrorKind::Other,
        "the write path answered another operation",
    )
}
