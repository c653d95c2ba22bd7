//! The admin side of the SQLite store: delete, scan in (tenant, key) order, resolve, blob usage.

use rusqlite::params;

use super::SqliteStore;
use super::claim::{Op, RECORD_COLUMNS, decode_record};
use super::driver::{BACKEND, sql_error};
use idem_core::key::IdempotencyKey;
use idem_core::store::admin::{self as store_admin, AdminStore, Page, Resolution};
use idem_core::store::blob::BlobUsage;
use idem_core::store::{Fenced, StoreFuture, UnixMillis};

impl AdminStore for SqliteStore {
    fn delete<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let op = Op::Delete {
                tenant: tenant.to_owned(),
                key,
            };
            self.shared.write_fenced(op).await
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
            let records = self
                .read(|conn| {
                    let sql = format!(
                        "SELECT {RECORD_COLUMNS} FROM idem_records \
                         WHERE (?1 IS NULL OR tenant = ?1) AND (tenant, key) > (?2, ?3) \
                         ORDER BY tenant, key LIMIT ?4"
                    );
                    let mut stmt = conn
                        .prepare_cached(&sql)
                        .map_err(|e| sql_error("scan", e))?;
                    let mut rows = stmt
                        .query(params![tenant, after_tenant, after_key, (limit + 1) as i64])
                        .map_err(|e| sql_error("scan", e))?;
                    let mut records = Vec::new();
                    while let Some(row) = rows.next().map_err(|e| sql_error("scan", e))? {
                        records.push(decode_record("scan", row)?);
                    }
                    Ok(records)
                })
                .await?;
            Ok(store_admin::page(records, limit))
        })
    }

    fn blob_usage<'a>(&'a self, tenant: Option<&'a str>) -> StoreFuture<'a, BlobUsage> {
        Box::pin(async move {
            self.read(|conn| {
                conn.prepare_cached(
                    "SELECT count(*), coalesce(sum(length(data)), 0) FROM idem_blobs \
                     WHERE ?1 IS NULL OR tenant = ?1",
                )
                .and_then(|mut s| {
                    s.query_row(params![tenant], |r| {
                        Ok(BlobUsage {
                            blobs: r.get::<_, i64>(0)?.max(0) as u64,
                            bytes: r.get::<_, i64>(1)?.max(0) as u64,
                        })
                    })
                })
                .map_err(|e| sql_error("blob_usage", e))
            })
            .await
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
            let op = Op::Resolve {
                tenant: tenant.to_owned(),
                key,
                result: match resolution {
                    Resolution::Complete { result } => Some(result.to_vec()),
                    Resolution::Release => None,
                },
                reason: reason.to_owned(),
                now,
            };
            self.shared.write_fenced(op).await
        })
    }
}
