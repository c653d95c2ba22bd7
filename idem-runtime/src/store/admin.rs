//! What operators need of a store, apart from what every call needs ([`Store`]): walk the
//! records, and resolve the ones nobody can decide automatically.
//!
//! Every built-in backend implements [`AdminStore`]; [`open`] opens one by URL, as
//! [`Idem::open`](crate::Idem::open) does. The `idem` command-line tool is built on it.

use std::sync::Arc;

use super::{FencingToken, Record, RecordStatus, Store, StoreFuture, UnixMillis};
use crate::error::OpenError;
use crate::key::IdempotencyKey;

/// How a blocked record is resolved by an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution<'a> {
    /// The effect happened: the record becomes `completed` with this result (encoded as the
    /// tool stores results), and retries replay it.
    Complete {
        /// The encoded result.
        result: &'a [u8],
    },
    /// The effect did not happen: the record is deleted, and the next call runs the body.
    Release,
}

/// One page of [`AdminStore::scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The records of this page.
    pub records: Vec<Record>,
    /// Where the next page starts; `None` after the last one.
    pub next: Option<String>,
}

/// The operations of operators: walking records and resolving blocked ones.
pub trait AdminStore: Store {
    /// Up to `limit` records (of `tenant` only, when given), from `cursor` (`None`: the first
    /// page) on. Expired records that are not purged yet are included. The cursor is opaque and
    /// backend-specific. SQL stores walk in (tenant, key) order, each record once, with exact
    /// pages; Redis walks its keyspace with `SCAN`: in no order, pages of about `limit`, and a
    /// record may come twice.
    fn scan<'a>(
        &'a self,
        tenant: Option<&'a str>,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Page>;

    /// Resolves a blocked record: one that is `unknown`, or `in_flight` with a lease lapsed
    /// by `now`. `reason` is kept with a completed record ([`Record::note`]). Answers
    /// [`Fenced::Lost`](super::Fenced::Lost) when the record is gone or not blocked (it
    /// completed, or its owner is alive), and then changes nothing.
    fn resolve<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        resolution: Resolution<'a>,
        reason: &'a str,
        now: UnixMillis,
    ) -> StoreFuture<'a, super::Fenced>;

    /// Deletes a record whatever its state (operators' housekeeping: acknowledging a
    /// dead-letter entry). Answers [`Fenced::Lost`](super::Fenced::Lost) when there was none.
    fn delete<'a>(&'a self, tenant: &'a str, key: IdempotencyKey)
    -> StoreFuture<'a, super::Fenced>;

    /// The server's clock, for comparing with the callers' (a claim's lease and TTL are
    /// measured by the caller's clock). `None` for embedded stores, whose clock is the caller's.
    fn server_time(&self) -> StoreFuture<'_, Option<UnixMillis>> {
        Box::pin(async { Ok(None) })
    }
}

/// Whether `record` is blocked at `now`: `unknown`, or `in_flight` with a lapsed lease.
pub fn is_blocked(record: &Record, now: UnixMillis) -> bool {
    match record.status {
        RecordStatus::Unknown => true,
        RecordStatus::InFlight => record.lease_expires_at <= now,
        RecordStatus::Completed => false,
    }
}

/// A token no claim ever hands out (claims give 1 and up), to mark a record an operator
/// resolved.
pub const RESOLVED_TOKEN: FencingToken = FencingToken::from_raw(0);

/// Opens the store named by `url` for administration (the same URLs as
/// [`Idem::open`](crate::Idem::open)).
pub async fn open(url: &str) -> Result<Arc<dyn AdminStore>, OpenError> {
    super::open::open(url).await
}

/// A page from `limit + 1` records in order: the extra one says whether there is more.
pub(crate) fn page(mut records: Vec<Record>, limit: usize) -> Page {
    let next = (records.len() > limit).then(|| {
        records.truncate(limit);
        let last = records.last().expect("a full page");
        cursor_after(&last.tenant, &last.key)
    });
    Page { records, next }
}

/// The cursor after the record (`tenant`, `key`), for backends that walk in (tenant, key) order.
pub(crate) fn cursor_after(tenant: &str, key: &IdempotencyKey) -> String {
    let mut out = crate::hex::encode(tenant.as_bytes());
    out.push(':');
    crate::hex::push(&mut out, key.as_bytes());
    out
}

/// Where a walk in (tenant, key) order starts: after the cursor's record, or before everything.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn scan_start(
    cursor: Option<&str>,
    backend: &'static str,
) -> Result<(String, Vec<u8>), crate::error::StoreError> {
    Ok(match cursor {
        Some(c) => {
            let (tenant, key) = parse_cursor(c, backend)?;
            (tenant, key.as_bytes().to_vec())
        }
        None => (String::new(), Vec::new()),
    })
}

/// Parses [`cursor_after`].
pub(crate) fn parse_cursor(
    cursor: &str,
    backend: &'static str,
) -> Result<(String, IdempotencyKey), crate::error::StoreError> {
    let bad = || {
        crate::error::StoreError::new(
            backend,
            crate::error::StoreErrorKind::Other,
            "scan: the cursor is not one this store made",
        )
    };
    let (tenant, key) = cursor.split_once(':').ok_or_else(bad)?;
    let tenant =
        String::from_utf8(crate::hex::decode(tenant).ok_or_else(bad)?).map_err(|_| bad())?;
    let key: [u8; 32] = crate::hex::decode(key)
        .ok_or_else(bad)?
        .try_into()
        .map_err(|_| bad())?;
    Ok((tenant, IdempotencyKey::from_bytes(key)))
}
