//! The admin side of the Postgres store: delete, scan in (tenant, key) order, resolve, blob
//! usage.

use super::claim::decode_record;
use super::driver::{BACKEND, corrupt, db_time};
use super::store::PostgresStore;
use idem_core::key::IdempotencyKey;
use idem_core::store::admin::{self as store_admin, AdminStore, Page, Resolution};
use idem_core::store::blob::BlobUsage;
use idem_core::store::{Fenced, RecordStatus, Store, StoreFuture, UnixMillis};

impl AdminStore for PostgresStore {
    fn delete<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let k = &key.as_bytes()[..];
            let deleted = self
                .query("delete", &self.inner.sql.delete, &[&tenant, &k])
                .await?;
            Ok(if deleted.is_empty() {
                Fenced::Lost
            } else {
                Fenced::Applied
            })
        })
    }

    fn blob_usage<'a>(&'a self, tenant: Option<&'a str>) -> StoreFuture<'a, BlobUsage> {
        Box::pin(async move {
            let rows = self
                .query("blob_usage", &self.inner.sql.blob_usage, &[&tenant])
                .await?;
            let row = rows
                .first()
                .ok_or_else(|| corrupt("blob_usage", "the count answered no row"))?;
            Ok(BlobUsage {
                blobs: row.get::<_, i64>(0).max(0) as u64,
                bytes: row.get::<_, i64>(1).max(0) as u64,
            })
        })
    }

    fn server_time(&self) -> StoreFuture<'_, Option<UnixMillis>> {
        Box::pin(async move {
            let rows = self
                .query(
                    "reading the server's clock",
                    &self.inner.sql.server_time,
                    &[],
                )
                .await?;
            Ok(rows.first().map(|r| r.get::<_, i64>(0).max(0) as u64))
        })
    }

    fn scan<'a>(
        &'a self,
        tenant: Option<&'a str>,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            let (after_tenant, after_key) = store_admin::scan_start(cursor, BACKEND)?;
            let limit = limit.max(1);
            let fetch = i64::try_from(limit + 1).unwrap_or(i64::MAX);
            let rows = self
                .query(
                    "scan",
                    &self.inner.sql.scan,
                    &[&tenant, &after_tenant, &after_key, &fetch],
                )
                .await?;
            let records = rows
                .iter()
                .map(decode_record)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(store_admin::page(records, limit))
        })
    }

    fn resolve<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        resolution: Resolution<'a>,
        reason: &'a str,
        now: UnixMillis,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let (k, now) = (&key.as_bytes()[..], db_time(now));
            let changed = match resolution {
                Resolution::Complete { result } => {
                    self.query(
                        "resolve",
                        &self.inner.sql.resolve_complete,
                        &[&tenant, &k, &now, &result, &reason],
                    )
                    .await?
                }
                Resolution::Release => {
                    self.query(
                        "resolve",
                        &self.inner.sql.resolve_release,
                        &[&tenant, &k, &now],
                    )
                    .await?
                }
            };
            if !changed.is_empty() {
                return Ok(Fenced::Applied);
            }
            // Nothing changed: maybe an earlier delivery of this very resolution did it.
            let ours = match resolution {
                Resolution::Complete { result } => {
                    self.lookup(tenant, key).await?.is_some_and(|r| {
                        r.status == RecordStatus::Completed
                            && r.token == store_admin::RESOLVED_TOKEN
                            && r.note.as_deref() == Some(reason)
                            && r.result.as_deref() == Some(result)
                    })
                }
                Resolution::Release => false,
            };
            Ok(if ours { Fenced::Applied } else { Fenced::Lost })
        })
    }
}
