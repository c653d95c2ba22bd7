//! The statements, prepared per schema: the one-round-trip claim of the common cases, the
//! `idem_claim` function for the rest, the fenced writes; and how their rows decode.

use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::driver::{bytes32, corrupt};
use idem_core::StoreError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::IdempotencyKey;
use idem_core::store::replay_cache::ReplayCache;
use idem_core::store::{Claim, ClaimRequest, FencingToken, Held, Record, RecordStatus, decide};

/// The columns of a [`Record`] read from `{t} r`, in [`decode_record`]'s order; `{result}` is
/// the record's result wherever it is ([`result_column`]).
const COLUMNS: &str = "r.tenant, r.key, r.tool, r.fingerprint, r.status, r.token, \
     r.lease_expires_at, r.created_at, r.expires_at, {result}, r.note";

/// The result of the record `r`: in the record, or in the blob it names, read by the same
/// statement (so from the same snapshot: a blob lives as long as a committed record names it).
fn result_column(blobs: &str) -> String {
    format!(
        "coalesce(r.result, (SELECT b.data FROM {blobs} b WHERE b.tenant = r.tenant \
         AND b.hash = r.blob))"
    )
}

/// The condition of a record an operator may resolve (`$3` is now).
pub(super) const BLOCKED: &str = "tenant = $1 AND key = $2 \
     AND (status = 'unknown' OR (status = 'in_flight' AND lease_expires_at <= $3))";

/// One statement and the types of its parameters. On a direct connection it is prepared once
/// per connection and cached; through a transaction pooler, which cannot route a named
/// statement to the server connection that prepared it, it is sent unnamed with these types
/// (parse, bind and execute in one round trip).
#[derive(Debug)]
pub(super) struct Statement {
    pub(super) sql: String,
    pub(super) types: &'static [Type],
}

const CLAIM_TYPES: &[Type] = &[
    Type::TEXT,
    Type::BYTEA,
    Type::TEXT,
    Type::BYTEA,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT2,
];
const KEY_TYPES: &[Type] = &[Type::TEXT, Type::BYTEA];
const FENCED_TYPES: &[Type] = &[Type::TEXT, Type::BYTEA, Type::INT8];
/// tenant, key, token, result, expiry, status, the blob's hash.
const BLOB_COMPLETION_TYPES: &[Type] = &[
    Type::TEXT,
    Type::BYTEA,
    Type::INT8,
    Type::BYTEA,
    Type::INT8,
    Type::TEXT,
    Type::BYTEA,
];
/// tenant, key, token, result, expiry, status: a completion that names no blob.
const COMPLETION_TYPES: &[Type] = BLOB_COMPLETION_TYPES.split_at(6).0;

fn statement(sql: String, types: &'static [Type]) -> Statement {
    Statement { sql, types }
}

/// The SQL of one schema, with its name substituted once.
#[derive(Debug)]
pub(super) struct Sql {
    /// The common claims in one plain statement (no function call): a new key is inserted, and a
    /// live record answers replay, mismatch, in flight or unknown from one snapshot. Anything
    /// else (expired, lapsed lease, this claim sent again, a concurrent insert) answers `-1` or
    /// no row, and the claim goes to [`Sql::claim`].
    pub(super) claim_fast: Statement,
    /// What a claim reads first when most claims lately were answered without writing
    /// ([`ReadFirst`]): the fields of the record that [`decide`](idem_core::store::decide) reads,
    /// and the result; the decision is taken here ([`decide_read`]), not in SQL.
    ///
    /// [`ReadFirst`]: idem_core::store::read_first::ReadFirst
    pub(super) claim_read: Statement,
    /// The whole decision table: the schema's function `idem_claim`.
    pub(super) claim: Statement,
    pub(super) complete: Statement,
    /// The completion of a tool that declares `wait`: it also sends the schema's notice.
    pub(super) complete_notify: Statement,
    /// The completion of a transactional call: an error (division by zero) when the claim's row
    /// is not there to complete, so that the `COMMIT` sent with it rolls back.
    pub(super) complete_or_abort: Statement,
    /// [`Sql::complete`], [`Sql::complete_notify`] and [`Sql::complete_or_abort`] of a result
    /// stored as a blob (`$7`, its hash): the record names the blob, and the blob is written, or
    /// counted once more, by the same statement.
    pub(super) complete_blob: [Statement; 3],
    /// The claims of a batch: `idem_claim` for each item of the arrays, in their order (the
    /// store sends them sorted by key, so that two batches lock their keys in one order).
    pub(super) claim_batch: Statement,
    /// The settlements of a batch: the fenced completions and releases of the items of the
    /// arrays (status `release` releases), and the completions found already applied with these
    /// very tokens, statuses and results (sent again after a lost answer): the positions that
    /// applied.
    pub(super) settle_batch: Statement,
    /// The fenced renewals of a batch's items: the positions renewed.
    pub(super) renew_batch: Statement,
    pub(super) renew: Statement,
    /// Chunks appended to a claimed key's stream: whether the token owns the record, how many
    /// chunks its stream held, how many were added.
    pub(super) append_chunks: Statement,
    /// A record and a page of its current token's stream, as [`COLUMNS`] and an array.
    pub(super) read_chunks: Statement,
    pub(super) release: Statement,
    pub(super) lookup: Statement,
    pub(super) scan: Statement,
    pub(super) resolve_complete: Statement,
    pub(super) resolve_release: Statement,
    pub(super) delete: Statement,
    pub(super) purge: Statement,
    pub(super) version: Statement,
    pub(super) server_time: Statement,
    /// How many blobs (of one tenant, or all) and their bytes.
    pub(super) blob_usage: Statement,
}

impl Sql {
    pub(super) fn new(schema: &str) -> Self {
        let t = format!("\"{schema}\".idem_records");
        let c = format!("\"{schema}\".idem_chunks");
        let b = format!("\"{schema}\".idem_blobs");
        let result = result_column(&b);
        let columns = COLUMNS.replace("{result}", &result);
        // The notice names the key in hex (see `notices.rs`); the channel is a literal.
        let notify = format!(
            "pg_notify('{}', encode(key, 'hex'))",
            crate::notices::channel(schema)
        );
        // The fenced completion, written once: alone, announced, or aborting its transaction.
        let settle = format!(
            "UPDATE {t} SET status = $6, result = $4, expires_at = $5 \
             WHERE tenant = $1 AND key = $2 AND token = $3 AND status = 'in_flight'"
        );
        let settle_blob = format!(
            "WITH done AS (UPDATE {t} SET status = $6, result = NULL, blob = $7, expires_at = $5 \
             WHERE tenant = $1 AND key = $2 AND token = $3 AND status = 'in_flight' \
             RETURNING key), \
             kept AS (INSERT INTO {b} (tenant, hash, refs, data) SELECT $1, $7, 1, $4 FROM done \
             ON CONFLICT (tenant, hash) DO UPDATE SET refs = {b}.refs + 1)"
        );
        Sql {
            server_time: statement(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint".into(),
                &[],
            ),
            claim_fast: statement(
                format!(
                    "WITH held AS (SELECT fingerprint, status, token, lease_expires_at, expires_at, \
                 {result} AS result FROM {t} r WHERE tenant = $1::text AND key = $2::bytea), \
                 ins AS (INSERT INTO {t} (tenant, key, tool, fingerprint, status, token, \
                 lease_expires_at, created_at, expires_at) SELECT $1, $2, $3::text, $4::bytea, \
                 'in_flight', $5::bigint, $6::bigint + $7::bigint, $6, $6 + $8::bigint \
                 WHERE NOT EXISTS (SELECT 1 FROM held) \
                 ON CONFLICT (tenant, key) DO NOTHING RETURNING token) \
                 SELECT 0::smallint, token, NULL::bigint, NULL::bigint, NULL::bytea FROM ins \
                 UNION ALL \
                 SELECT CASE WHEN h.expires_at <= $6 THEN -1 \
                 WHEN h.fingerprint <> $4 THEN 2 \
                 WHEN h.status = 'completed' THEN 3 \
                 WHEN h.token = $5 THEN -1 \
                 WHEN h.status = 'unknown' THEN CASE WHEN $9::smallint = 1 THEN -1 ELSE 5 END \
                 WHEN h.lease_expires_at > $6 THEN 4 \
                 ELSE -1 END::smallint, NULL, h.lease_expires_at, h.expires_at, h.result \
                 FROM held h"
                ),
                CLAIM_TYPES,
            ),
            claim_read: statement(
                format!(
                    "SELECT fingerprint, status, lease_expires_at, expires_at, {result} \
                 FROM {t} r WHERE tenant = $1::text AND key = $2::bytea"
                ),
                KEY_TYPES,
            ),
            claim: statement(
                format!(
                    "SELECT decision, token, lease_expires_at, expires_at, result \
                 FROM \"{schema}\".idem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9)"
                ),
                CLAIM_TYPES,
            ),
            complete: statement(format!("{settle} RETURNING 1"), COMPLETION_TYPES),
            complete_notify: statement(
                format!("WITH done AS ({settle} RETURNING key) SELECT {notify} FROM done"),
                COMPLETION_TYPES,
            ),
            complete_or_abort: statement(
                format!("WITH done AS ({settle} RETURNING 1) SELECT 1 / count(*)::int FROM done"),
                COMPLETION_TYPES,
            ),
            complete_blob: [
                format!("{settle_blob} SELECT 1 FROM done"),
                format!("{settle_blob} SELECT {notify} FROM done"),
                format!("{settle_blob} SELECT 1 / count(*)::int FROM done"),
            ]
            .map(|sql| statement(sql, BLOB_COMPLETION_TYPES)),
            claim_batch: statement(
                format!(
                    "SELECT c.decision, c.token, c.lease_expires_at, c.expires_at, c.result \
                 FROM unnest($2::bytea[], $4::bytea[], $5::int8[]) WITH ORDINALITY \
                 AS i(key, fingerprint, token, n) \
                 CROSS JOIN LATERAL \"{schema}\".idem_claim($1::text, i.key, $3::text, \
                 i.fingerprint, i.token, $6::int8, $7::int8, $8::int8, $9::int2) AS c \
                 ORDER BY i.n"
                ),
                &[
                    Type::TEXT,
                    Type::BYTEA_ARRAY,
                    Type::TEXT,
                    Type::BYTEA_ARRAY,
                    Type::INT8_ARRAY,
                    Type::INT8,
                    Type::INT8,
                    Type::INT8,
                    Type::INT2,
                ],
            ),
            settle_batch: statement(
                format!(
                    "WITH i AS (SELECT * FROM unnest($2::bytea[], $3::int8[], $4::bytea[], \
                 $5::text[]) WITH ORDINALITY AS i(key, token, result, status, n)), \
                 done AS (UPDATE {t} r SET status = i.status, result = i.result, \
                 expires_at = $6::int8 FROM i WHERE r.tenant = $1::text AND r.key = i.key \
                 AND r.token = i.token AND r.status = 'in_flight' AND i.status <> 'release' \
                 RETURNING i.n), \
                 gone AS (DELETE FROM {t} r USING i WHERE r.tenant = $1 AND r.key = i.key \
                 AND r.token = i.token AND r.status = 'in_flight' AND i.status = 'release' \
                 RETURNING i.n), \
                 again AS (SELECT i.n FROM i JOIN {t} r ON r.tenant = $1 AND r.key = i.key \
                 AND r.token = i.token AND r.status = i.status AND r.result = i.result) \
                 SELECT n FROM done UNION SELECT n FROM gone UNION SELECT n FROM again"
                ),
                &[
                    Type::TEXT,
                    Type::BYTEA_ARRAY,
                    Type::INT8_ARRAY,
                    Type::BYTEA_ARRAY,
                    Type::TEXT_ARRAY,
                    Type::INT8,
                ],
            ),
            renew_batch: statement(
                format!(
                    "UPDATE {t} r SET lease_expires_at = $3::int8, \
                 expires_at = GREATEST(r.expires_at, $3::int8) \
                 FROM unnest($2::bytea[], $4::int8[]) WITH ORDINALITY AS i(key, token, n) \
                 WHERE r.tenant = $1::text AND r.key = i.key AND r.token = i.token \
                 AND r.status = 'in_flight' RETURNING i.n"
                ),
                &[Type::TEXT, Type::BYTEA_ARRAY, Type::INT8, Type::INT8_ARRAY],
            ),
            renew: statement(
                format!(
                    "UPDATE {t} SET lease_expires_at = $4, expires_at = GREATEST(expires_at, $4) \
                 WHERE tenant = $1 AND key = $2 AND token = $3 AND status = 'in_flight' \
                 RETURNING 1"
                ),
                &[Type::TEXT, Type::BYTEA, Type::INT8, Type::INT8],
            ),
            append_chunks: statement(
                format!(
                    "WITH owner AS (SELECT 1 FROM {t} WHERE tenant = $1 AND key = $2 \
                     AND token = $3 AND status = 'in_flight' FOR SHARE), \
                 dropped AS (DELETE FROM {c} WHERE $4::bigint = 0 AND tenant = $1 AND key = $2 \
                     AND token <> $3 AND EXISTS (SELECT 1 FROM owner)), \
                 have AS (SELECT coalesce(max(seq) + 1, 0) AS n FROM {c} \
                     WHERE tenant = $1 AND key = $2 AND token = $3), \
                 chunk AS (SELECT $4::bigint + u.ord - 1 AS seq, u.data, u.hash \
                     FROM unnest($5::bytea[], $6::bytea[]) WITH ORDINALITY AS u(data, hash, ord)), \
                 added AS (INSERT INTO {c} (tenant, key, token, seq, data, blob) \
                     SELECT $1, $2, $3, chunk.seq, \
                         CASE WHEN chunk.hash IS NULL THEN chunk.data ELSE ''::bytea END, \
                         chunk.hash \
                     FROM chunk, have \
                     WHERE EXISTS (SELECT 1 FROM owner) AND $4::bigint <= have.n \
                     AND chunk.seq >= have.n \
                     ON CONFLICT DO NOTHING RETURNING seq, blob), \
                 kept AS (INSERT INTO {b} AS d (tenant, hash, refs, data) \
                     SELECT DISTINCT ON (chunk.hash) $1, chunk.hash, \
                         count(*) OVER (PARTITION BY chunk.hash), chunk.data \
                     FROM added JOIN chunk ON chunk.seq = added.seq \
                     WHERE added.blob IS NOT NULL ORDER BY chunk.hash \
                     ON CONFLICT (tenant, hash) DO UPDATE SET refs = d.refs + EXCLUDED.refs \
                     RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM owner), (SELECT n FROM have), \
                     (SELECT count(*) FROM added), (SELECT count(*) FROM kept)"
                ),
                &[
                    Type::TEXT,
                    Type::BYTEA,
                    Type::INT8,
                    Type::INT8,
                    Type::BYTEA_ARRAY,
                    Type::BYTEA_ARRAY,
                ],
            ),
            read_chunks: statement(
                format!(
                    "SELECT {columns}, ARRAY(SELECT CASE WHEN c.blob IS NULL THEN c.data \
                     ELSE (SELECT d.data FROM {b} d WHERE d.tenant = c.tenant AND d.hash = c.blob) \
                     END FROM {c} c WHERE c.tenant = r.tenant \
                     AND c.key = r.key AND c.token = r.token AND c.seq >= $3::bigint \
                     ORDER BY c.seq LIMIT $4::bigint) \
                 FROM {t} r WHERE r.tenant = $1 AND r.key = $2"
                ),
                &[Type::TEXT, Type::BYTEA, Type::INT8, Type::INT8],
            ),
            release: statement(
                format!(
                    "WITH gone AS (DELETE FROM {t} WHERE tenant = $1 AND key = $2 AND token = $3 \
                 AND status = 'in_flight' RETURNING key) SELECT {notify} FROM gone"
                ),
                FENCED_TYPES,
            ),
            lookup: statement(
                format!("SELECT {columns} FROM {t} r WHERE tenant = $1 AND key = $2"),
                KEY_TYPES,
            ),
            scan: statement(
                format!(
                    "SELECT {columns} FROM {t} r WHERE ($1::text IS NULL OR tenant = $1) \
                 AND (tenant, key) > ($2, $3) ORDER BY tenant, key LIMIT $4"
                ),
                &[Type::TEXT, Type::TEXT, Type::BYTEA, Type::INT8],
            ),
            resolve_complete: statement(
                format!(
                    "UPDATE {t} SET status = 'completed', result = $4, note = $5, token = 0 \
                 WHERE {BLOCKED} RETURNING 1"
                ),
                &[Type::TEXT, Type::BYTEA, Type::INT8, Type::BYTEA, Type::TEXT],
            ),
            resolve_release: statement(
                format!("DELETE FROM {t} WHERE {BLOCKED} RETURNING 1"),
                FENCED_TYPES,
            ),
            delete: statement(
                format!("DELETE FROM {t} WHERE tenant = $1 AND key = $2 RETURNING 1"),
                KEY_TYPES,
            ),
            purge: statement(
                format!(
                    "DELETE FROM {t} WHERE (tenant, key) IN (SELECT tenant, key FROM {t} \
                 WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1"
                ),
                &[Type::INT8, Type::INT8],
            ),
            version: statement(
                format!("SELECT value FROM \"{schema}\".idem_meta WHERE name = 'schema_version'"),
                &[],
            ),
            blob_usage: statement(
                format!(
                    "SELECT count(*), coalesce(sum(octet_length(data)), 0)::bigint FROM {b} \
                     WHERE $1::text IS NULL OR tenant = $1"
                ),
                &[Type::TEXT],
            ),
        }
    }
}

/// The columns of a claim's answer (`decision, token, lease_expires_at, expires_at, result`),
/// whichever driver read them.
pub(super) struct ClaimRow {
    pub(super) decision: i16,
    pub(super) token: Option<i64>,
    pub(super) lease_expires_at: Option<i64>,
    pub(super) expires_at: Option<i64>,
    pub(super) result: Option<Vec<u8>>,
}

impl ClaimRow {
    /// Reads a claim's answer from a tokio-postgres row.
    pub(super) fn read(row: &Row) -> ClaimRow {
        ClaimRow {
            decision: row.get(0),
            token: row.get(1),
            lease_expires_at: row.get(2),
            expires_at: row.get(3),
            result: row.get(4),
        }
    }
}

pub(super) fn decode_claim(
    row: &Row,
    token: FencingToken,
    req: ClaimRequest<'_>,
    replays: &ReplayCache,
) -> Result<Claim, StoreError> {
    decide_claim(ClaimRow::read(row), token, req, replays)
}

/// The claim a row answers; a replay goes into the replay cache. `token` is the one the claim
/// sent.
pub(super) fn decide_claim(
    row: ClaimRow,
    token: FencingToken,
    req: ClaimRequest<'_>,
    replays: &ReplayCache,
) -> Result<Claim, StoreError> {
    const OP: &str = "claim";
    let missing = || corrupt(OP, "the claim's answer lacks a column");
    Ok(match row.decision {
        0 | 1 => {
            let stored = row.token.ok_or_else(missing)?;
            if stored as u64 != token.get() {
                return Err(corrupt(OP, "the server answered with another token"));
            }
            Claim::Acquired {
                token,
                takeover: row.decision == 1,
            }
        }
        2 => Claim::Mismatch,
        3 => {
            let result = row.result.unwrap_or_default();
            let expires_at = row.expires_at.ok_or_else(missing)?;
            replays.put(&req, &result, expires_at.max(0) as u64);
            Claim::Completed { result }
        }
        4 => {
            let lease = row.lease_expires_at.ok_or_else(missing)?;
            Claim::InFlight {
                lease_expires_at: lease.max(0) as u64,
            }
        }
        5 => Claim::Unknown,
        other => return Err(corrupt(OP, &format!("unknown decision {other}"))),
    })
}

/// What a claim decides from the record [`Sql::claim_read`] found, by the one decision table
/// ([`decide`]): `Some` for the answers that write nothing (a replay, which goes into the replay
/// cache, a mismatch, a live lease, a blocked `unknown` record), `None` for what only the
/// claim function decides (an expired record, an orphan to take over or mark `unknown`).
pub(super) fn decide_read(
    row: &Row,
    req: &ClaimRequest<'_>,
    replays: &ReplayCache,
) -> Result<Option<Claim>, StoreError> {
    const OP: &str = "claim";
    let status: &str = row.get(1);
    let held = Held {
        fingerprint: Fingerprint::from_bytes(bytes32(OP, row.get(0))?),
        status: RecordStatus::parse(status).ok_or_else(|| corrupt(OP, "unknown status"))?,
        lease_expires_at: row.get::<_, i64>(2).max(0) as u64,
        expires_at: row.get::<_, i64>(3).max(0) as u64,
    };
    let decision = decide(Some(held), req.fingerprint, req.now, req.orphans);
    let answer =
        decision.answer_without_writing(|| row.get::<_, Option<Vec<u8>>>(4).unwrap_or_default());
    if let Some(Claim::Completed { result }) = &answer {
        replays.put(req, result, held.expires_at);
    }
    Ok(answer)
}

pub(super) fn decode_record(row: &Row) -> Result<Record, StoreError> {
    const OP: &str = "lookup";
    let status: &str = row.get(4);
    let time = |i: usize| row.get::<_, i64>(i).max(0) as u64;
    Ok(Record {
        tenant: row.get(0),
        key: IdempotencyKey::from_bytes(bytes32(OP, row.get(1))?),
        tool: row.get(2),
        fingerprint: Fingerprint::from_bytes(bytes32(OP, row.get(3))?),
        status: RecordStatus::parse(status).ok_or_else(|| corrupt(OP, "unknown status"))?,
        token: FencingToken::from_raw(row.get::<_, i64>(5) as u64),
        lease_expires_at: time(6),
        created_at: time(7),
        expires_at: time(8),
        result: row.get(9),
        note: row.get(10),
    })
}
