//! The admin side of the Redis store: delete (a script, which lets go of a blob), scan by
//! prefix, resolve (a fenced script), blob usage.

use super::connection::Connection;
use super::driver::{BACKEND, redis_error, time_arg};
use super::record::parse_record_key;
use super::scripts::blob_fns;
use super::store::RedisStore;
use idem_core::key::IdempotencyKey;
use idem_core::store::admin::{AdminStore, Page, Resolution};
use idem_core::store::blob::BlobUsage;
use idem_core::store::{Fenced, Store, StoreFuture, UnixMillis};
use idem_core::{StoreError, StoreErrorKind};

/// An operator's resolution of a blocked record (a release deletes its stream's chunks too,
/// named from the record's key: see `scripts.rs`). KEYS: the record, its note. ARGV: `c`
/// (complete) or `r` (release), the result, the reason, now. 1: applied (now, or by an earlier
/// delivery of this very resolution), 0: the record is gone or not blocked.
pub(super) const RESOLVE: &str = concat!(
    blob_fns!(),
    r"
local k, note = KEYS[1], KEYS[2]
local v = redis.call('GET', k)
if not v then return 0 end
local status = string.sub(v, 33, 33)
local head = 104 + tonumber(string.sub(v, 101, 104))
local resolved = '0000000000000000000'
if status == 'b' then return 0 end
if status == 'c' then
  if ARGV[1] == 'c' and string.sub(v, 82, 100) == resolved and string.sub(v, head + 1) == ARGV[2]
    and redis.call('GET', note) == ARGV[3] then return 1 end
  return 0
end
if status == 'i' and tonumber(string.sub(v, 50, 65)) > tonumber(ARGV[4]) then return 0 end
if ARGV[1] == 'r' then
  drop_stream(k)
  redis.call('DEL', k, note)
  return 1
end
redis.call('SET', k, string.sub(v, 1, 32) .. 'c' .. string.sub(v, 34, 81) .. resolved
  .. string.sub(v, 101, head) .. ARGV[2], 'KEEPTTL')
local ttl = redis.call('PTTL', k)
if ttl > 0 then
  redis.call('SET', note, ARGV[3], 'PX', ttl)
else
  redis.call('SET', note, ARGV[3])
end
return 1
"
);

impl RedisStore {
    /// The `SCAN` pattern of `tenant`'s keys `PREFIX:{TENANT}:rest`, or of every tenant's when
    /// `tenant` is `None`: refused on a cluster, whose tenants live on different primaries
    /// (`one_at_a_time` says what to do instead).
    fn keys_of(
        &self,
        tenant: Option<&str>,
        rest: &str,
        op: &str,
        one_at_a_time: &str,
    ) -> Result<String, StoreError> {
        match tenant {
            Some(t) => Ok(format!(
                "{}:{{{}}}:{rest}",
                self.prefix,
                idem_core::hex::encode(t.as_bytes())
            )),
            None if self.conn.is_cluster() => Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Other,
                format!("{op}: on a Redis Cluster, {one_at_a_time}"),
            )),
            None => Ok(format!("{}:{{*}}:{rest}", self.prefix)),
        }
    }
}

/// One step of a `SCAN` of `pattern` from `position`, on the primary that holds the pattern's
/// slot (a tenant's, on a cluster): the next position (0 at the end) and the names found.
async fn scan_step(
    conn: &mut Connection,
    pattern: &str,
    position: u64,
    op: &str,
) -> Result<(u64, Vec<String>), StoreError> {
    let mut scan = redis::cmd("SCAN");
    scan.arg(position)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        // MATCH filters after the walk: big steps keep a tenant's scan of a large keyspace to
        // few round trips.
        .arg(10_000);
    conn.on_primary_of(pattern, &scan)
        .await
        .and_then(|v| redis::from_redis_value(v).map_err(redis::RedisError::from))
        .map_err(|e| redis_error(op, e))
}

impl AdminStore for RedisStore {
    fn delete<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let record = self.record_key(tenant, &key);
            let note = format!("{record}:note");
            let deleted: i64 = self
                .invoke("delete", &self.scripts.delete, &[&record, &note], &[])
                .await?;
            Ok(if deleted == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            })
        })
    }

    /// Walks the tenant's blob keys with `SCAN` (on a cluster, one tenant at a time, as
    /// [`AdminStore::scan`]) and adds up their bytes.
    fn blob_usage<'a>(&'a self, tenant: Option<&'a str>) -> StoreFuture<'a, BlobUsage> {
        Box::pin(async move {
            const OP: &str = "blob_usage";
            let pattern = self.keys_of(tenant, "blob:*", OP, "ask for one tenant at a time")?;
            let mut conn = self.conn.clone();
            let mut usage = BlobUsage::default();
            let mut position: u64 = 0;
            loop {
                let (next, names) = scan_step(&mut conn, &pattern, position, OP).await?;
                for name in names {
                    let bytes: u64 = redis::cmd("HSTRLEN")
                        .arg(&name)
                        .arg("d")
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| redis_error(OP, e))?;
                    usage.blobs += 1;
                    usage.bytes += bytes;
                }
                position = next;
                if position == 0 {
                    return Ok(usage);
                }
            }
        })
    }

    fn server_time(&self) -> StoreFuture<'_, Option<UnixMillis>> {
        Box::pin(async move {
            let (secs, micros): (u64, u64) = redis::cmd("TIME")
                .query_async(&mut self.conn.clone())
                .await
                .map_err(|e| redis_error("reading the server's clock", e))?;
            Ok(Some(secs * 1000 + micros / 1000))
        })
    }

    /// Walks the keyspace with `SCAN` (a page may hold more than `limit` records, and records
    /// come in no particular order). On a cluster, one tenant's records live on one primary
    /// (their hash tag), which is scanned; a scan of every tenant is refused there.
    fn scan<'a>(
        &'a self,
        tenant: Option<&'a str>,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            const OP: &str = "scan";
            let pattern = self.keys_of(
                tenant,
                "*",
                OP,
                "list one tenant at a time (its records share one node)",
            )?;
            let mut position: u64 = match cursor {
                Some(c) => c.parse().map_err(|_| {
                    StoreError::new(
                        BACKEND,
                        StoreErrorKind::Other,
                        "scan: the cursor is not one this store made",
                    )
                })?,
                None => 0,
            };
            let mut records = Vec::new();
            let mut conn = self.conn.clone();
            loop {
                let (next, names) = scan_step(&mut conn, &pattern, position, OP).await?;
                for name in names
                    .iter()
                    .filter(|n| !n.ends_with(":note") && !n.ends_with(":stream"))
                {
                    let Some((tenant, key)) = parse_record_key(&self.prefix, name) else {
                        continue;
                    };
                    if let Some(record) = self.lookup(&tenant, key).await? {
                        records.push(record);
                    }
                }
                position = next;
                if position == 0 || records.len() >= limit.max(1) {
                    break;
                }
            }
            Ok(Page {
                records,
                next: (position != 0).then(|| position.to_string()),
            })
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
            let record = self.record_key(tenant, &key);
            let note = format!("{record}:note");
            let (action, result): (&[u8], &[u8]) = match resolution {
                Resolution::Complete { result } => (b"c", result),
                Resolution::Release => (b"r", b""),
            };
            let applied: i64 = self
                .invoke(
                    "resolve",
                    &self.scripts.resolve,
                    &[&record, &note],
                    &[action, result, reason.as_bytes(), time_arg(now).as_bytes()],
                )
                .await?;
            Ok(if applied == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            })
        })
    }
}
