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

/// Reads a record laid out as [`layout`] describes. It takes the value as the server sent it:
/// a result is what follows the header, and keeps the value's buffer.
pub(super) fn decode_record(
    op: &str,
    tenant: &str,
    key: IdempotencyKey,
    mut v: Vec<u8>,
) -> Result<Record, StoreError> {
    let bad = || corrupt(op, "the record is not laid out as this build writes it");
    let number =
        |range: std::ops::Range<usize>| v.get(range).and_then(layout::digits).ok_or_else(bad);
    let tool_end =
        layout::HEADER + usize::try_from(number(layout::TOOL_LEN)?).map_err(|_| bad())?;
    let tool = v
        .get(layout::HEADER..tool_end)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(bad)?
        .to_owned();
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
    let fingerprint = Fingerprint::from_bytes(
        v.get(layout::FINGERPRINT)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(bad)?,
    );
    let token = FencingToken::from_raw(number(layout::TOKEN)?);
    let (lease_expires_at, created_at, expires_at) = (
        number(layout::LEASE)?,
        number(layout::CREATED)?,
        number(layout::EXPIRES)?,
    );
    let result = match status {
        RecordStatus::Completed | RecordStatus::Unknown => {
            v.drain(..tool_end);
            Some(v)
        }
        RecordStatus::InFlight => None,
    };
    Ok(Record {
        tenant: tenant.to_owned(),
        key,
        tool,
        fingerprint,
        status,
        token,
        lease_expires_at,
        created_at,
        expires_at,
        result,
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

#[cfg(test)]
mod tests {
    use super::decode_record;
    use idem_core::key::IdempotencyKey;

    /// A completed record's result is what follows the header and the tool name; a header
    /// whose number fields are not digits is refused, not read as another number.
    #[test]
    fn a_record_reads_its_result_and_refuses_a_bad_header() {
        let header = |token: &str| {
            let mut v = vec![7u8; 32];
            v.push(b'c');
            v.extend(format!("{:016}{:016}{:016}{token}{:04}tool", 9, 8, 5, 4).bytes());
            v
        };
        let key = IdempotencyKey::from_bytes([1; 32]);
        let mut done = header(&format!("{:019}", 42));
        done.extend_from_slice(b"{\"ok\":1}");
        let record = decode_record("test", "t", key, done).expect("a record");
        assert_eq!(record.result.as_deref(), Some(&b"{\"ok\":1}"[..]));
        assert_eq!((record.expires_at, record.lease_expires_at), (9, 8));
        assert_eq!(record.tool, "tool");
        let signed = header(&format!("+{:018}", 42));
        let error = decode_record("test", "t", key, signed).expect_err("not digits");
        assert!(error.to_string().contains("not laid out"), "{error}");
    }
}
