//! The claim (one plain `SET … NX PX … GET` for the common cases on Redis 7.0+, the claim
//! script for the rest), the fenced completion, renewal and release, and the same for batches:
//! the store's operations on the scripts of `scripts.rs`.

use redis::Value;

use super::connection::{command, first_reply};
use super::driver::{
    BACKEND, again_if_broken, corrupt, int, millis_arg, push_padded, redis_error, time_arg,
    time_bound, token_arg,
};
use super::native;
use super::record::{SCHEMA_VERSION, decode_record, in_blob, layout};
use super::store::RedisStore;
use idem_core::key::IdempotencyKey;
use idem_core::store::blob;
use idem_core::store::stream::out_of_order;
use idem_core::store::{
    BatchClaim, BatchRenewal, BatchSettlement, ChunkAppend, ChunkRead, Claim, ClaimRequest,
    Completion, Decision, Fenced, FencingToken, Orphans, Record, RecordStatus, Renewal, Settle,
    Store, StoreFuture, StoreHealth, StreamPage, UnixMillis, Watch, after, decide,
};
use idem_core::{StoreError, StoreErrorKind};

/// The record a claim of a new key writes, laid out as [`layout`] says: the fingerprint, `i`,
/// the expiry, the lease's expiry and the creation time (16 digits each), the token (19), the
/// tool name's length (4) and the name, in one buffer.
fn new_record(req: &ClaimRequest<'_>, token: FencingToken) -> Vec<u8> {
    let mut new = Vec::with_capacity(layout::HEADER + req.tool.len());
    new.extend_from_slice(req.fingerprint.as_bytes());
    new.push(b'i');
    push_padded(&mut new, time_bound(after(req.now, req.ttl)), 16);
    push_padded(&mut new, time_bound(after(req.now, req.lease)), 16);
    push_padded(&mut new, time_bound(req.now), 16);
    push_padded(&mut new, token.get(), 19);
    push_padded(&mut new, req.tool.len() as u64, 4);
    new.extend_from_slice(req.tool.as_bytes());
    new
}

/// The key of the hash that holds the chunks of `record`'s stream (see `scripts.rs`): the
/// record's key and `:s`, in the record's slot.
fn stream_key(record: &str) -> String {
    format!("{record}:stream")
}

/// Whether a tool name fits the record's 4-digit length field.
fn tool_fits(tool: &str) -> Result<(), StoreError> {
    if tool.len() > 9999 {
        return Err(StoreError::new(
            BACKEND,
            StoreErrorKind::Other,
            "claim: a tool name longer than 9999 bytes does not fit the record",
        ));
    }
    Ok(())
}

/// The status a completion settles as, as the settlement scripts read it.
fn status_arg(status: RecordStatus) -> &'static [u8] {
    match status {
        RecordStatus::Unknown => b"u",
        RecordStatus::Completed | RecordStatus::InFlight => b"c",
    }
}

/// The orphan policy as the claim script reads it.
fn orphans_arg(orphans: Orphans) -> &'static [u8] {
    match orphans {
        Orphans::TakeOver => b"0",
        Orphans::Reconcile => b"1",
        Orphans::Block => b"2",
    }
}

/// One answer per node: a cluster answers a command sent to every primary with a map of node to
/// answer; one server answers once.
fn per_node<T: redis::FromRedisValue>(op: &str, answer: Value) -> Result<Vec<T>, StoreError> {
    let unexpected = |_| corrupt(op, "the server answered something unexpected");
    match answer {
        Value::Map(nodes) => nodes
            .into_iter()
            .map(|(_, answer)| redis::from_redis_value(answer).map_err(unexpected))
            .collect(),
        answer => Ok(vec![redis::from_redis_value(answer).map_err(unexpected)?]),
    }
}

/// What a claim decides from the record that `SET … NX GET` found, by the one decision table
/// ([`decide`]), when that decision writes nothing; or this very claim, sent again after the
/// answer to its first delivery was lost. `None` when it would write (the record expired, a
/// lease lapsed, an orphan is taken over or marked `unknown`): then the script decides, on the
/// record as it is by then.
pub(super) fn decide_without_writing(
    found: Record,
    req: &ClaimRequest<'_>,
    token: FencingToken,
) -> Option<Claim> {
    let decision = decide(Some(found.held()), req.fingerprint, req.now, req.orphans);
    // A live record of these arguments, not completed: if it carries this claim's token, it is
    // this very claim, sent again after the answer to its first delivery was lost.
    let unsettled = !matches!(
        decision,
        Decision::Insert | Decision::Mismatch | Decision::Replay
    );
    if unsettled && found.token == token {
        return Some(Claim::Acquired {
            token,
            takeover: found.created_at != req.now,
        });
    }
    decision.answer_without_writing(|| found.result.unwrap_or_default())
}

impl RedisStore {
    /// What a claim answers from the record that its `GET` or `SET … NX GET` found (`Nil`:
    /// none), when it can answer without writing: a replay (kept in the replay cache), a
    /// mismatch, a call in flight, or this claim's own earlier delivery. `None` leaves the
    /// claim to the script: no record, one past its expiry or lease, or a result in a blob
    /// (which the script reads with its record).
    fn answer_found(
        &self,
        op: &'static str,
        req: &ClaimRequest<'_>,
        token: FencingToken,
        found: Value,
    ) -> Result<Option<Claim>, StoreError> {
        let found = match found {
            Value::Nil => return Ok(None),
            Value::BulkString(found) => found,
            _ => return Err(corrupt(op, "the server answered something unexpected")),
        };
        if in_blob(&found) {
            return Ok(None);
        }
        let found = decode_record(op, req.tenant, req.key, found)?;
        let expires_at = found.expires_at;
        let answer = decide_without_writing(found, req, token);
        if let Some(Claim::Completed { result }) = &answer {
            self.replays.put(req, result, expires_at);
        }
        Ok(answer)
    }

    /// Replaces (`Some(new)`, with a TTL in ms or keeping it) or deletes (`None`) the record at
    /// `record` if it is still exactly `old`, and says whether it did; the announcement, when
    /// there is one (`channel` not empty), goes with it. By the server's own command where it
    /// has one (`SET … IFEQ`, `DELIFEQ`: the `PUBLISH` in the same pipeline), else by
    /// [`COMPARE_AND_SET`](super::scripts::COMPARE_AND_SET). One that did not apply is handed
    /// to the full script by the caller, which tells why; a notice sent for it wakes the
    /// waiting callers to read the record as it is.
    async fn compare_and_set(
        &self,
        op: &str,
        record: &str,
        old: &[u8],
        new: Option<(&[u8], Option<&str>)>,
        channel: &str,
        notice: &str,
    ) -> Result<bool, StoreError> {
        let native = match new {
            Some(_) => self.fencing.set,
            None => self.fencing.delete,
        };
        if !native {
            let (new, ttl, delete): (&[u8], &str, &[u8]) = match new {
                Some((new, ttl)) => (new, ttl.unwrap_or(""), b""),
                None => (b"", "", b"d"),
            };
            let applied: i64 = self
                .invoke(
                    op,
                    &self.scripts.compare_and_set,
                    &[record],
                    &[
                        old,
                        new,
                        ttl.as_bytes(),
                        delete,
                        channel.as_bytes(),
                        notice.as_bytes(),
                    ],
                )
                .await?;
            return Ok(applied == 1);
        }
        let record = record.as_bytes();
        let answer = again_if_broken(op, || {
            let write = match new {
                Some((new, Some(ttl))) => {
                    command(&[b"SET", record, new, b"IFEQ", old, b"PX", ttl.as_bytes()])
                }
                Some((new, None)) => command(&[b"SET", record, new, b"IFEQ", old, b"KEEPTTL"]),
                None => command(&[b"DELIFEQ", record, old]),
            };
            let notice = (!channel.is_empty())
                .then(|| command(&[b"PUBLISH", channel.as_bytes(), notice.as_bytes()]));
            let conn = &self.conn;
            async move { first_reply(conn.send(std::iter::once(write).chain(notice)).await?) }
        })
        .await?;
        Ok(match answer {
            Value::Okay => true,
            Value::Int(deleted) => deleted == 1,
            Value::Nil => false,
            _ => return Err(corrupt(op, "the server answered something unexpected")),
        })
    }

    /// The claim a script's answer for one key says; a replay goes into the replay cache.
    fn decode_claim(
        &self,
        answer: &[Value],
        token: FencingToken,
        req: &ClaimRequest<'_>,
    ) -> Result<Claim, StoreError> {
        const OP: &str = "claim";
        let decision = answer
            .first()
            .ok_or_else(|| corrupt(OP, "empty answer"))
            .and_then(|v| int(OP, v))?;
        Ok(match (decision, answer.get(1), answer.get(2)) {
            (0 | 1, _, _) => Claim::Acquired {
                token,
                takeover: decision == 1,
            },
            (2, _, _) => Claim::Mismatch,
            (3, Some(expires_at), result) => {
                let result = match result {
                    Some(Value::BulkString(bytes)) => bytes.clone(),
                    _ => Vec::new(),
                };
                let expires_at = int(OP, expires_at)?.max(0) as u64;
                self.replays.put(req, &result, expires_at);
                Claim::Completed { result }
            }
            (4, Some(lease), _) => Claim::InFlight {
                lease_expires_at: int(OP, lease)?.max(0) as u64,
            },
            (5, _, _) => Claim::Unknown,
            _ => return Err(corrupt(OP, "unknown decision")),
        })
    }
}

impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn expires_on_its_own(&self) -> bool {
        true
    }

    /// What Redis keeps in one value (`proto-max-bulk-len`, 512 MiB by default), less room for
    /// a record's header and tool name.
    fn result_limit(&self) -> usize {
        super::MAX_VALUE_BYTES
    }

    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            // The claim, and the record it wrote when it wrote a new key's whole.
            let claim: Result<(Claim, Option<Vec<u8>>), StoreError> = async {
                const OP: &str = "claim";
                if let Some(answer) = self.replays.get(&req) {
                    return Ok((answer, None));
                }
                tool_fits(req.tool)?;
                let token = FencingToken::generate();
                let record = self.record_key(req.tenant, &req.key);
                // While nearly every claim lately found its key settled (retries replaying), a
                // plain `GET` answers them: a shorter request and a lighter command than the
                // `SET` below, which a new key then costs as a second round trip. A record it
                // cannot answer from (expired, a lapsed lease, a blob) goes to the script
                // straight away: the `SET … NX GET` would only find it again.
                let mut found_undecided = false;
                if self.read_first.wanted() {
                    let found = again_if_broken(OP, || {
                        let get = command(&[b"GET", record.as_bytes()]);
                        let conn = &self.conn;
                        async move { first_reply(conn.send([get]).await?) }
                    })
                    .await?;
                    found_undecided = found != Value::Nil;
                    if let Some(answer) = self.answer_found(OP, &req, token, found)? {
                        return Ok((answer, None));
                    }
                }
                // The record a new key gets; the script's arguments are slices of it.
                let new = new_record(&req, token);
                let ttl = millis_arg(req.ttl);
                if self.set_nx_get && !found_undecided {
                    let found = again_if_broken(OP, || {
                        let (record, ttl) = (record.as_bytes(), ttl.as_bytes());
                        let set = command(&[b"SET", record, &new, b"NX", b"PX", ttl, b"GET"]);
                        let conn = &self.conn;
                        async move { first_reply(conn.send([set]).await?) }
                    })
                    .await?;
                    if found == Value::Nil {
                        let claim = Claim::Acquired {
                            token,
                            takeover: false,
                        };
                        return Ok((claim, Some(new)));
                    }
                    // A second delivery of this claim finds the record it wrote.
                    if let Some(answer) = self.answer_found(OP, &req, token, found)? {
                        return Ok((answer, None));
                    }
                }
                let answer: Vec<Value> = self
                    .invoke(
                        OP,
                        &self.scripts.claim,
                        &[&record],
                        &[
                            &new[layout::FINGERPRINT],
                            &new[layout::CREATED],
                            &new[layout::TOKEN],
                            &new[layout::LEASE],
                            &new[layout::EXPIRES],
                            ttl.as_bytes(),
                            &new[layout::TOOL_LEN.start..],
                            orphans_arg(req.orphans),
                        ],
                    )
                    .await?;
                let claim = self.decode_claim(&answer, token, &req)?;
                Ok((claim, Some(new)))
            }
            .await;
            let (claim, new) = claim?;
            self.read_first
                .note(!matches!(claim, Claim::Acquired { .. }));
            if let Claim::Acquired { token, takeover } = claim {
                // The body may run: first the replicas the options ask for must hold the claim.
                self.replicated("claim", req.tenant, &req.key, token, false)
                    .await?;
                // A new key's record, as written: its settlement may compare and set natively.
                if let Some(new) = new.filter(|_| !takeover) {
                    self.written.keep(req.key, token, new, req.now);
                }
            }
            Ok(claim)
        })
    }

    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let expires_at = time_arg(after(c.now, c.ttl));
            let ttl = millis_arg(c.ttl);
            let (channel, notice) = self.announcement(&c.key, c.notify);
            let apart = blob::stored_apart(c.status, c.result, self.blob_threshold);
            // A new key's claim that wrote nothing else: one compare-and-set of its record.
            let held = self
                .written
                .take(c.key, c.token)
                .filter(|_| apart.is_none());
            let record = self.record_key(c.tenant, &c.key);
            let swapped = match held {
                Some(held) => {
                    let done =
                        native::completed(&held, status_arg(c.status), &expires_at, c.result);
                    let new = Some((&done[..], Some(ttl.as_str())));
                    self.compare_and_set("complete", &record, &held, new, channel, &notice)
                        .await?
                }
                None => false,
            };
            let applied: i64 = if swapped {
                1
            } else {
                let token = token_arg(c.token);
                let hash = apart.map(|h| h.to_hex()).unwrap_or_default();
                self.invoke(
                    "complete",
                    &self.scripts.complete,
                    &[&record],
                    &[
                        token.as_bytes(),
                        c.result,
                        expires_at.as_bytes(),
                        ttl.as_bytes(),
                        status_arg(c.status),
                        channel.as_bytes(),
                        notice.as_bytes(),
                        hash.as_bytes(),
                    ],
                )
                .await?
            };
            if applied != 1 {
                return Ok(Fenced::Lost);
            }
            self.notices.settled(&c.key);
            // A completion a failover loses would leave the claim in flight, and a retry would
            // take it over once its lease lapsed and run the body again.
            self.replicated("complete", c.tenant, &c.key, c.token, true)
                .await?;
            Ok(Fenced::Applied)
        })
    }

    /// One script over the items' keys (one slot: a tenant's records share its hash tag).
    fn claim_batch<'a>(&'a self, batch: BatchClaim<'a>) -> StoreFuture<'a, Vec<Claim>> {
        Box::pin(async move {
            const OP: &str = "claim";
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            tool_fits(batch.tool)?;
            let tokens: Vec<FencingToken> = batch
                .items
                .iter()
                .map(|_| FencingToken::generate())
                .collect();
            // The fields every item shares, cut from the record a new key would get.
            let new = new_record(&batch.request(&batch.items[0]), tokens[0]);
            let ttl = millis_arg(batch.ttl);
            let raw_tokens: Vec<String> = tokens.iter().map(|t| token_arg(*t)).collect();
            let mut args: Vec<&[u8]> = vec![
                &new[layout::CREATED],
                &new[layout::LEASE],
                &new[layout::EXPIRES],
                ttl.as_bytes(),
                &new[layout::TOOL_LEN.start..],
                orphans_arg(batch.orphans),
            ];
            for (item, token) in batch.items.iter().zip(&raw_tokens) {
                args.push(item.fingerprint.as_bytes());
                args.push(token.as_bytes());
            }
            let keys = batch.items.iter().map(|item| &item.key);
            let answers: Vec<Vec<Value>> = self
                .invoke_each(OP, &self.scripts.claim_batch, batch.tenant, keys, &args)
                .await?;
            let mut claims = Vec::with_capacity(answers.len());
            for ((item, answer), token) in batch.items.iter().zip(&answers).zip(tokens) {
                let claim = self.decode_claim(answer, token, &batch.request(item))?;
                if let Claim::Acquired { token, .. } = claim {
                    self.replicated(OP, batch.tenant, &item.key, token, false)
                        .await?;
                }
                claims.push(claim);
            }
            Ok(claims)
        })
    }

    /// One script over the items' keys.
    fn settle_batch<'a>(&'a self, batch: BatchSettlement<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(async move {
            const OP: &str = "complete";
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            let expires_at = time_arg(after(batch.now, batch.ttl));
            let ttl = millis_arg(batch.ttl);
            let tokens: Vec<String> = batch.items.iter().map(|i| token_arg(i.token)).collect();
            for item in batch.items {
                self.written.forget(item.key, item.token);
            }
            let hashes: Vec<String> = batch
                .items
                .iter()
                .map(|item| match item.settle {
                    Settle::Complete { status, result } => {
                        blob::stored_apart(status, result, self.blob_threshold)
                            .map(|h| h.to_hex())
                            .unwrap_or_default()
                    }
                    Settle::Release => String::new(),
                })
                .collect();
            let mut args: Vec<&[u8]> = vec![expires_at.as_bytes(), ttl.as_bytes()];
            for ((item, token), hash) in batch.items.iter().zip(&tokens).zip(&hashes) {
                let (status, result): (&[u8], &[u8]) = match item.settle {
                    Settle::Complete { status, result } => (status_arg(status), result),
                    Settle::Release => (b"r", b""),
                };
                args.extend([token.as_bytes(), status, result, hash.as_bytes()]);
            }
            let keys = batch.items.iter().map(|item| &item.key);
            let applied: Vec<i64> = self
                .invoke_each(OP, &self.scripts.settle_batch, batch.tenant, keys, &args)
                .await?;
            let mut answers = Vec::with_capacity(applied.len());
            for (item, applied) in batch.items.iter().zip(applied) {
                if applied != 1 {
                    answers.push(Fenced::Lost);
                    continue;
                }
                self.notices.settled(&item.key);
                if matches!(item.settle, Settle::Complete { .. }) {
                    self.replicated(OP, batch.tenant, &item.key, item.token, true)
                        .await?;
                }
                answers.push(Fenced::Applied);
            }
            Ok(answers)
        })
    }

    /// One script over the items' keys.
    fn renew_batch<'a>(&'a self, batch: BatchRenewal<'a>) -> StoreFuture<'a, Vec<Fenced>> {
        Box::pin(async move {
            const OP: &str = "renew";
            if batch.items.is_empty() {
                return Ok(Vec::new());
            }
            let lease_expires_at = time_arg(after(batch.now, batch.lease));
            let lease = millis_arg(batch.lease);
            let tokens: Vec<String> = batch.items.iter().map(|i| token_arg(i.token)).collect();
            for item in batch.items {
                self.written.forget(item.key, item.token);
            }
            let mut args: Vec<&[u8]> = vec![lease_expires_at.as_bytes(), lease.as_bytes()];
            args.extend(tokens.iter().map(|t| t.as_bytes()));
            let keys = batch.items.iter().map(|item| &item.key);
            let renewed: Vec<i64> = self
                .invoke_each(OP, &self.scripts.renew_batch, batch.tenant, keys, &args)
                .await?;
            Ok(renewed
                .into_iter()
                .map(|r| {
                    if r == 1 {
                        Fenced::Applied
                    } else {
                        Fenced::Lost
                    }
                })
                .collect())
        })
    }

    fn renew<'a>(&'a self, r: Renewal<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let token = token_arg(r.token);
            let lease_expires_at = time_arg(after(r.now, r.lease));
            let lease = millis_arg(r.lease);
            // One compare-and-set when the record outlives the new lease (else the script
            // lengthens its life); whatever the script does, the value it leaves is not known
            // here.
            let record = self.record_key(r.tenant, &r.key);
            let held = self.written.take(r.key, r.token);
            let renewed_value = held
                .as_deref()
                .and_then(|held| native::renewed(held, &lease_expires_at));
            if let (Some(held), Some(new)) = (&held, &renewed_value)
                && self
                    .compare_and_set("renew", &record, held, Some((new, None)), "", "")
                    .await?
            {
                self.written.keep(r.key, r.token, new.clone(), r.now);
                return Ok(Fenced::Applied);
            }
            let renewed: i64 = self
                .invoke(
                    "renew",
                    &self.scripts.renew,
                    &[&record],
                    &[
                        token.as_bytes(),
                        lease_expires_at.as_bytes(),
                        lease.as_bytes(),
                    ],
                )
                .await?;
            Ok(if renewed == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            })
        })
    }

    /// One script over the record and its stream's hash (one slot).
    fn append_chunks<'a>(&'a self, a: ChunkAppend<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            const OP: &str = "append_chunks";
            // A call with chunks settles by script, which keeps them and their blobs.
            self.written.forget(a.key, a.token);
            let token = token_arg(a.token);
            let first = a.first.to_string();
            let record = self.record_key(a.tenant, &a.key);
            let stream = stream_key(&record);
            let hashes: Vec<String> = a
                .chunks
                .iter()
                .map(|c| {
                    blob::chunk_apart(c, self.blob_threshold)
                        .map_or_else(String::new, |h| h.to_hex())
                })
                .collect();
            let mut args: Vec<&[u8]> = vec![token.as_bytes(), first.as_bytes()];
            for (hash, chunk) in hashes.iter().zip(a.chunks) {
                args.push(hash.as_bytes());
                args.push(chunk);
            }
            let answer: Vec<i64> = self
                .invoke(OP, &self.scripts.append_chunks, &[&record, &stream], &args)
                .await?;
            match answer.as_slice() {
                [0] => Ok(Fenced::Lost),
                [1, _] => {
                    self.replicated(OP, a.tenant, &a.key, a.token, false)
                        .await?;
                    Ok(Fenced::Applied)
                }
                [-1, have] => Err(out_of_order(BACKEND, a.first, (*have).max(0) as u64)),
                _ => Err(corrupt(OP, "the server answered something unexpected")),
            }
        })
    }

    /// One script over the record and its stream's hash: one atomic read.
    fn read_chunks<'a>(&'a self, r: ChunkRead<'a>) -> StoreFuture<'a, Option<StreamPage>> {
        Box::pin(async move {
            const OP: &str = "read_chunks";
            let record = self.record_key(r.tenant, &r.key);
            let stream = stream_key(&record);
            let (from, limit) = (r.from.to_string(), r.limit.max(1).to_string());
            let answer: Vec<Vec<u8>> = self
                .invoke(
                    OP,
                    &self.scripts.read_chunks,
                    &[&record, &stream],
                    &[from.as_bytes(), limit.as_bytes()],
                )
                .await?;
            let mut answer = answer.into_iter();
            let Some(found) = answer.next() else {
                return Ok(None);
            };
            Ok(Some(StreamPage {
                record: decode_record(OP, r.tenant, r.key, found)?,
                chunks: answer.collect(),
            }))
        })
    }

    fn release<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
        token: FencingToken,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let (channel, notice) = self.announcement(&key, true);
            let record = self.record_key(tenant, &key);
            // A new key's claim that wrote nothing else: one compare-and-delete of its record.
            if let Some(held) = self.written.take(key, token)
                && self
                    .compare_and_set("release", &record, &held, None, channel, &notice)
                    .await?
            {
                self.notices.settled(&key);
                return Ok(Fenced::Applied);
            }
            let token = token_arg(token);
            let deleted: i64 = self
                .invoke(
                    "release",
                    &self.scripts.release,
                    &[&record],
                    &[token.as_bytes(), channel.as_bytes(), notice.as_bytes()],
                )
                .await?;
            if deleted != 1 {
                return Ok(Fenced::Lost);
            }
            self.notices.settled(&key);
            Ok(Fenced::Applied)
        })
    }

    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        key: IdempotencyKey,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            const OP: &str = "lookup";
            let record = self.record_key(tenant, &key);
            let note = format!("{record}:note");
            let answer: Vec<Option<Vec<u8>>> = self
                .invoke(OP, &self.scripts.lookup, &[&record, &note], &[])
                .await?;
            let mut answer = answer.into_iter();
            let Some(Some(value)) = answer.next() else {
                return Ok(None);
            };
            let note = answer
                .next()
                .flatten()
                .map(|n| String::from_utf8(n).map_err(|_| corrupt(OP, "the note is not UTF-8")))
                .transpose()?;
            decode_record(OP, tenant, key, value).map(|r| Some(Record { note, ..r }))
        })
    }

    fn purge_expired(&self, _now: UnixMillis, _limit: usize) -> StoreFuture<'_, usize> {
        // Records carry a Redis expiry; the server deletes them on its own.
        Box::pin(async { Ok(0) })
    }

    fn health(&self) -> StoreFuture<'_, StoreHealth> {
        Box::pin(async move {
            const OP: &str = "health check";
            let version = self.layout_version(OP).await?;
            // On a cluster, INFO and CONFIG answer from every primary: each must be durable.
            let info: Value = redis::cmd("INFO")
                .arg("persistence")
                .query_async(&mut self.conn.clone())
                .await
                .map_err(|e| redis_error(OP, e))?;
            let infos: Vec<String> = per_node(OP, info)?;
            let aof = !infos.is_empty()
                && infos
                    .iter()
                    .all(|info| info.lines().any(|line| line.trim() == "aof_enabled:1"));
            // CONFIG may be forbidden (managed services); then the fsync policy is unknown.
            let policies: Option<Vec<Vec<String>>> = match redis::cmd("CONFIG")
                .arg("GET")
                .arg("appendfsync")
                .query_async::<Value>(&mut self.conn.clone())
                .await
            {
                Ok(answer) => per_node(OP, answer).ok(),
                Err(_) => None,
            };
            let fsync: Option<String> = policies.and_then(|nodes| {
                let mut policies = nodes.into_iter().map(|pair| pair.into_iter().nth(1));
                let first = policies.next().flatten()?;
                // The weakest policy speaks for the cluster.
                Some(if policies.all(|p| p.as_deref() == Some(&first)) {
                    first
                } else {
                    "mixed".to_owned()
                })
            });
            let replicated = !self.conn.is_cluster() || self.wait.replicas > 0;
            let durable = aof && fsync.as_deref() == Some("always") && replicated;
            let detail = match (aof, fsync.as_deref()) {
                (false, _) => Some(
                    "the server runs with appendonly no: a Redis restart forgets every claim"
                        .to_owned(),
                ),
                (true, Some("always")) if replicated => None,
                (true, Some("always")) => Some(
                    "a Redis Cluster replicates asynchronously: a failover may lose the last \
                     claims; set wait_replicas=1"
                        .to_owned(),
                ),
                (true, Some(policy)) => Some(format!(
                    "the server runs with appendfsync {policy}: a crash of the server may forget \
                     the claims of the last second"
                )),
                (true, None) => Some(
                    "the server's appendfsync policy cannot be read (CONFIG is not allowed)"
                        .to_owned(),
                ),
            };
            Ok(StoreHealth {
                encrypted: self.encrypted,
                backend: BACKEND,
                schema_version: version,
                expected_schema_version: SCHEMA_VERSION,
                durable,
                detail,
                fencing: Some(self.fencing.describe()),
            })
        })
    }

    /// Announced once the store's subscriber is subscribed (see the `notices` module).
    fn watch<'a>(&'a self, _tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Watch> {
        Box::pin(async move { Ok(self.notices.watch(key).await) })
    }
}

#[cfg(test)]
mod tests;
