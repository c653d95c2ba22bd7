//! The in-memory store: the reference implementation of the [`Store`] contract.
//!
//! Everything happens under one lock, so every operation is trivially atomic. It forgets
//! everything when the process exits: use it for tests and for tools whose retries never cross a
//! restart. `Idem::open("memory://")` opens one.

use std::collections::HashMap;
use std::sync::Mutex;

use std::sync::Arc;

use super::admin::{self, AdminStore, Driver, Opened, Page, Resolution, invalid_url};
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
#[derive(Debug, Default)]
pub struct MemoryStore {
    tenants: Mutex<HashMap<String, HashMap<IdempotencyKey, Entry>>>,
    /// Callers waiting for a key to settle: woken by every completion and release.
    watchers: Watchers,
}

/// A record and the stream of chunks written under it: deleting the record drops them.
#[derive(Debug)]
struct Entry {
    record: Record,
    /// The token whose chunks these are (a new holder's first append drops an older one's).
    stream_token: FencingToken,
    chunks: Vec<Vec<u8>>,
}

impl From<Record> for Entry {
    fn from(record: Record) -> Self {
        Entry {
            stream_token: record.token,
            record,
            chunks: Vec::new(),
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

    fn with<T>(
        &self,
        f: impl FnOnce(&mut HashMap<String, HashMap<IdempotencyKey, Entry>>) -> T,
    ) -> Result<T, StoreError> {
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
                    result: records[&req.key].result.clone().unwrap_or_default(),
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
            let fenced = self.with(|tenants| {
                match tenants.get_mut(c.tenant).and_then(|r| r.get_mut(&c.key)) {
                    Some(record)
                        if record.token == c.token && record.status == RecordStatus::InFlight =>
                    {
                        record.status = c.status;
                        record.result = Some(c.result.to_vec());
                        record.expires_at = after(c.now, c.ttl);
                        Fenced::Applied
                    }
                    // This very completion, sent again after its answer was lost.
                    Some(record)
                        if record.token == c.token
                            && record.status == c.status
                            && record.result.as_deref() == Some(c.result) =>
                    {
                        Fenced::Applied
                    }
                    _ => Fenced::Lost,
                }
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
                let Some(entry) = tenants.get_mut(a.tenant).and_then(|r| r.get_mut(&a.key)) else {
                    return Ok(Fenced::Lost);
                };
                if entry.record.token != a.token || entry.record.status != RecordStatus::InFlight {
                    return Ok(Fenced::Lost);
                }
                if entry.stream_token != a.token {
                    entry.stream_token = a.token;
                    entry.chunks.clear();
                }
                let have = entry.chunks.len() as u64;
                match AppendAt::decide(have, a.first, a.chunks.len()) {
                    AppendAt::Done => {}
                    AppendAt::From(skip) => entry.chunks.extend_from_slice(&a.chunks[skip..]),
                    AppendAt::Gap => return Err(out_of_order("memory", a.first, have)),
                }
                Ok(Fenced::Applied)
            })?
        })
    }

    fn read_chunks<'a>(&'a self, r: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
        Box::pin(async move {
            self.with(|tenants| {
                let entry = tenants.get(r.tenant).and_then(|t| t.get(&r.key))?;
                let chunks = if entry.stream_token == entry.record.token {
                    let from = usize::try_from(r.from).unwrap_or(usize::MAX);
                    entry
                        .chunks
                        .iter()
                        .skip(from)
                        .take(r.limit.max(1))
                        .cloned()
                        .collect()
                } else {
                    Vec::new()
                };
                Some(StreamPage {
                    record: entry.record.clone(),
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
                tenants
                    .get(tenant)
                    .and_then(|r| r.get(&key))
                    .map(|e| e.record.clone())
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
                let mut all: Vec<&Record> = tenants
                    .values()
                    .flat_map(|records| records.values().map(|e| &e.record))
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
                let records: Vec<Record> =
                    all.into_iter().take(limit.max(1) + 1).cloned().collect();
                admin::page(records, limit.max(1))
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
                                record.result = Some(result.to_vec());
                                record.token = admin::RESOLVED_TOKEN;
                                record.note = Some(reason.to_owned());
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
