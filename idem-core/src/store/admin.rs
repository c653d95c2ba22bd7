//! What operators need of a store, apart from what every call needs ([`Store`]): walk the
//! records, and resolve the ones nobody can decide automatically.
//!
//! Every built-in backend implements [`AdminStore`]; [`open`] opens one by URL, as `Idem::open`
//! does. The `idem` command-line tool is built on it.
//!
//! # Opening a store from a URL
//!
//! The scheme picks the backend, the rest is the backend's own options (as sqlx's `Any` driver
//! does). Each backend (the in-memory store too) registers a [`Driver`] for its schemes (`inventory::submit!`), so this
//! module names none of them and a new backend touches only its own crate and the facade's
//! feature that adds it. A scheme no driver of this build takes is an error that names the
//! facade feature adding it, when it is one of idem's own backends.
//!
//! | scheme | backend | facade feature |
//! |---|---|---|
//! | `memory://` | the in-memory store ([`MemoryStore`](crate::store::memory::MemoryStore)) | always there |
//! | `sqlite://PATH` | the embedded SQLite store | `sqlite` (default) |
//! | `postgres://…`, `postgresql://…` | the shared PostgreSQL store | `postgres` |
//! | `redis://…`, `rediss://…`, `redis+cluster://…`, `rediss+cluster://…` | the shared Redis store | `redis` |

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::blob::BlobUsage;
use super::{FencingToken, Record, RecordStatus, Store, StoreFuture, UnixMillis};
use crate::error::{OpenError, redact_url};
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

    /// How many blobs the store keeps (of `tenant` only, when given) and their bytes (see
    /// [`blob`](super::blob)). The default answers
    /// [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported).
    fn blob_usage<'a>(&'a self, tenant: Option<&'a str>) -> StoreFuture<'a, BlobUsage> {
        let _ = tenant;
        let error = super::stream::unsupported(self, "blob_usage");
        Box::pin(async move { Err(error) })
    }

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

/// What opening a store answers: the store with its admin side.
pub type Opened = Result<Arc<dyn AdminStore>, OpenError>;

/// The future a [`Driver`] returns.
pub type OpenFuture<'a> = Pin<Box<dyn Future<Output = Opened> + Send + 'a>>;

/// A backend's way in from a URL: the schemes it takes and how it opens one.
///
/// ```ignore
/// inventory::submit! {
///     idem_core::store::open::Driver::new(&["sqlite"], "sqlite://PATH", |url| Box::pin(open(url)))
/// }
/// ```
#[derive(Debug)]
pub struct Driver {
    schemes: &'static [&'static str],
    form: &'static str,
    open: fn(&str) -> OpenFuture<'_>,
}

impl Driver {
    /// A driver for `schemes` (lowercase, without `://`), shown to users as `form`
    /// (`"sqlite://PATH"`), opening the whole URL with `open`.
    pub const fn new(
        schemes: &'static [&'static str],
        form: &'static str,
        open: fn(&str) -> OpenFuture<'_>,
    ) -> Self {
        Driver {
            schemes,
            form,
            open,
        }
    }
}

inventory::collect!(Driver);

/// idem's own backends: their schemes and the facade feature that adds each, for the error of a
/// build without it.
const BUILT_IN: [(&str, &[&str], &str); 3] = [
    ("sqlite", &["sqlite"], "sqlite://PATH"),
    ("postgres", &["postgres", "postgresql"], "postgres://…"),
    (
        "redis",
        &["redis", "rediss", "redis+cluster", "rediss+cluster"],
        "redis://…, rediss://…, redis+cluster://…",
    ),
];

fn drivers() -> impl Iterator<Item = &'static Driver> {
    inventory::iter::<Driver>.into_iter()
}

/// The schemes [`open`] accepts in this build, and the features that add idem's others.
fn schemes() -> String {
    let mut on: Vec<&str> = drivers().map(|d| d.form).collect();
    on.sort_unstable_by_key(|form| (*form != "memory://", *form));
    let off: Vec<String> = BUILT_IN
        .iter()
        .filter(|(_, schemes, _)| !drivers().any(|d| d.schemes.contains(&schemes[0])))
        .map(|(feature, _, form)| format!("`{feature}` for {form}"))
        .collect();
    let mut text = on.join(", ");
    if !off.is_empty() {
        text.push_str(&format!(" (enable the feature {})", off.join(", ")));
    }
    text
}

/// Opens the store `url` names, with its admin side (what `Idem::open` and the `idem` command
/// open): `memory://`, or the URL of a backend built in (the table in the module docs; each
/// backend's crate documents its options).
///
/// Passwords never appear in errors (`postgres://app:***@db/…`).
pub async fn open(url: &str) -> Opened {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(OpenError::InvalidUrl {
            url: redact_url(url),
            reason: "expected `scheme://…`, e.g. `sqlite://idem.db` or `memory://`".into(),
        });
    };
    let scheme = scheme.to_ascii_lowercase();
    match drivers().find(|d| d.schemes.contains(&scheme.as_str())) {
        Some(driver) => (driver.open)(url).await,
        None => Err(OpenError::UnsupportedScheme {
            scheme,
            available: schemes(),
        }),
    }
}

/// The [`OpenError`] of a URL whose options a backend refused: the URL without its password,
/// and the backend's `reason`.
pub fn invalid_url(url: &str, reason: String) -> OpenError {
    OpenError::InvalidUrl {
        url: redact_url(url),
        reason,
    }
}

/// A page from `limit + 1` records in order: the extra one says whether there is more.
pub fn page(mut records: Vec<Record>, limit: usize) -> Page {
    let next = (records.len() > limit).then(|| {
        records.truncate(limit);
        let last = records.last().expect("a full page");
        cursor_after(&last.tenant, &last.key)
    });
    Page { records, next }
}

/// The cursor after the record (`tenant`, `key`), for backends that walk in (tenant, key) order.
pub fn cursor_after(tenant: &str, key: &IdempotencyKey) -> String {
    let mut out = crate::hex::encode(tenant.as_bytes());
    out.push(':');
    crate::hex::push(&mut out, key.as_bytes());
    out
}

/// Where a walk in (tenant, key) order starts: after the cursor's record, or before everything.
pub fn scan_start(
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
pub fn parse_cursor(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_opens_and_other_schemes_name_what_adds_them() {
        let store = open("memory://").await.expect("memory");
        assert_eq!(store.backend(), "memory");
        let Err(e) = open("memory://x").await else {
            panic!("memory:// with a path")
        };
        assert!(e.to_string().contains("takes nothing"), "{e}");
        // No backend registers a driver in this crate's own tests.
        let Err(e) = open("postgres://app:secret@db/x").await else {
            panic!("no postgres driver here")
        };
        let text = e.to_string();
        assert!(text.contains("`postgres` for postgres://"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        let Err(e) = open("idem.db").await else {
            panic!("no scheme")
        };
        assert!(e.to_string().contains("scheme://"), "{e}");
    }
}
