//! The record layout: where a record lives (`PREFIX:{TENANT_HEX}:KEY_HEX`), its fixed-width
//! header, how it decodes, and the layout version kept in `PREFIX:meta`.

use super::driver::{corrupt, redis_error};
use super::store::RedisStore;
use idem_core::StoreError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::IdempotencyKey;
use idem_core::store::{FencingToken, Record, RecordStatus};

/// The layout version this build writes (kept in `PREFIX:meta`; 2 added the `unknown` status,
/// 3 the status `b` of a completed record whose result is a blob, and the blobs' keys; 4 the
/// chunks a stream keeps as blobs, `b0`, `b1`, … and `bl` in its hash).
pub const SCHEMA_VERSION: u32 = 4;

/// Offsets of the record layout (a leaf module of its own, so that the native writes can
/// cut records without naming this file, which names the store).
pub(super) use super::layout;

/// Whether a record as `GET` found it keeps its result in a blob (status `b`): only the scripts
/// read it whole.
pub(super) fn in_blob(v: &[u8]) -> bool {
    v.get(layout::STATUS) == Some(&b'b')
}

/// `PREFIX:{HEX(TENANT)}:HEX(KEY)`: hex keeps any tenant from forging a separator or a hash tag,
/// and keeps the mapping one-to-one; the braces make the tenant the Redis Cluster hash tag.
pub(super) fn record_key(prefix: &str, tenant: &str, key: &IdempotencyKey) -> String {
    let mut out = String::with_capacity(prefix.len() + 4 + tenant.len() * 2 + 64);
    out.push_str(prefix);
    out.push_str(":{");
    idem_core::hex::push(&mut out, tenant.as_bytes());
    out.push_str("}:");
    idem_core::hex::push(&mut out, key.as_bytes());
    out
}

/// Reads a record laid out as [`layout`] describes.
pub(super) fn decode_record(
    op: &str,
    tenant: &str,
    key: IdempotencyKey,
    v: &[u8],
) -> Result<Record, StoreError> {
    let bad = || corrupt(op, "the record is not laid out as this build writes it");
    let number = |range: std::ops::Range<usize>| -> Result<u64, StoreError> {
        v.get(range)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)
    };
    let tool_end =
        layout::HEADER + usize::try_from(number(layout::TOOL_LEN)?).map_err(|_| bad())?;
    let tool = v
        .get(layout::HEADER..tool_end)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(bad)?;
    let status = match v.get(layout::STATUS) {
        Some(b'i') => RecordStatus::InFlight,
        Some(b'c') => RecordStatus::Completed,
        Some(b'u') => RecordStatus::Unknown,
        // A result in a blob: the scripts that read records whole (`whole`) put it back.
        Some(b'b') => {
            return Err(corrupt(
                op,
                "a record whose result is a blob was read without it",
            ));
        }
        _ => return Err(bad()),
    };
    Ok(Record {
        tenant: tenant.to_owned(),
        key,
        tool: tool.to_owned(),
        fingerprint: Fingerprint::from_bytes(
            v.get(layout::FINGERPRINT)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?,
        ),
        status,
        token: FencingToken::from_raw(number(layout::TOKEN)?),
        lease_expires_at: number(layout::LEASE)?,
        created_at: number(layout::CREATED)?,
        expires_at: number(layout::EXPIRES)?,
        result: match status {
            RecordStatus::Completed | RecordStatus::Unknown => Some(v[tool_end..].to_vec()),
            RecordStatus::InFlight => None,
        },
        note: None,
    })
}

/// Decodes `HEX(tenant)` and `HEX(key)` out of `PREFIX:{HEX(tenant)}:HEX(key)`.
pub(super) fn parse_record_key(prefix: &str, name: &str) -> Option<(String, IdempotencyKey)> {
    let rest = name.strip_prefix(prefix)?.strip_prefix(":{")?;
    let (tenant, key) = rest.split_once("}:")?;
    let tenant = String::from_utf8(idem_core::hex::decode(tenant)?).ok()?;
    let key: [u8; 32] = idem_core::hex::decode(key)?.try_into().ok()?;
    Some((tenant, IdempotencyKey::from_bytes(key)))
}

impl RedisStore {
    pub(super) fn meta_key(&self) -> String {
        format!("{}:meta", self.prefix)
    }

    pub(super) fn record_key(&self, tenant: &str, key: &IdempotencyKey) -> String {
        record_key(&self.prefix, tenant, key)
    }

    pub(super) async fn layout_version(&self, op: &str) -> Result<u32, StoreError> {
        let found: Option<u32> = redis::cmd("HGET")
            .arg(self.meta_key())
            .arg("schema_version")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| redis_error(op, e))?;
        Ok(found.unwrap_or(SCHEMA_VERSION))
    }
}
