//! The shared Redis store: records that expire on their own.
//!
//! `Idem::open("redis://127.0.0.1:6379/0")` connects. What it guarantees:
//!
//! - **One round trip per common claim and per completion.** The common claims are one plain command,
//!   `SET … NX PX … GET` (Redis 7.0 and later): it writes a new key's record, or hands back the
//!   record that is there, from which the replay, the mismatch, the live in-flight call and the
//!   blocked `unknown` record are read without writing. What needs a write on an existing record
//!   (an expired record, a lapsed lease, an orphan to mark `unknown`) and every claim on a server
//!   before 7.0 is a Lua script, which Redis runs atomically: the decision table of DESIGN §2
//!   (after the plain command, that is a second round trip, taken only by orphans and records
//!   the caller's clock holds expired). The completion and the release are scripts too (a token
//!   check, then the write).
//! - **Records expire on their own.** Each record is one string (see the layout below) with a
//!   Redis expiry equal to its TTL (from the claim, then from the completion); nothing needs
//!   purging.
//! - **Cluster-ready layout.** A record lives at `PREFIX:{TENANT}:KEY` where `TENANT` is the
//!   tenant in hexadecimal: the braces are a hash tag, so all of a tenant's records hash to one
//!   slot, and each script touches exactly one key.
//! - **Connection loss is survivable.** One multiplexed connection, re-established when it
//!   breaks; an operation whose connection broke before the answer is sent again once, and each
//!   script recognises its own token, so sending it twice is harmless.
//!
//! **Durability depends on the server.** Redis answers a write before it reaches the disk. With
//! `appendonly no` (the default of many installations) a restart of Redis forgets every claim,
//! and a retry after it runs the body again; with `appendonly yes` and `appendfsync everysec` a
//! crash of the server may forget the last second. Only `appendfsync always` makes a claim
//! durable before the body runs. [`StoreHealth`] says which you have, and the startup audit
//! warns when claims do not survive a restart.
//!
//! **The record** is one string, so that a claim is one `GET` and one `SET … PX` inside the
//! script (measured here: 0.83× the speed of a bare `SET` server-side, against 0.65× for a hash
//! of fields). Its layout, with fixed-width decimal numbers (zero-padded; times in milliseconds,
//! below 2^53 so that Lua compares them exactly):
//!
//! | bytes (1-based) | field |
//! |---|---|
//! | 1–32 | fingerprint |
//! | 33 | status: `i` in flight, `c` completed, `u` unknown |
//! | 34–49 | expires at (16 digits) |
//! | 50–65 | lease expires at (16 digits) |
//! | 66–81 | created at (16 digits) |
//! | 82–100 | fencing token (19 digits) |
//! | 101–104 | length of the tool name (4 digits), then the tool name |
//! | the rest | the stored result (completed records) |
//!
//! Layout version 2 added the status `u`. A prefix of version 1 is marked 2 when a build of
//! version 2 opens it (the records are unchanged); stop the older workers first, since they
//! would take an `unknown` record for an orphan.
//!
//! URL: `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?option=value&…]` with `prefix` (letters,
//! digits, `_`, `-`, `.`; default `idem`), `timeout_ms` (connect and response timeout, default
//! 5000) and `replay_cache` (entries, default 1024, 0 turns it off). TLS (`rediss://`) is not
//! supported by this build.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::admin::{AdminStore, Page, Resolution};
use super::replay_cache::{self, ReplayCache};
use super::{
    Claim, ClaimRequest, Completion, Fenced, FencingToken, Orphans, Record, RecordStatus, Store,
    StoreFuture, StoreHealth, UnixMillis, after,
};
use crate::error::{StoreError, StoreErrorKind};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;

const BACKEND: &str = "redis";

/// The layout version this build writes (kept in `PREFIX:meta`; 2 added the `unknown` status).
pub const SCHEMA_VERSION: u32 = 2;

/// Offsets of the record layout (see the module docs).
mod layout {
    pub const FINGERPRINT: std::ops::Range<usize> = 0..32;
    pub const STATUS: usize = 32;
    pub const EXPIRES: std::ops::Range<usize> = 33..49;
    pub const LEASE: std::ops::Range<usize> = 49..65;
    pub const CREATED: std::ops::Range<usize> = 65..81;
    pub const TOKEN: std::ops::Range<usize> = 81..100;
    pub const TOOL_LEN: std::ops::Range<usize> = 100..104;
    pub const HEADER: usize = 104;
}

/// Decisions: 0 acquired, 1 acquired by takeover, 2 mismatch, 3 completed (replay), 4 in flight,
/// 5 unknown. ARGV: fingerprint, now, token, lease expiry, expiry (as laid out above), TTL in ms,
/// the tool name with its 4-digit length, and the orphan policy (`0` take over, `1` reconcile:
/// take lapsed and unknown records over, `2` block: mark lapsed records unknown).
const CLAIM: &str = r"
local k = KEYS[1]
local fp, now, token, orphans = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[8]
local v = redis.call('GET', k)
if v and tonumber(string.sub(v, 34, 49)) > now then
  if string.sub(v, 1, 32) ~= fp then return {2} end
  local status = string.sub(v, 33, 33)
  local head = 104 + tonumber(string.sub(v, 101, 104))
  if status == 'c' then
    return {3, string.sub(v, 34, 49), string.sub(v, head + 1)}
  end
  if string.sub(v, 82, 100) == token then
    if string.sub(v, 66, 81) == ARGV[2] then return {0} end
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
  redis.call('SET', k, fp .. 'i' .. string.sub(v, 34, 49) .. ARGV[4] .. string.sub(v, 66, 81)
    .. token .. string.sub(v, 101, head), 'KEEPTTL')
  return {1}
end
redis.call('SET', k, fp .. 'i' .. ARGV[5] .. ARGV[4] .. ARGV[2] .. token .. ARGV[7], 'PX', ARGV[6])
return {0}
";

/// 1: applied (now, or by an earlier delivery of this very completion), 0: lost.
/// ARGV: token, result, expiry, TTL in ms, the status to settle as (`c` or `u`).
const COMPLETE: &str = r"
local k = KEYS[1]
local v = redis.call('GET', k)
if not v or string.sub(v, 82, 100) ~= ARGV[1] then return 0 end
local head = 104 + tonumber(string.sub(v, 101, 104))
if string.sub(v, 33, 33) ~= 'i' then
  if string.sub(v, 33, 33) == ARGV[5] and string.sub(v, head + 1) == ARGV[2] then return 1 end
  return 0
end
redis.call('SET', k, string.sub(v, 1, 32) .. ARGV[5] .. ARGV[3] .. string.sub(v, 50, head)
  .. ARGV[2], 'PX', ARGV[4])
return 1
";

/// 1: deleted, 0: lost. ARGV: token.
const RELEASE: &str = r"
local k = KEYS[1]
local v = redis.call('GET', k)
if v and string.sub(v, 33, 33) == 'i' and string.sub(v, 82, 100) == ARGV[1] then
  redis.call('DEL', k)
  return 1
end
return 0
";

/// An operator's resolution of a blocked record. KEYS: the record, its note. ARGV: `c`
/// (complete) or `r` (release), the result, the reason, now. 1: applied (now, or by an earlier
/// delivery of this very resolution), 0: the record is gone or not blocked.
const RESOLVE: &str = r"
local k, note = KEYS[1], KEYS[2]
local v = redis.call('GET', k)
if not v then return 0 end
local status = string.sub(v, 33, 33)
local head = 104 + tonumber(string.sub(v, 101, 104))
local resolved = '0000000000000000000'
if status == 'c' then
  if ARGV[1] == 'c' and string.sub(v, 82, 100) == resolved and string.sub(v, head + 1) == ARGV[2]
    and redis.call('GET', note) == ARGV[3] then return 1 end
  return 0
end
if status == 'i' and tonumber(string.sub(v, 50, 65)) > tonumber(ARGV[4]) then return 0 end
if ARGV[1] == 'r' then
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
";

/// Options of a [`RedisStore`], usually taken from the URL.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    connection: String,
    /// Prepended to every key (`PREFIX:{TENANT}:KEY`, `PREFIX:meta`).
    pub prefix: String,
    /// Connect and response timeout.
    pub timeout: Duration,
    /// How many completed records to keep in memory for replays (0: none).
    pub replay_cache: usize,
}

impl RedisOptions {
    /// Parses a `redis://` URL.
    pub fn from_url(url: &str) -> Result<Self, String> {
        if url.to_ascii_lowercase().starts_with("rediss://") {
            return Err("TLS (`rediss://`) is not supported by this build".into());
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut options = RedisOptions {
            connection: base.to_owned(),
            prefix: "idem".into(),
            timeout: Duration::from_secs(5),
            replay_cache: replay_cache::DEFAULT_CAPACITY,
        };
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "prefix" => {
                    let ok = !value.is_empty()
                        && value.len() <= 64
                        && value
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                    if !ok {
                        return Err(format!(
                            "`prefix` must be 1 to 64 letters, digits, `_`, `-` or `.`, not `{value}`"
                        ));
                    }
                    options.prefix = value.to_owned();
                }
                "timeout_ms" => {
                    let ms: u64 = value.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                        format!(
                            "`timeout_ms` must be a positive number of milliseconds, not `{value}`"
                        )
                    })?;
                    options.timeout = Duration::from_millis(ms);
                }
                "replay_cache" => {
                    options.replay_cache = replay_cache::parse_capacity(value)?;
                }
                "protocol" => passed_on.push(pair),
                _ => {
                    return Err(format!(
                        "unknown option `{name}`; known: `prefix`, `timeout_ms`, `replay_cache`, \
                         `protocol`"
                    ));
                }
            }
        }
        if !passed_on.is_empty() {
            options.connection = format!("{base}?{}", passed_on.join("&"));
        }
        redis::Client::open(options.connection.as_str()).map_err(|e| e.to_string())?;
        Ok(options)
    }
}

/// The shared Redis [`Store`]. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: std::sync::Arc<str>,
    scripts: std::sync::Arc<Scripts>,
    replays: std::sync::Arc<ReplayCache>,
    /// Whether the server takes `SET … NX GET` (Redis 7.0 and later): then a claim tries the
    /// plain command first (see the module docs).
    set_nx_get: bool,
}

struct Scripts {
    claim: Script,
    complete: Script,
    release: Script,
    resolve: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Classifies a driver error; the driver's own text stays in `source()`.
fn redis_error(op: &str, e: RedisError) -> StoreError {
    let (kind, cause) = if e.is_timeout() {
        (StoreErrorKind::Timeout, "the server did not answer in time")
    } else if e.is_connection_refusal() {
        (StoreErrorKind::Unavailable, "cannot reach the server")
    } else if e.is_connection_dropped() || e.is_io_error() {
        (StoreErrorKind::Unavailable, "the connection was lost")
    } else {
        match e.kind() {
            ErrorKind::AuthenticationFailed => (
                StoreErrorKind::Unavailable,
                "the server refused the credentials",
            ),
            ErrorKind::Server(ServerErrorKind::NoPerm) => (
                StoreErrorKind::Unavailable,
                "the user lacks a permission idem needs",
            ),
            ErrorKind::Server(ServerErrorKind::BusyLoading) => (
                StoreErrorKind::Unavailable,
                "the server is loading its data",
            ),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown) => (
                StoreErrorKind::Unavailable,
                "the server does not accept writes",
            ),
            ErrorKind::Server(ServerErrorKind::ClusterDown | ServerErrorKind::TryAgain) => {
                (StoreErrorKind::Unavailable, "the cluster is unavailable")
            }
            ErrorKind::Server(_) if e.to_string().contains("DB index is out of range") => (
                StoreErrorKind::Unavailable,
                "the database number does not exist on this server",
            ),
            ErrorKind::Server(_) if e.code() == Some("WRONGTYPE") => (
                StoreErrorKind::Corrupt,
                "a key under idem's prefix holds something else",
            ),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => (
                StoreErrorKind::Corrupt,
                "the server answered something unexpected",
            ),
            _ => (StoreErrorKind::Other, "the server reported an error"),
        }
    };
    StoreError::with_source(BACKEND, kind, format!("{op}: {cause}"), e)
}

fn corrupt(op: &str, what: &str) -> StoreError {
    StoreError::new(BACKEND, StoreErrorKind::Corrupt, format!("{op}: {what}"))
}

/// A time as the record lays it out: 16 digits, below 2^53 so that Lua compares it exactly.
fn time_arg(t: UnixMillis) -> String {
    format!("{:016}", t.min(1 << 53))
}

/// A token as the record lays it out: 19 digits.
fn token_arg(token: FencingToken) -> String {
    format!("{:019}", token.get())
}

fn millis_arg(d: Duration) -> String {
    d.as_millis().clamp(1, 1 << 53).to_string()
}

fn int(op: &str, v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt(op, "a number field is not a number")),
        _ => Err(corrupt(op, "a number field has the wrong type")),
    }
}

/// `PREFIX:{HEX(TENANT)}:HEX(KEY)`: hex keeps any tenant from forging a separator or a hash tag,
/// and keeps the mapping one-to-one; the braces make the tenant the Redis Cluster hash tag.
fn record_key(prefix: &str, tenant: &str, key: &IdempotencyKey) -> String {
    let mut out = String::with_capacity(prefix.len() + 4 + tenant.len() * 2 + 64);
    out.push_str(prefix);
    out.push_str(":{");
    crate::hex::push(&mut out, tenant.as_bytes());
    out.push_str("}:");
    crate::hex::push(&mut out, key.as_bytes());
    out
}

impl RedisStore {
    /// Connects and checks the layout version.
    pub async fn open(options: RedisOptions) -> Result<Self, StoreError> {
        const OP: &str = "opening the store";
        let client = redis::Client::open(options.connection.as_str()).map_err(|e| {
            StoreError::with_source(
                BACKEND,
                StoreErrorKind::Other,
                "malformed connection URL",
                e,
            )
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| redis_error(OP, e))?;
        // INFO may be forbidden (managed services): then every claim is the script.
        let server: Option<String> = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn.clone())
            .await
            .ok();
        let store = RedisStore {
            conn,
            prefix: options.prefix.into(),
            scripts: std::sync::Arc::new(Scripts {
                claim: Script::new(CLAIM),
                complete: Script::new(COMPLETE),
                release: Script::new(RELEASE),
                resolve: Script::new(RESOLVE),
            }),
            replays: std::sync::Arc::new(ReplayCache::new(options.replay_cache)),
            set_nx_get: server.as_deref().is_some_and(takes_set_nx_get),
        };
        let found = store.layout_version(OP).await?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Schema,
                format!(
                    "the prefix `{}` was written by a newer idem (layout version {found}); this \
                     build understands up to {SCHEMA_VERSION}: upgrade idem, or use another `?prefix=`",
                    store.prefix
                ),
            ));
        }
        // New, or version 1 (the same records, one status fewer): mark it as this build's.
        let _: i64 = redis::cmd("HSET")
            .arg(store.meta_key())
            .arg("schema_version")
            .arg(SCHEMA_VERSION)
            .query_async(&mut store.conn.clone())
            .await
            .map_err(|e| redis_error(OP, e))?;
        Ok(store)
    }

    /// Parses `url` and opens the store.
    pub async fn open_url(url: &str) -> Result<Self, StoreError> {
        let options = RedisOptions::from_url(url)
            .map_err(|reason| StoreError::new(BACKEND, StoreErrorKind::Other, reason))?;
        Self::open(options).await
    }

    fn meta_key(&self) -> String {
        format!("{}:meta", self.prefix)
    }

    fn record_key(&self, tenant: &str, key: &IdempotencyKey) -> String {
        record_key(&self.prefix, tenant, key)
    }

    async fn layout_version(&self, op: &str) -> Result<u32, StoreError> {
        let found: Option<u32> = redis::cmd("HGET")
            .arg(self.meta_key())
            .arg("schema_version")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| redis_error(op, e))?;
        Ok(found.unwrap_or(SCHEMA_VERSION))
    }

    /// Runs a script, once more when the connection broke under it (each script is written so
    /// that a second delivery is harmless).
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        op: &str,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let invocation = &invocation;
        again_if_broken(op, || {
            let mut conn = self.conn.clone();
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await
    }
}

/// Reads a record laid out as [`layout`] describes.
fn decode_record(
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

/// Sends what `send` makes, and once more when the connection broke under it: for commands
/// and scripts that are harmless delivered twice.
async fn again_if_broken<T, F, Fut>(op: &str, send: F) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    match send().await {
        Err(e) if e.is_connection_dropped() || e.is_io_error() => send().await,
        other => other,
    }
    .map_err(|e| redis_error(op, e))
}

/// Whether `INFO server` names a server that takes `SET … NX … GET` (Redis 7.0 and later;
/// Valkey reports the Redis version it is compatible with).
fn takes_set_nx_get(info: &str) -> bool {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))
        .and_then(|version| version.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 7)
}

/// What a claim decides from the record that `SET … NX GET` found, exactly as the claim script
/// would, when that decision writes nothing. `None` when it would write (the record expired, a
/// lease lapsed, an orphan is taken over or marked `unknown`): then the script decides, on the
/// record as it is by then.
fn decide_without_writing(
    found: Record,
    req: &ClaimRequest<'_>,
    token: FencingToken,
) -> Option<Claim> {
    if found.expires_at <= req.now {
        return None;
    }
    if found.fingerprint != req.fingerprint {
        return Some(Claim::Mismatch);
    }
    if found.status == RecordStatus::Completed {
        return Some(Claim::Completed {
            result: found.result.unwrap_or_default(),
        });
    }
    if found.token == token {
        // This very claim, sent again after the answer to the first delivery was lost.
        return Some(Claim::Acquired {
            token,
            takeover: found.created_at != req.now,
        });
    }
    match found.status {
        RecordStatus::Unknown if req.orphans != Orphans::Reconcile => Some(Claim::Unknown),
        RecordStatus::InFlight if found.lease_expires_at > req.now => Some(Claim::InFlight {
            lease_expires_at: found.lease_expires_at,
        }),
        _ => None,
    }
}

impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn expires_on_its_own(&self) -> bool {
        true
    }

    fn claim<'a>(&'a self, req: ClaimRequest<'a>) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            const OP: &str = "claim";
            if let Some(answer) = self
                .replays
                .get(req.tenant, &req.key, req.fingerprint, req.now)
            {
                return Ok(answer);
            }
            if req.tool.len() > 9999 {
                return Err(StoreError::new(
                    BACKEND,
                    StoreErrorKind::Other,
                    "claim: a tool name longer than 9999 bytes does not fit the record",
                ));
            }
            let token = FencingToken::generate();
            let (now, token_text) = (time_arg(req.now), token_arg(token));
            let (lease_at, expires_at) = (
                time_arg(after(req.now, req.lease)),
                time_arg(after(req.now, req.ttl)),
            );
            let ttl = millis_arg(req.ttl);
            let tool = format!("{:04}{}", req.tool.len(), req.tool);
            let record = self.record_key(req.tenant, &req.key);
            if self.set_nx_get {
                let new: Vec<u8> = [
                    &req.fingerprint.as_bytes()[..],
                    b"i",
                    expires_at.as_bytes(),
                    lease_at.as_bytes(),
                    now.as_bytes(),
                    token_text.as_bytes(),
                    tool.as_bytes(),
                ]
                .concat();
                let mut set = redis::cmd("SET");
                set.arg(&record)
                    .arg(new)
                    .arg("NX")
                    .arg("PX")
                    .arg(&ttl)
                    .arg("GET");
                let set = &set;
                let found: Option<Vec<u8>> = again_if_broken(OP, || {
                    let mut conn = self.conn.clone();
                    async move { set.query_async(&mut conn).await }
                })
                .await?;
                let Some(found) = found else {
                    return Ok(Claim::Acquired {
                        token,
                        takeover: false,
                    });
                };
                let found = decode_record(OP, req.tenant, req.key, &found)?;
                let expires_at = found.expires_at;
                if let Some(answer) = decide_without_writing(found, &req, token) {
                    if let Claim::Completed { result } = &answer {
                        self.replays
                            .put(req.tenant, req.key, req.fingerprint, result, expires_at);
                    }
                    return Ok(answer);
                }
            }
            let answer: Vec<Value> = self
                .invoke(
                    OP,
                    &self.scripts.claim,
                    &[&record],
                    &[
                        req.fingerprint.as_bytes(),
                        now.as_bytes(),
                        token_text.as_bytes(),
                        lease_at.as_bytes(),
                        expires_at.as_bytes(),
                        ttl.as_bytes(),
                        tool.as_bytes(),
                        match req.orphans {
                            Orphans::TakeOver => b"0",
                            Orphans::Reconcile => b"1",
                            Orphans::Block => b"2",
                        },
                    ],
                )
                .await?;
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
                    self.replays
                        .put(req.tenant, req.key, req.fingerprint, &result, expires_at);
                    Claim::Completed { result }
                }
                (4, Some(lease), _) => Claim::InFlight {
                    lease_expires_at: int(OP, lease)?.max(0) as u64,
                },
                (5, _, _) => Claim::Unknown,
                _ => return Err(corrupt(OP, "unknown decision")),
            })
        })
    }

    fn complete<'a>(&'a self, c: Completion<'a>) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let token = token_arg(c.token);
            let expires_at = time_arg(after(c.now, c.ttl));
            let ttl = millis_arg(c.ttl);
            let applied: i64 = self
                .invoke(
                    "complete",
                    &self.scripts.complete,
                    &[&self.record_key(c.tenant, &c.key)],
                    &[
                        token.as_bytes(),
                        c.result,
                        expires_at.as_bytes(),
                        ttl.as_bytes(),
                        match c.status {
                            RecordStatus::Unknown => b"u",
                            RecordStatus::Completed | RecordStatus::InFlight => b"c",
                        },
                    ],
                )
                .await?;
            Ok(if applied == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
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
            let token = token_arg(token);
            let deleted: i64 = self
                .invoke(
                    "release",
                    &self.scripts.release,
                    &[&self.record_key(tenant, &key)],
                    &[token.as_bytes()],
                )
                .await?;
            Ok(if deleted == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            })
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
            let (value, note): (Option<Vec<u8>>, Option<String>) = redis::pipe()
                .get(&record)
                .get(format!("{record}:note"))
                .query_async(&mut self.conn.clone())
                .await
                .map_err(|e| redis_error(OP, e))?;
            value
                .map(|v| decode_record(OP, tenant, key, &v).map(|r| Record { note, ..r }))
                .transpose()
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
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query_async(&mut self.conn.clone())
                .await
                .map_err(|e| redis_error(OP, e))?;
            let aof = info.lines().any(|line| line.trim() == "aof_enabled:1");
            // CONFIG may be forbidden (managed services); then the fsync policy is unknown.
            let fsync: Option<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("appendfsync")
                .query_async::<Vec<String>>(&mut self.conn.clone())
                .await
                .ok()
                .and_then(|pair| pair.into_iter().nth(1));
            let durable = aof && fsync.as_deref() == Some("always");
            let detail = match (aof, fsync.as_deref()) {
                (false, _) => Some(
                    "the server runs with appendonly no: a Redis restart forgets every claim"
                        .to_owned(),
                ),
                (true, Some("always")) => None,
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
                backend: BACKEND,
                schema_version: version,
                expected_schema_version: SCHEMA_VERSION,
                durable,
                detail,
            })
        })
    }
}

/// Decodes `HEX(tenant)` and `HEX(key)` out of `PREFIX:{HEX(tenant)}:HEX(key)`.
fn parse_record_key(prefix: &str, name: &str) -> Option<(String, IdempotencyKey)> {
    let rest = name.strip_prefix(prefix)?.strip_prefix(":{")?;
    let (tenant, key) = rest.split_once("}:")?;
    let tenant = String::from_utf8(crate::hex::decode(tenant)?).ok()?;
    let key: [u8; 32] = crate::hex::decode(key)?.try_into().ok()?;
    Some((tenant, IdempotencyKey::from_bytes(key)))
}

impl AdminStore for RedisStore {
    fn delete<'a>(&'a self, tenant: &'a str, key: IdempotencyKey) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let record = self.record_key(tenant, &key);
            let (deleted, _): (i64, i64) = redis::pipe()
                .del(&record)
                .del(format!("{record}:note"))
                .query_async(&mut self.conn.clone())
                .await
                .map_err(|e| redis_error("delete", e))?;
            Ok(if deleted == 1 {
                Fenced::Applied
            } else {
                Fenced::Lost
            })
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
    /// come in no particular order).
    fn scan<'a>(
        &'a self,
        tenant: Option<&'a str>,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            const OP: &str = "scan";
            let pattern = match tenant {
                Some(t) => format!("{}:{{{}}}:*", self.prefix, crate::hex::encode(t.as_bytes())),
                None => format!("{}:{{*}}:*", self.prefix),
            };
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
                let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(position)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    // MATCH filters after the walk: big steps keep a tenant's scan of a large
                    // keyspace to few round trips.
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| redis_error(OP, e))?;
                for name in names.iter().filter(|n| !n.ends_with(":note")) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_are_parsed_and_checked() {
        let o = RedisOptions::from_url("redis://127.0.0.1:6379/2?prefix=idem-test&timeout_ms=250")
            .unwrap();
        assert_eq!(o.prefix, "idem-test");
        assert_eq!(o.timeout, Duration::from_millis(250));
        assert_eq!(o.connection, "redis://127.0.0.1:6379/2");
        assert!(RedisOptions::from_url("redis://h/0?prefix=a{b}").is_err());
        assert!(RedisOptions::from_url("redis://h/0?prefix=a:b").is_err());
        assert!(RedisOptions::from_url("redis://h/0?timeout_ms=0").is_err());
        assert!(RedisOptions::from_url("rediss://h/0").is_err());
    }

    /// Redis Cluster's slot of a key (CRC16/XMODEM of the hash tag, or of the key, mod 16384).
    fn cluster_slot(key: &str) -> u16 {
        let bytes = key.as_bytes();
        let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
            let close = bytes[open + 1..].iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        });
        let mut crc: u16 = 0;
        for byte in tagged.unwrap_or(bytes) {
            crc ^= u16::from(*byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % 16384
    }

    #[test]
    fn a_tenants_records_share_one_cluster_slot_whatever_the_tenant() {
        assert_eq!(cluster_slot("123456789"), 12739, "CRC16/XMODEM check value");
        let keys = |tenant: &str| -> Vec<String> {
            (0..50u32)
                .map(|n| {
                    let key = crate::key::derive_key(
                        tenant,
                        "tool",
                        &[crate::key::KeyPart::new(&n).unwrap()],
                    );
                    record_key("idem", tenant, &key)
                })
                .collect()
        };
        for tenant in ["acme", "{evil}", "a}b{c", "x:y", "ñandú", "}", "{}"] {
            let keys = keys(tenant);
            let slot = cluster_slot(&keys[0]);
            assert!(
                keys.iter().all(|k| cluster_slot(k) == slot),
                "tenant {tenant:?}: one slot for all its records"
            );
            assert!(
                keys.iter()
                    .all(|k| k.matches('{').count() == 1 && k.matches('}').count() == 1)
            );
        }
        assert_ne!(
            keys("a")[0],
            keys("b")[0],
            "different tenants, different keys"
        );
    }

    mod conformance {
        async fn store() -> Option<super::RedisStore> {
            let url = crate::store::conformance::test_server_url("IDEM_TEST_REDIS_URL")?;
            Some(
                super::RedisStore::open_url(&url)
                    .await
                    .expect("IDEM_TEST_REDIS_URL names a reachable server"),
            )
        }
        crate::store_conformance_tests!(maybe: store());
        crate::admin_conformance_tests!(maybe: store());

        #[tokio::test]
        async fn the_plain_claim_is_used_when_the_server_takes_it() {
            let Some(store) = store().await else { return };
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut store.conn.clone())
                .await
                .expect("INFO");
            assert_eq!(store.set_nx_get, super::super::takes_set_nx_get(&info));
        }

        /// Every claim through the script, as on a server before Redis 7.0.
        mod scripts_only {
            async fn store() -> Option<super::super::RedisStore> {
                let store = super::store().await?;
                Some(super::super::RedisStore {
                    set_nx_get: false,
                    ..store
                })
            }
            crate::store_conformance_tests!(maybe: store());
        }
    }

    #[test]
    fn set_nx_get_is_used_from_redis_7() {
        use super::takes_set_nx_get;
        assert!(takes_set_nx_get(
            "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n"
        ));
        assert!(takes_set_nx_get(
            "redis_version:7.2.4\r\nvalkey_version:8.0.1\r\n"
        ));
        assert!(takes_set_nx_get("redis_version:10.0.0"));
        assert!(!takes_set_nx_get("# Server\r\nredis_version:6.2.14\r\n"));
        assert!(!takes_set_nx_get("redis_version:garbage"));
        assert!(!takes_set_nx_get(""));
    }

    /// The decisions the plain command takes on its own are the script's, and it leaves to the
    /// script every one that writes.
    #[test]
    fn a_found_record_is_decided_without_writing_only_when_nothing_changes() {
        use super::{Claim, ClaimRequest, FencingToken, Orphans, Record, RecordStatus};
        use super::{Fingerprint, IdempotencyKey, decide_without_writing};
        use std::time::Duration;

        let (now, mine, theirs) = (
            1_000_000,
            FencingToken::from_raw(7),
            FencingToken::from_raw(9),
        );
        let fp = Fingerprint::from_bytes([1; 32]);
        let key = IdempotencyKey::from_bytes([2; 32]);
        let req = |orphans| ClaimRequest {
            tenant: "t",
            key,
            tool: "tool",
            fingerprint: fp,
            now,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(3600),
            orphans,
        };
        let record = |status, token, lease_expires_at, expires_at| Record {
            tenant: "t".into(),
            key,
            tool: "tool".into(),
            fingerprint: fp,
            status,
            token,
            lease_expires_at,
            created_at: now - 10,
            expires_at,
            result: (status != RecordStatus::InFlight).then(|| b"42".to_vec()),
            note: None,
        };
        let decide = |found: Record, orphans| decide_without_writing(found, &req(orphans), mine);
        let live = now + 1;
        let (i, c, u) = (
            RecordStatus::InFlight,
            RecordStatus::Completed,
            RecordStatus::Unknown,
        );

        for orphans in [Orphans::TakeOver, Orphans::Reconcile, Orphans::Block] {
            // Expired by the caller's clock, though Redis still holds it: the script replaces it.
            assert_eq!(decide(record(c, theirs, 0, now), orphans), None);
            let other = Record {
                fingerprint: Fingerprint::from_bytes([3; 32]),
                ..record(c, theirs, 0, live)
            };
            assert_eq!(decide(other, orphans), Some(Claim::Mismatch));
            assert_eq!(
                decide(record(c, theirs, 0, live), orphans),
                Some(Claim::Completed {
                    result: b"42".to_vec()
                })
            );
            assert_eq!(
                decide(record(i, theirs, live, live), orphans),
                Some(Claim::InFlight {
                    lease_expires_at: live
                })
            );
            // A lapsed lease is taken over or marked: a write.
            assert_eq!(decide(record(i, theirs, now, live), orphans), None);
            // This very claim, delivered twice.
            assert_eq!(
                decide(record(i, mine, live, live), orphans),
                Some(Claim::Acquired {
                    token: mine,
                    takeover: true
                })
            );
            let first = Record {
                created_at: now,
                ..record(i, mine, live, live)
            };
            assert_eq!(
                decide(first, orphans),
                Some(Claim::Acquired {
                    token: mine,
                    takeover: false
                })
            );
        }
        assert_eq!(
            decide(record(u, theirs, 0, live), Orphans::TakeOver),
            Some(Claim::Unknown)
        );
        assert_eq!(
            decide(record(u, theirs, 0, live), Orphans::Block),
            Some(Claim::Unknown)
        );
        assert_eq!(decide(record(u, theirs, 0, live), Orphans::Reconcile), None);
    }
}
