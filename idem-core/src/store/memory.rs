//! The in-memory store: the reference implementation of the [`Store`] contract.
//!
//! Everything happens under one lock, so every operation is trivially atomic. It forgets
//! everything when the process exits: use it for tests and for tools whose retries never cross a
//! restart. `Idem::open("memory://")` opens one.

use std::collections::HashMap;
use std::sync::Mutex;

use std::sync::Arc;

use super::admin::{self, AdminStore, Driver, Opened, Page, Resolution, invalid_url};
use super::blob::{self, BlobHash, BlobUsage, chunk_apart};
use super::stream::{AppendAt, out_of_order};
use super::{
    ChunkAppend, ChunkRead, Claim, ClaimRequest, Completion, Decision, Fenced, FencingToken,
    Record, RecordStatus, Renewal, Store, StoreFuture, StoreHealth, StreamPage, UnixMillis, Watch,
    Watchers, after, decide,
};
use crate::error::{StoreError, StoreErrorKind};
use crate::key::IdempotencyKey;

/// Schema version of the memory store (it has none to migrate; reported for symmetry).
const SCHEMA_VERSION: u32 = 1;

inventory::submit! {
    Driver::new(&["memory"], "memory://", |url| Box::pin(open_url(url)))
}

/// Opens `memory://` (the driver of `Idem::open`): a new, empty store.
async fn open_url(url: &str) -> Opened {
    match url.split_once("://") {
        Some((_, "")) => Ok(Arc::new(MemoryStore::new())),
        _ => Err(invalid_url(
            url,
            "`memory://` takes nothing after the scheme".into(),
        )),
    }
}

/// A [`Store`] in process memory.
#[derive(Debug)]
pub struct MemoryStore {
    tenants: Mutex<HashMap<String, Tenant>>,
    /// Callers waiting for a key to settle: woken by every completion and release.
    watchers: Watchers,
    /// Completed results longer than this are stored once per tenant, as [`blob`]s.
    blob_threshold: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            tenants: Mutex::default(),
            watchers: Watchers::default(),
            blob_threshold: blob::DEFAULT_THRESHOLD,
        }
    }
}

/// A record and the stream of chunks written under it: deleting the record drops them.
#[derive(Debug)]
struct Entry {
    /// The record; a result stored as a blob is not in it, but in its tenant's blobs.
    record: Record,
    /// The blob holding the record's result, if it is stored apart.
    blob: Option<BlobHash>,
    /// The token whose chunks these are (a new holder's first append drops an older one's).
    stream_token: FencingToken,
    chunks: Vec<Chunk>,
}

/// A chunk of a stream: its bytes, or the blob holding them.
#[derive(Debug)]
enum Chunk {
    Inline(Vec<u8>),
    Blob(BlobHash),
}

impl From<Record> for Entry {
    fn from(record: Record) -> Self {
        Entry {
            stream_token: record.token,
            record,
            blob: None,
            chunks: Vec::new(),
        }
    }
}

/// A tenant's records, and the blobs they name with how many of them name each.
#[derive(Debug, Default)]
struct Tenant {
    records: HashMap<IdempotencyKey, Entry>,
    blobs: HashMap<BlobHash, (Vec<u8>, usize)>,
}

impl std::ops::Deref for Tenant {
    type Target = HashMap<IdempotencyKey, Entry>;

    fn deref(&self) -> &Self::Target {
        &self.records
    }
}

impl std::ops::DerefMut for Tenant {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.records
    }
}

/// A tenant's blobs, each with how many records and chunks name it.
type Blobs = HashMap<BlobHash, (Vec<u8>, usize)>;

/// One more reference to the blob `hash` of `data`, written if it is new.
fn keep(blobs: &mut Blobs, hash: BlobHash, data: &[u8]) {
    blobs.entry(hash).or_insert_with(|| (data.to_vec(), 0)).1 += 1;
}

/// One reference less to `blob`: the last one deletes it.
fn let_go(blobs: &mut Blobs, blob: Option<BlobHash>) {
    let Some(hash) = blob else { return };
    if let Some((_, refs)) = blobs.get_mut(&hash) {
        *refs -= 1;
        if *refs == 0 {
            blobs.remove(&hash);
        }
    }
}

/// Drops `chunks`, letting go of the blobs they name.
fn drop_chunks(blobs: &mut Blobs, chunks: Vec<Chunk>) {
    for chunk in chunks {
        if let Chunk::Blob(hash) = chunk {
            let_go(blobs, Some(hash));
        }
    }
}

impl Tenant {
    /// Stores `entry` under `key`; a record it replaces lets go of its blob and its chunks'.
    fn insert(&mut self, key: IdempotencyKey, entry: Entry) {
        if let Some(old) = self.records.insert(key, entry) {
            self.forget(old);
        }
    }

    /// Deletes the record of `key`, letting go of its blob and its chunks'.
    fn remove(&mut self, key: &IdempotencyKey) -> Option<Record> {
        let old = self.records.remove(key)?;
        Some(self.forget(old))
    }

    /// Lets go of what a deleted `entry` named; its record.
    fn forget(&mut self, entry: Entry) -> Record {
        let_go(&mut self.blobs, entry.blob);
        drop_chunks(&mut self.blobs, entry.chunks);
        entry.record
    }

    /// Settles `key`'s record with `result`: in the record, or in a blob it names.
    fn settle(&mut self, key: &IdempotencyKey, result: &[u8], blob: Option<BlobHash>) {
        if let Some(hash) = blob {
            keep(&mut self.blobs, hash, result);
        }
        let entry = self.records.get_mut(key).expect("a settled record");
        let old = std::mem::replace(&mut entry.blob, blob);
        entry.record.result = blob.is_none().then(|| result.to_vec());
        let_go(&mut self.blobs, old);
    }

    /// The stored result of `entry`, wherever it is.
    fn result(&self, entry: &Entry) -> Option<Vec<u8>> {
        match entry.blob {
            Some(hash) => self.blobs.get(&hash).map(|(data, _)| data.clone()),
            None => entry.record.result.clone(),
        }
    }

    /// `entry`'s record with its result, as a reader sees it.
    fn record(&self, entry: &Entry) -> Record {
        Record {
            result: self.result(entry),
            ..entry.record.clone()
        }
    }
}

impl std::ops::Deref for Entry {
    type Target = Record;

    fn deref(&self) -> &Record {
        &self.record
    }
}

impl std::ops::DerefMut for Entry {
    fn deref_mut(&mut self) -> &mut Record {
        &mut self.record
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that keeps completed results longer than `bytes` as [`blob`]s (default
    /// [`blob::DEFAULT_THRESHOLD`]).
    pub fn with_blob_threshold(bytes: usize) -> Self {
        MemoryStore {
            blob_threshold: bytes,
            ..Self::default()
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Tenant>) -> T) -> Result<T, StoreError> {
        let mut guard = self.tenants.lock().map_err(|_| {
            StoreError::new(
                "memory",
                StoreErrorKind::Corrupt,
                "a thread panicked while holding the store lock",
            )
        })?;
        Ok(f(&mut guard))
    }

    fn claim_now(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.with(|tenants| {
            let records = tenants.entry(req.tenant.to_owned()).or_default();
            let held = records.get(&req.key).map(|e| e.record.held());
            match decide(held, req.fingerprint, req.now, req.orphans) {
                Decision::Mismatch => Claim::Mismatch,
                Decision::Blocked => Claim::Unknown,
                Decision::MarkUnknown => {
                    records.get_mut(&req.key).expect("held record").status = RecordStatus::Unknown;
                    Claim::Unknown
                }
                Decision::InFlight { lease_expires_at } => Claim::InFlight { lease_expires_at },
                Decision::Replay => Claim::Completed {
                    result: records.result(&records[&req.key]).unwrap_or_default(),
                },
                Decision::Insert => {
                    let token = FencingToken::generate();
                    records.insert(
                        req.key,
                        Entry::from(Record {
                            tenant: req.tenant.to_owned(),
                            key: req.key,
                            tool: req.tool.to_owned(),
                            fingerprint: req.fingerprint,
                            status: RecordStatus::InFlight,
                            token,
                            lease_expires_at: after(req.now, req.lease),
                            created_at: req.now,
                            expires_at: after(req.now, req.ttl),
                            result: None,
                            note: None,
                        }),
                    );
                    Claim::Acquired {
                        token,
                        takeover: false,
                    }
                }
                Decision::Takeover => {
                    let token = FencingToken::generate();
                    let record = records.get_mut(&req.key).expect("held record");
                    record.status = RecordStatus::InFlight;
                    record.token = token;
                    record.lease_expires_at = after(req.now, req.lease);
                    record.result = None;
                    Claim::Acquired {
                        token,
                        takeover: true,
                    }
                }
            }
        })
    }
}

impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async move { self.claim_now(&req) })
    }

    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let blob = blob::stored_apart(c.status, c.result, self.blob_threshold);
            let fenced = self.with(|tenants| {
                let Some(records) = tenants.get_mut(c.tenant) else {
                    return Fenced::Lost;
                };
                let Some(entry) = records.get_mut(&c.key) else {
                    return Fenced::Lost;
                };
                if entry.record.token != c.token {
                    return Fenced::Lost;
                }
                if entry.record.status == RecordStatus::InFlight {
                    entry.record.status = c.status;
                    entry.record.expires_at = after(c.now, c.ttl);
                    records.settle(&c.key, c.result, blob);
                    return Fenced::Applied;
                }
                // This very completion, sent again after its answer was lost?
                let entry = &records[&c.key];
                let same = entry.record.status == c.status
                    && entry.blob == blob
                    && records.result(entry).as_deref() == Some(c.result);
                if same { Fenced::Applied } else { Fenced::Lost }
            })?;
            if fenced == Fenced::Applied {
                self.watchers.settled(&c.key);
            }
            Ok(fenced)
        })
    }

    fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            self.with(
                |tenants| match tenants.get_mut(r.tenant).and_then(|t| t.get_mut(&r.key)) {
                    Some(record)
                        if record.token == r.token && record.status == RecordStatus::InFlight =>
                    {
                        record.lease_expires_at = after(r.now, r.lease);
                        record.expires_at = record.expires_at.max(record.lease_expires_at);
                        Fenced::Applied
                    }
                    _ => Fenced::Lost,
                },
            )
        })
    }

    fn append_chunks<'a>(&'a self, a: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            self.with(|tenants| {
                let Some(Tenant { records, blobs }) = tenants.get_mut(a.tenant) else {
                    return Ok(Fenced::Lost);
                };
                let Some(entry) = records.get_mut(&a.key) else {
                    return Ok(Fenced::Lost);
                };
                if entry.record.token != a.token || entry.record.status != RecordStatus::InFlight {
                    return Ok(Fenced::Lost);
                }
                if entry.stream_token != a.token {
                    entry.stream_token = a.token;
                    drop_chunks(blobs, std::mem::take(&mut entry.chunks));
                }
                let have = entry.chunks.len() as u64;
                match AppendAt::decide(have, a.first, a.chunks.len()) {
                    AppendAt::Done => {}
                    AppendAt::From(skip) => {
                        for chunk in &a.chunks[skip..] {
                            entry
                                .chunks
                                .push(match chunk_apart(chunk, self.blob_threshold) {
                                    Some(hash) => {
                                        keep(blobs, hash, chunk);
                                        Chunk::Blob(hash)
                                    }
                                    None => Chunk::Inline(chunk.clone()),
                                });
                        }
                    }
                    AppendAt::Gap => return Err(out_of_order("memory", a.first, have)),
                }
                Ok(Fenced::Applied)
            })?
        })
    }

    fn read_chunks<'a>(&'a self, r: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
        Box::pin(async move {
            self.with(|tenants| {
                let records = tenants.get(r.tenant)?;
                let entry = records.get(&r.key)?;
                let chunks = if entry.stream_token == entry.record.token {
                    let from = usize::try_from(r.from).unwrap_or(usize::MAX);
                    entry
                        .chunks
                        .iter()
                        .skip(from)
                        .take(r.limit.max(1))
                        .map(|chunk| match chunk {
                            Chunk::Inline(data) => data.clone(),
                            Chunk::Blob(hash) => records.blobs[hash].0.clone(),
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                Some(StreamPage {
                    record: records.record(entry),
                    chunks,
                })
            })
        })
    }

    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let fenced = self.with(|tenants| {
                let Some(records) = tenants.get_mut(tenant) else {
                    return Fenced::Lost;
                };
                match records.get(&key) {
                    Some(r) if r.token == token && r.status == RecordStatus::InFlight => {
                        records.remove(&key);
                        Fenced::Applied
                    }
                    _ => Fenced::Lost,
                }
            })?;
            if fenced == Fenced::Applied {
                self.watchers.settled(&key);
            }
            Ok(fenced)
        })
    }

    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            self.with(|tenants| {
                let records = tenants.get(tenant)?;
                records.get(&key).map(|e| records.record(e))
            })
        })
    }

    /// Every settlement happens in this process: the watch is announced.
    fn watch<'a>(&'a self, _tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
        Box::pin(async move { Ok(self.watchers.watch(key, true)) })
    }

    fn purge_expired(&self, now: UnixMillis, limit: usize) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            self.with(|tenants| {
                let mut purged = 0;
                for records in tenants.values_mut() {
                    let expired: Vec<IdempotencyKey> = records
                        .iter()
                        .filter(|(_, r)| r.expires_at <= now)
                        .map(|(k, _)| *k)
                        .take(limit - purged)
                        .collect();
                    for key in expired {
                        records.remove(&key);
                        purged += 1;
                    }
                    if purged == limit {
                        break;
                    }
                }
                tenants.retain(|_, records| !records.is_empty());
                purged
            })
        })
    }

    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        Box::pin(async move {
            self.with(|_| StoreHealth {
                encrypted: None,
                fencing: None,
                backend: "memory",
                schema_version: SCHEMA_VERSION,
                expected_schema_version: SCHEMA_VERSION,
                durable: false,
                detail: Some("records live in process memory: a restart forgets them".into()),
            })
        })
    }
}

impl AdminStore for MemoryStore {
    fn delete<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            self.with(
                |tenants| match tenants.get_mut(tenant).and_then(|r| r.remove(&key)) {
                    Some(_) => Fenced::Applied,
                    None => Fenced::Lost,
                },
            )
        })
    }

    fn scan<'a>(
        &'a self,
        tenant: Option<&'a str>,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            let after = cursor
                .map(|c| admin::parse_cursor(c, "memory"))
                .transpose()?;
            self.with(|tenants| {
                let mut all: Vec<Record> = tenants
                    .values()
                    .flat_map(|records| records.values().map(|e| records.record(e)))
                    .filter(|r| tenant.is_none_or(|t| r.tenant == t))
                    .filter(|r| {
                        after.as_ref().is_none_or(|(t, k)| {
                            (r.tenant.as_str(), r.key.as_bytes()) > (t.as_str(), k.as_bytes())
                        })
                    })
                    .collect();
                all.sort_by(|a, b| {
                    (&a.tenant, a.key.as_bytes()).cmp(&(&b.tenant, b.key.as_bytes()))
                });
                let records: Vec<Record> = all.into_iter().take(limit.max(1) + 1).collect();
                admin::page(records, limit.max(1))
            })
        })
    }

    fn blob_usage<'a>(&'a self, tenant: Option<&'a str>) -> StoreFuture<'a, BlobUsage> {
        Box::pin(async move {
            self.with(|tenants| {
                let mut usage = BlobUsage::default();
                for (_, records) in tenants
                    .iter()
                    .filter(|(t, _)| tenant.is_none_or(|x| x == *t))
                {
                    usage.blobs += records.blobs.len() as u64;
                    usage.bytes += records
                        .blobs
                        .values()
                        .map(|(d, _)| d.len() as u64)
                        .sum::<u64>();
                }
                usage
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
            self.with(|tenants| {
                let Some(records) = tenants.get_mut(tenant) else {
                    return Fenced::Lost;
                };
                match records.get_mut(&key) {
                    Some(record) if admin::is_blocked(record, now) => {
                        match resolution {
                            Resolution::Complete { result } => {
                                record.status = RecordStatus::Completed;
                                record.token = admin::RESOLVED_TOKEN;
                                record.note = Some(reason.to_owned());
                                records.settle(&key, result, None);
                            }
                            Resolution::Release => {
                                records.remove(&key);
                            }
                        }
                        Fenced::Applied
                    }
                    _ => Fenced::Lost,
                }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    crate::store_conformance_tests!(async { super::MemoryStore::new() });
    crate::admin_conformance_tests!(async { super::MemoryStore::new() });
}
