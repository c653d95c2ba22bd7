//! The Lua scripts of the store, each the same few functions (the claim, the settlements, the
//! renewal of one key, written once) called for one key or for every key of a batch. Records
//! are laid out as `record.rs` says.
//!
//! The chunks of a stream live in a hash beside the record, at the record's key and `:stream` (its
//! hash tag, so its slot): `t` the token whose chunks these are, `n` how many, and the chunks
//! under `0`, `1`, …; a chunk past the threshold is a blob, named under `b0`, `b1`, … instead,
//! and `bl` lists the hashes of the blobs the stream names (64 hex characters each, one per
//! chunk). The hash lives as long as its record: an append gives it the record's remaining
//! time, and the settlements and renewals that change the record's expiry change the hash's,
//! and its blobs', in the same script (they name it from the record's key, which shares its
//! slot). Every script that deletes a stream lets go of its blobs first (`drop_stream`).

/// Blobs, as Lua functions: a completed result or a chunk past the store's threshold lives once
/// per tenant at `PREFIX:{TENANT_HEX}:blob:SHA256_HEX` (the tenant's hash tag, so its records'
/// slot), a hash of the bytes (`d`) and how many records and chunks name it (`r`); such a record
/// has the status `b` and the hash where a result would be. `keep` counts a record or a chunk
/// in (the blob lives at least as long as it, so nothing outlives its records when Redis
/// expires them on its own), `let_go` counts a record out and `drop_stream` a stream's chunks
/// (the last deletes it), `outlive` gives a stream's blobs its new time (a blob only the
/// stream names expires with it, one that others name too at the latest of their times),
/// `whole` reads a record as if its result were in it.
macro_rules! blob_fns {
    () => {
        r"
local function blob_key(k, hash) return string.sub(k, 1, #k - 64) .. 'blob:' .. hash end
local function blob_data(k, hash)
  local data = redis.call('HGET', blob_key(k, hash), 'd')
  if not data then
    error({err = 'idem: a record or a chunk names a blob that is gone (evicted? run Redis ' ..
      'with maxmemory-policy noeviction)'})
  end
  return data
end
local function blob_of(k, v, head) return blob_data(k, string.sub(v, head + 1)) end
local function whole(k, v)
  if string.sub(v, 33, 33) ~= 'b' then return v end
  local head = 104 + tonumber(string.sub(v, 101, 104))
  return string.sub(v, 1, 32) .. 'c' .. string.sub(v, 34, head) .. blob_of(k, v, head)
end
local function keep(k, hash, data, ttl)
  local b = blob_key(k, hash)
  redis.call('HSETNX', b, 'd', data)
  redis.call('HINCRBY', b, 'r', 1)
  if redis.call('PTTL', b) < tonumber(ttl) then redis.call('PEXPIRE', b, ttl) end
end
local function let_go_hash(k, hash)
  local b = blob_key(k, hash)
  if redis.call('EXISTS', b) == 1 and redis.call('HINCRBY', b, 'r', -1) <= 0 then
    redis.call('DEL', b)
  end
end
local function let_go(k, v)
  if string.sub(v, 33, 33) ~= 'b' then return end
  local head = 104 + tonumber(string.sub(v, 101, 104))
  let_go_hash(k, string.sub(v, head + 1))
end
local function stream_blobs(k)
  local listed = redis.call('HGET', k .. ':stream', 'bl')
  local out = {}
  if listed then
    for i = 1, #listed, 64 do out[#out + 1] = string.sub(listed, i, i + 63) end
  end
  return out
end
local function drop_stream(k)
  for _, hash in ipairs(stream_blobs(k)) do let_go_hash(k, hash) end
  redis.call('DEL', k .. ':stream')
end
local function outlive(k, ttl)
  local named = {}
  for _, hash in ipairs(stream_blobs(k)) do named[hash] = (named[hash] or 0) + 1 end
  for hash, times in pairs(named) do
    local b = blob_key(k, hash)
    local refs = tonumber(redis.call('HGET', b, 'r') or '0')
    if refs <= times or redis.call('PTTL', b) < tonumber(ttl) then
      redis.call('PEXPIRE', b, ttl)
    end
  end
end
"
    };
}

pub(super) use blob_fns;

/// The claim of one key, as a Lua function (the body of [`CLAIM`] and [`CLAIM_BATCH`]).
/// Decisions: 0 acquired, 1 acquired by takeover, 2 mismatch, 3 completed (replay), 4 in flight,
/// 5 unknown. Arguments: the record's key, the fingerprint, now, the token, the lease's expiry,
/// the expiry (as `record.rs` lays them out), the TTL in ms, the tool name with its 4-digit length, and the
/// orphan policy (`0` take over, `1` reconcile: take lapsed and unknown records over, `2` block:
/// mark lapsed records unknown).
macro_rules! claim_fn {
    () => {
        r"
local function claim(k, fp, now_arg, token, lease_at, expires, ttl, tool, orphans)
  local now = tonumber(now_arg)
  local v = redis.call('GET', k)
  if v and tonumber(string.sub(v, 34, 49)) > now then
    if string.sub(v, 1, 32) ~= fp then return {2} end
    local status = string.sub(v, 33, 33)
    local head = 104 + tonumber(string.sub(v, 101, 104))
    if status == 'c' then
      return {3, string.sub(v, 34, 49), string.sub(v, head + 1)}
    end
    if status == 'b' then return {3, string.sub(v, 34, 49), blob_of(k, v, head)} end
    if string.sub(v, 82, 100) == token then
      if string.sub(v, 66, 81) == now_arg then return {0} end
      return {1}
    end
    if status == 'u' then
      if orphans ~= '1' then return {5} end
    else
      local lease = string.sub(v, 50, 65)
      if tonumber(lease) > now then return {4, lease} end
      if orphans == '2' then
        redis.call('SET', k, string.sub(v, 1, 32) .. 'u' .. string.sub(v, 34), 'KEEPTTL')
        return {5}
      end
    end
    redis.call('SET', k, fp .. 'i' .. string.sub(v, 34, 49) .. lease_at .. string.sub(v, 66, 81)
      .. token .. string.sub(v, 101, head), 'KEEPTTL')
    return {1}
  end
  if v then
    let_go(k, v)
    drop_stream(k)
  end
  redis.call('SET', k, fp .. 'i' .. expires .. lease_at .. now_arg .. token .. tool, 'PX', ttl)
  return {0}
end
"
    };
}

/// The settlements of one key, as Lua functions (the bodies of [`COMPLETE`], [`RELEASE`] and
/// [`SETTLE_BATCH`]). `complete` answers 2: applied, 1: applied by an earlier delivery of this
/// very completion, 0: lost; `release` 1: deleted, 0: lost. Arguments: the record's key, the
/// token, the result, the expiry, the TTL in ms, the status to settle as (`c` or `u`) and the
/// hash of the blob to keep the result in (empty: in the record).
macro_rules! settle_fns {
    () => {
        r"
local function complete(k, token, result, expires, ttl, status, hash)
  local v = redis.call('GET', k)
  if not v or string.sub(v, 82, 100) ~= token then return 0 end
  local head = 104 + tonumber(string.sub(v, 101, 104))
  local stored = result
  if hash ~= '' then stored, status = hash, 'b' end
  if string.sub(v, 33, 33) ~= 'i' then
    if string.sub(v, 33, 33) == status and string.sub(v, head + 1) == stored then return 1 end
    return 0
  end
  redis.call('SET', k, string.sub(v, 1, 32) .. status .. expires .. string.sub(v, 50, head)
    .. stored, 'PX', ttl)
  if hash ~= '' then keep(k, hash, result, ttl) end
  redis.call('PEXPIRE', k .. ':stream', ttl)
  outlive(k, ttl)
  return 2
end
local function release(k, token)
  local v = redis.call('GET', k)
  if v and string.sub(v, 33, 33) == 'i' and string.sub(v, 82, 100) == token then
    drop_stream(k)
    redis.call('DEL', k)
    return 1
  end
  return 0
end
"
    };
}

/// The claim of one key. ARGV: fingerprint, now, token, lease expiry, expiry, TTL in ms, the
/// tool name with its length, the orphan policy (see `claim_fn!`).
pub(super) const CLAIM: &str = concat!(
    blob_fns!(),
    claim_fn!(),
    "return claim(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])\n"
);

/// The claims of a batch's keys, one answer per key in order. ARGV: now, lease expiry, expiry,
/// TTL in ms, the tool name with its length, the orphan policy, then the fingerprint and the
/// token of each key.
pub(super) const CLAIM_BATCH: &str = concat!(
    blob_fns!(),
    claim_fn!(),
    r"
local out = {}
for i = 1, #KEYS do
  out[i] = claim(KEYS[i], ARGV[5 + 2 * i], ARGV[1], ARGV[6 + 2 * i], ARGV[2], ARGV[3], ARGV[4],
    ARGV[5], ARGV[6])
end
return out
"
);

/// 1: applied (now, or by an earlier delivery of this very completion), 0: lost.
/// ARGV: token, result, expiry, TTL in ms, the status to settle as (`c` or `u`), the channel
/// to announce the settlement on (empty: none), the notice (the key in hex) and the blob's hash
/// (empty: none).
pub(super) const COMPLETE: &str = concat!(
    blob_fns!(),
    settle_fns!(),
    r"
local done = complete(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[8])
if done == 2 and ARGV[6] ~= '' then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
if done == 0 then return 0 end
return 1
"
);

/// The server's `SET … IFEQ` and `DELIFEQ`, where it has none: the record at KEYS[1] is
/// replaced or deleted only if it is still exactly ARGV[1] (the value the claim wrote, its token
/// among it). ARGV: that value, the new one, its TTL in ms (empty: kept), `d` to delete instead,
/// the channel to announce on (empty: none) and the notice. 1: applied, 0: the record is
/// another (the caller hands over to the full script).
pub(super) const COMPARE_AND_SET: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[4] == 'd' then
  redis.call('DEL', KEYS[1])
elseif ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
return 1
";

/// The renewal of one key, as a Lua function (the body of [`RENEW`] and [`RENEW_BATCH`]):
/// 1: renewed, 0: lost. Arguments: the record's key, the token, the lease's expiry, the lease in
/// ms. A record that would expire before its new lease lapses lives as long as the lease.
macro_rules! renew_fn {
    () => {
        r"
local function renew(k, token, lease_at, lease_ms)
  local v = redis.call('GET', k)
  if not v or string.sub(v, 33, 33) ~= 'i' or string.sub(v, 82, 100) ~= token then return 0 end
  if tonumber(string.sub(v, 34, 49)) < tonumber(lease_at) then
    redis.call('SET', k, string.sub(v, 1, 33) .. lease_at .. lease_at .. string.sub(v, 66), 'PX', lease_ms)
    redis.call('PEXPIRE', k .. ':stream', lease_ms)
    outlive(k, lease_ms)
  else
    redis.call('SET', k, string.sub(v, 1, 49) .. lease_at .. string.sub(v, 66), 'KEEPTTL')
  end
  return 1
end
"
    };
}

/// 1: renewed, 0: lost. ARGV: token, lease expiry, lease in ms (see `renew_fn!`).
pub(super) const RENEW: &str = concat!(
    blob_fns!(),
    renew_fn!(),
    "return renew(KEYS[1], ARGV[1], ARGV[2], ARGV[3])\n"
);

/// The renewals of a batch's keys, one answer per key in order (1: renewed, 0: lost). ARGV:
/// lease expiry, lease in ms, then the token of each key.
pub(super) const RENEW_BATCH: &str = concat!(
    blob_fns!(),
    renew_fn!(),
    r"
local out = {}
for i = 1, #KEYS do
  out[i] = renew(KEYS[i], ARGV[2 + i], ARGV[1], ARGV[2])
end
return out
"
);

/// 1: deleted, 0: lost. ARGV: token, the channel to announce the release on (empty: none) and
/// the notice (the key in hex).
pub(super) const RELEASE: &str = concat!(
    blob_fns!(),
    settle_fns!(),
    r"
local done = release(KEYS[1], ARGV[1])
if done == 1 and ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return done
"
);

/// The settlements of a batch's keys, one answer per key in order (1: applied, 0: lost).
/// ARGV: expiry, TTL in ms, then the token, the status (`c`, `u`, or `r` to release), the
/// result and the blob's hash (empty: none) of each key.
pub(super) const SETTLE_BATCH: &str = concat!(
    blob_fns!(),
    settle_fns!(),
    r"
local out = {}
for i = 1, #KEYS do
  local at = 4 * i - 1
  local token, status = ARGV[at], ARGV[at + 1]
  if status == 'r' then
    out[i] = release(KEYS[i], token)
  else
    out[i] = math.min(complete(KEYS[i], token, ARGV[at + 2], ARGV[1], ARGV[2], status,
      ARGV[at + 3]), 1)
  end
end
return out
"
);

/// Chunks appended to a claimed key's stream. KEYS: the record, its stream. ARGV: the token,
/// the position of the first chunk, then for each chunk the hash of its blob (empty: kept in
/// the stream) and its bytes. Answers `{0}`: the token lost the key; `{1, n}`: the stream holds
/// `n` chunks, these among them; `{-1, n}`: the append starts past the end of a stream of `n`
/// (nothing written). A token's first append drops an earlier holder's chunks.
pub(super) const APPEND_CHUNKS: &str = concat!(
    blob_fns!(),
    r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 33, 33) ~= 'i' or string.sub(v, 82, 100) ~= ARGV[1] then return {0} end
local s = KEYS[2]
local n = 0
if redis.call('HGET', s, 't') == ARGV[1] then
  n = tonumber(redis.call('HGET', s, 'n'))
else
  drop_stream(KEYS[1])
end
local first = tonumber(ARGV[2])
local count = (#ARGV - 2) / 2
if first > n then return {-1, n} end
local ttl = redis.call('PTTL', KEYS[1])
local listed = ''
for i = n - first + 1, count do
  local hash, data, seq = ARGV[1 + 2 * i], ARGV[2 + 2 * i], tostring(first + i - 1)
  if hash == '' then
    redis.call('HSET', s, seq, data)
  else
    redis.call('HSET', s, 'b' .. seq, hash)
    keep(KEYS[1], hash, data, ttl)
    listed = listed .. hash
  end
end
if first + count > n then n = first + count end
redis.call('HSET', s, 't', ARGV[1], 'n', tostring(n))
if listed ~= '' then redis.call('HSET', s, 'bl', (redis.call('HGET', s, 'bl') or '') .. listed) end
if ttl > 0 then redis.call('PEXPIRE', s, ttl) end
return {1, n}
"
);

/// A record (as if its result were in it) and a page of its current token's stream (a chunk
/// kept as a blob read from it). KEYS: the record, its stream. ARGV: the position of the first
/// chunk, the most to read. Answers `{}` without a record, else the record and the chunks.
pub(super) const READ_CHUNKS: &str = concat!(
    blob_fns!(),
    r"
local v = redis.call('GET', KEYS[1])
if not v then return {} end
local out = {whole(KEYS[1], v)}
if redis.call('HGET', KEYS[2], 't') == string.sub(v, 82, 100) then
  local from = tonumber(ARGV[1])
  local last = math.min(tonumber(redis.call('HGET', KEYS[2], 'n')), from + tonumber(ARGV[2])) - 1
  if last >= from then
    local fields = {}
    for i = from, last do fields[#fields + 1] = tostring(i) end
    local got = redis.call('HMGET', KEYS[2], unpack(fields))
    for i = 1, #fields do
      local chunk = got[i]
      if not chunk then
        chunk = blob_data(KEYS[1], redis.call('HGET', KEYS[2], 'b' .. fields[i]))
      end
      out[#out + 1] = chunk
    end
  end
end
return out
"
);

/// A record, as if its result were in it, and its operator's note. KEYS: the record, its note.
/// Answers `{}` without a record, else the record and the note (or nil).
pub(super) const LOOKUP: &str = concat!(
    blob_fns!(),
    r"
local v = redis.call('GET', KEYS[1])
if not v then return {} end
return {whole(KEYS[1], v), redis.call('GET', KEYS[2])}
"
);

/// An operator's deletion of a record, whatever its state: its note and its stream's chunks go
/// with it, and it lets go of its blob and its chunks'. KEYS: the record, its note. 1: deleted, 0: none.
pub(super) const DELETE: &str = concat!(
    blob_fns!(),
    r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
let_go(KEYS[1], v)
drop_stream(KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"
);
