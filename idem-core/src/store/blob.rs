//! Large results, stored once: a completed result past a store's threshold is kept apart from
//! its record, content-addressed by its SHA-256, and shared by every record of the tenant whose
//! result is the same bytes.
//!
//! | what | where it lives |
//! |---|---|
//! | a result of at most the threshold (default [`DEFAULT_THRESHOLD`], 64 KiB), or an `unknown` record's | in the record, as before |
//! | a larger `completed` result | once per tenant and [`BlobHash`], in the store's blobs (a table, a key space); the record names it |
//! | a stream's chunk longer than the threshold | the same blobs, named by the chunk ([`chunk_apart`]) |
//! | a blob's references | counted in the transaction or script that writes or deletes a record or a chunk: the completion or append that names it adds one; deleting the record (purge, an operator) or replacing it (a claim over an expired one), or dropping a chunk (with its record, or by a new holder's first append) takes one away; the last one away deletes the blob |
//!
//! Nothing changes for callers: a claim that replays, a lookup, a page of a stream read the
//! result whole, from the same snapshot as the record (a reader never finds a record whose
//! blob is gone). Redis, which expires records on its own without telling anyone, also gives
//! every blob the expiry of the longest-lived record that named it, so that nothing outlives
//! its records.
//!
//! The threshold is a store option (`blob_threshold=BYTES` in every built-in store's URL, or
//! `off`): below it, a result costs a blob's extra lookup for nothing; above it, a record and
//! its indexes stay small, and a hundred identical results are stored once.

use sha2::{Digest, Sha256};

use super::RecordStatus;

/// The default threshold: a completed result of more than 64 KiB is stored as a blob.
pub const DEFAULT_THRESHOLD: usize = 64 * 1024;

/// The SHA-256 of a blob's bytes: its address within its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlobHash([u8; 32]);

impl BlobHash {
    /// The address of `data`.
    pub fn of(data: &[u8]) -> Self {
        BlobHash(Sha256::digest(data).into())
    }

    /// Rebuilds a hash a store kept.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        BlobHash(bytes)
    }

    /// The raw 32 bytes, for storing.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, 64 characters (Redis names its blob keys by it).
    pub fn to_hex(&self) -> String {
        crate::hex::encode(&self.0)
    }
}

/// The blob a completion writes its result to, if it is stored apart at `threshold`: only a
/// `completed` result longer than the threshold is (an `unknown` record keeps no result).
pub fn stored_apart(status: RecordStatus, result: &[u8], threshold: usize) -> Option<BlobHash> {
    (status == RecordStatus::Completed && result.len() > threshold).then(|| BlobHash::of(result))
}

/// The blob a stream's chunk is written to, if it is stored apart at `threshold`: a chunk longer
/// than the threshold is, shared like results are by every record and chunk of the tenant
/// holding the same bytes.
pub fn chunk_apart(chunk: &[u8], threshold: usize) -> Option<BlobHash> {
    (chunk.len() > threshold).then(|| BlobHash::of(chunk))
}

/// Parses the `blob_threshold` option of a store's URL: a number of bytes (at least 1), or
/// `off` for no blobs at all (every result stays in its record).
pub fn parse_threshold(value: &str) -> Result<usize, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(usize::MAX);
    }
    match value.parse::<usize>() {
        Ok(bytes) if bytes >= 1 => Ok(bytes),
        _ => Err(format!(
            "`blob_threshold` must be a number of bytes of at least 1 (results longer are stored \
             once, apart from their record) or `off`, not `{value}`"
        )),
    }
}

/// What a store's blobs hold (the admin side's [`AdminStore::blob_usage`](super::admin::AdminStore::blob_usage)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlobUsage {
    /// How many blobs.
    pub blobs: u64,
    /// Their bytes, each blob counted once however many records name it.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_completed_results_past_the_threshold_are_stored_apart() {
        let big = vec![7u8; 101];
        assert_eq!(
            stored_apart(RecordStatus::Completed, &big, 100),
            Some(BlobHash::of(&big))
        );
        assert_eq!(
            stored_apart(RecordStatus::Completed, &big[..100], 100),
            None
        );
        assert_eq!(stored_apart(RecordStatus::Unknown, &big, 100), None);
        assert_eq!(
            stored_apart(RecordStatus::Completed, &big, usize::MAX),
            None
        );
        assert_eq!(chunk_apart(&big, 100), Some(BlobHash::of(&big)));
        assert_eq!(chunk_apart(&big[..100], 100), None);
    }

    #[test]
    fn the_hash_is_sha256_of_the_bytes() {
        // printf 'abc' | sha256sum
        assert_eq!(
            BlobHash::of(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn thresholds_parse_or_say_what_they_take() {
        assert_eq!(parse_threshold("65536"), Ok(65536));
        assert_eq!(parse_threshold("OFF"), Ok(usize::MAX));
        for bad in ["0", "-1", "64k", ""] {
            let err = parse_threshold(bad).unwrap_err();
            assert!(err.contains("`blob_threshold` must be"), "{err}");
        }
    }
}
