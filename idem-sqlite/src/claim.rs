//! The claim and the other writes, as statements applied inside a group commit's transaction,
//! and the reads that decide a claim without writing (on the reader pool).

use std::time::Duration;

use rusqlite::{Connection, params};

use super::driver::{BACKEND, bytes32, db_time, sql_error, status};
use idem_core::fingerprint::Fingerprint;
use idem_core::key::IdempotencyKey;
use idem_core::store::blob::BlobHash;
use idem_core::store::stream::{AppendAt, out_of_order};
use idem_core::store::{
    Claim, Decision, Fenced, FencingToken, Held, Orphans, Record, RecordStatus, StreamPage,
    UnixMillis, after, decide,
};
use idem_core::{StoreError, StoreErrorKind};

/// A record's result, wherever it is: in the record, or in the blob it names (a subquery of
/// the same statement, so of the same snapshot).
macro_rules! result_column {
    () => {
        "coalesce(result, (SELECT data FROM idem_blobs b \
         WHERE b.tenant = idem_records.tenant AND b.hash = idem_records.blob))"
    };
}

pub(super) const SELECT_HELD: &str = concat!(
    "SELECT fingerprint, status, lease_expires_at, expires_at, ",
    result_column!(),
    " FROM idem_records WHERE tenant = ?1 AND key = ?2"
);

pub(super) const RECORD_COLUMNS: &str = concat!(
    "tenant, key, tool, fingerprint, status, token, lease_expires_at, created_at, expires_at, ",
    result_column!(),
    ", note"
);

/// The condition of a record an operator may resolve (`?3` is now).
pub(super) const BLOCKED: &str = "tenant = ?1 AND key = ?2 \
     AND (status = 'unknown' OR (status = 'in_flight' AND lease_expires_at <= ?3))";

pub(super) enum Op {
    Claim {
        tenant: String,
        key: IdempotencyKey,
        tool: String,
        fingerprint: Fingerprint,
        now: UnixMillis,
        lease: Duration,
        ttl: Duration,
        orphans: Orphans,
    },
    Complete {
        tenant: String,
        key: IdempotencyKey,
        token: FencingToken,
        status: RecordStatus,
        result: Vec<u8>,
        /// The blob the result is stored in, when it is past the store's threshold.
        blob: Option<BlobHash>,
        expires_at: UnixMillis,
    },
    Renew {
        tenant: String,
        key: IdempotencyKey,
        token: FencingToken,
        lease_expires_at: UnixMillis,
    },
    Release {
        tenant: String,
        key: IdempotencyKey,
        token: FencingToken,
    },
    Purge {
        now: UnixMillis,
        limit: usize,
    },
    Delete {
        tenant: String,
        key: IdempotencyKey,
    },
    Resolve {
        tenant: String,
        key: IdempotencyKey,
        /// The result to complete with; `None` releases.
        result: Option<Vec<u8>>,
        reason: String,
        now: UnixMillis,
    },
    /// Chunks appended to the stream of a claimed key, fenced by its token (all of them or,
    /// on an error, none).
    Append {
        tenant: String,
        key: IdempotencyKey,
        token: FencingToken,
        first: u64,
        chunks: Vec<Vec<u8>>,
        /// The blob of each chunk stored apart (`None`: in its row).
        blobs: Vec<Option<BlobHash>>,
    },
    /// The operations of a batch's items, in one job of the group commit: all of them or, if
    /// one fails, none (a savepoint).
    Batch(Vec<Op>),
}

pub(super) enum Reply {
    Claim(Claim),
    /// A replay decided on the write path, with what the replay cache needs.
    Replay {
        result: Vec<u8>,
        expires_at: UnixMillis,
    },
    Fenced(Fenced),
    Purged(usize),
    /// One reply per operation of an [`Op::Batch`], in order.
    Batch(Vec<Reply>),
}

/// What a claim decides on, and the stored result when the record is completed.
pub(super) type HeldRecord = (Held, Option<Vec<u8>>);

/// Reads what a claim decides on, without allocating for the fixed-size columns. The result is
/// copied only for completed records (the replay path).
pub(super) fn read_held(
    conn: &Connection,
    tenant: &str,
    key: &IdempotencyKey,
) -> Result<Option<HeldRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(SELECT_HELD)
        .map_err(|e| sql_error("claim", e))?;
    let mut rows = stmt
        .query(params![tenant, &key.as_bytes()[..]])
        .map_err(|e| sql_error("claim", e))?;
    let Some(row) = rows.next().map_err(|e| sql_error("claim", e))? else {
        return Ok(None);
    };
    let corrupt =
        |what: &str| StoreError::new(BACKEND, StoreErrorKind::Corrupt, format!("claim: {what}"));
    let column = |i| row.get_ref(i).map_err(|e| sql_error("claim", e));
    let fingerprint: [u8; 32] = column(0)?
        .as_blob()
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("the fingerprint column is not 32 bytes"))?;
    let status = column(1)?
        .as_str()
        .ok()
        .and_then(RecordStatus::parse)
        .ok_or_else(|| corrupt("unknown status"))?;
    let time = |i| -> Result<u64, StoreError> {
        let t = column(i)?
            .as_i64()
            .map_err(|_| corrupt("a time column is not an integer"))?;
        Ok(t.max(0) as u64)
    };
    let held = Held {
        fingerprint: Fingerprint::from_bytes(fingerprint),
        status,
        lease_expires_at: time(2)?,
        expires_at: time(3)?,
    };
    let result = match status {
        RecordStatus::Completed => column(4)?
            .as_blob_or_null()
            .ok()
            .flatten()
            .map(<[u8]>::to_vec),
        RecordStatus::InFlight | RecordStatus::Unknown => None,
    };
    Ok(Some((held, result)))
}

/// Writes a new key's record, in flight under `token` (`times`: the lease's expiry, the
/// creation, the record's expiry), unless the key has a record already: whether it did.
fn insert_new(
    tx: &Connection,
    tenant: &str,
    key: &IdempotencyKey,
    tool: &str,
    fingerprint: Fingerprint,
    token: FencingToken,
    (lease_expires_at, created_at, expires_at): (i64, i64, i64),
) -> Result<bool, StoreError> {
    tx.prepare_cached(
        "INSERT INTO idem_records (tenant, key, tool, fingerprint, status, token, \
         lease_expires_at, created_at, expires_at, result) \
         VALUES (?1, ?2, ?3, ?4, 'in_flight', ?5, ?6, ?7, ?8, NULL) \
         ON CONFLICT (tenant, key) DO NOTHING",
    )
    .and_then(|mut s| {
        s.execute(params![
            tenant,
            &key.as_bytes()[..],
            tool,
            &fingerprint.as_bytes()[..],
            token.get() as i64,
            lease_expires_at,
            created_at,
            expires_at,
        ])
    })
    .map(|inserted| inserted == 1)
    .map_err(|e| sql_error("claim", e))
}

/// Runs `f` inside a savepoint: what it wrote stays only if it succeeds.
fn all_or_nothing<T>(
    tx: &Connection,
    op: &str,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let savepoint = |sql| tx.execute_batch(sql).map_err(|e| sql_error(op, e));
    savepoint("SAVEPOINT idem_op")?;
    let out = f();
    if out.is_err() {
        savepoint("ROLLBACK TO idem_op")?;
    }
    savepoint("RELEASE idem_op")?;
    out
}

pub(super) fn apply(tx: &Connection, op: Op) -> Result<Reply, StoreError> {
    match op {
        Op::Batch(ops) => all_or_nothing(tx, "batch", || {
            ops.into_iter()
                .map(|op| apply(tx, op))
                .collect::<Result<Vec<Reply>, StoreError>>()
                .map(Reply::Batch)
        }),
        Op::Append {
            tenant,
            key,
            token,
            first,
            chunks,
            blobs,
        } => all_or_nothing(tx, "append_chunks", || {
            append(tx, &tenant, &key, token, first, &chunks, &blobs)
        }),
        Op::Claim {
            tenant,
            key,
            tool,
            fingerprint,
            now,
            lease,
            ttl,
            orphans,
        } => {
            let token = FencingToken::generate();
            let insert = || {
                let times = (
                    db_time(after(now, lease)),
                    db_time(now),
                    db_time(after(now, ttl)),
                );
                insert_new(tx, &tenant, &key, &tool, fingerprint, token, times)
            };
            // A new key, the common case: one INSERT, which leaves a record already there be.
            if insert()? {
                let claim = Claim::Acquired {
                    token,
                    takeover: false,
                };
                return Ok(Reply::Claim(claim));
            }
            let held = read_held(tx, &tenant, &key)?;
            let claim = match decide(held.as_ref().map(|h| h.0), fingerprint, now, orphans) {
                Decision::Mismatch => Claim::Mismatch,
                Decision::Blocked => Claim::Unknown,
                Decision::MarkUnknown => {
                    tx.prepare_cached(
                        "UPDATE idem_records SET status = 'unknown' WHERE tenant = ?1 AND key = ?2",
                    )
                    .and_then(|mut s| s.execute(params![tenant, &key.as_bytes()[..]]))
                    .map_err(|e| sql_error("claim", e))?;
                    Claim::Unknown
                }
                Decision::InFlight { lease_expires_at } => Claim::InFlight { lease_expires_at },
                Decision::Replay => {
                    let (held, result) = held.expect("a replay has a record");
                    return Ok(Reply::Replay {
                        result: result.unwrap_or_default(),
                        expires_at: held.expires_at,
                    });
                }
                Decision::Insert => {
                    // An expired record: deleted first, so that its triggers let go of its blob
                    // and chunks (a REPLACE deletes without running them).
                    tx.prepare_cached("DELETE FROM idem_records WHERE tenant = ?1 AND key = ?2")
                        .and_then(|mut s| s.execute(params![tenant, &key.as_bytes()[..]]))
                        .map_err(|e| sql_error("claim", e))?;
                    if !insert()? {
                        return Err(StoreError::new(
                            BACKEND,
                            StoreErrorKind::Other,
                            "claim: the key still had a record after its expired one was deleted",
                        ));
                    }
                    Claim::Acquired {
                        token,
                        takeover: false,
                    }
                }
                Decision::Takeover => {
                    tx.prepare_cached(
                        "UPDATE idem_records SET status = 'in_flight', token = ?3, \
                         lease_expires_at = ?4, result = NULL WHERE tenant = ?1 AND key = ?2",
                    )
                    .and_then(|mut s| {
                        s.execute(params![
                            tenant,
                            &key.as_bytes()[..],
                            token.get() as i64,
                            db_time(after(now, lease)),
                        ])
                    })
                    .map_err(|e| sql_error("claim", e))?;
                    Claim::Acquired {
                        token,
                        takeover: true,
                    }
                }
            };
            Ok(Reply::Claim(claim))
        }
        Op::Complete {
            tenant,
            key,
            token,
            status,
            result,
            blob,
            expires_at,
        } => complete(tx, &tenant, &key, token, status, &result, blob, expires_at),
        Op::Renew {
            tenant,
            key,
            token,
            lease_expires_at,
        } => {
            let n = tx
                .prepare_cached(
                    "UPDATE idem_records SET lease_expires_at = ?4, \
                     expires_at = max(expires_at, ?4) \
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND status = 'in_flight'",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        tenant,
                        &key.as_bytes()[..],
                        token.get() as i64,
                        db_time(lease_expires_at),
                    ])
                })
                .map_err(|e| sql_error("renew", e))?;
            Ok(fenced(n))
        }
        Op::Release { tenant, key, token } => {
            let n = tx
                .prepare_cached(
                    "DELETE FROM idem_records \
                     WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND status = 'in_flight'",
                )
                .and_then(|mut s| {
                    s.execute(params![tenant, &key.as_bytes()[..], token.get() as i64])
                })
                .map_err(|e| sql_error("release", e))?;
            Ok(fenced(n))
        }
        Op::Delete { tenant, key } => {
            let n = tx
                .prepare_cached("DELETE FROM idem_records WHERE tenant = ?1 AND key = ?2")
                .and_then(|mut s| s.execute(params![tenant, &key.as_bytes()[..]]))
                .map_err(|e| sql_error("delete", e))?;
            Ok(fenced(n))
        }
        Op::Resolve {
            tenant,
            key,
            result,
            reason,
            now,
        } => {
            let key = &key.as_bytes()[..];
            let n = match result {
                Some(result) => {
                    tx.prepare_cached(&format!(
                        "UPDATE idem_records SET status = 'completed', result = ?4, note = ?5, \
                         token = 0 WHERE {BLOCKED}"
                    ))
                    .and_then(|mut s| s.execute(params![tenant, key, db_time(now), result, reason]))
                }
                None => tx
                    .prepare_cached(&format!("DELETE FROM idem_records WHERE {BLOCKED}"))
                    .and_then(|mut s| s.execute(params![tenant, key, db_time(now)])),
            }
            .map_err(|e| sql_error("resolve", e))?;
            Ok(fenced(n))
        }
        Op::Purge { now, limit } => {
            let n = tx
                .prepare_cached(
                    "DELETE FROM idem_records WHERE (tenant, key) IN \
                     (SELECT tenant, key FROM idem_records WHERE expires_at <= ?1 LIMIT ?2)",
                )
                .and_then(|mut s| s.execute(params![db_time(now), limit as i64]))
                .map_err(|e| sql_error("purge", e))?;
            Ok(Reply::Purged(n))
        }
    }
}

/// Settles `key` as `status` with `result` if `token` owns its `in_flight` record: in the
/// record, or in the `blob` it names (written in the same transaction if it is new).
#[allow(clippy::too_many_arguments)]
fn complete(
    tx: &Connection,
    tenant: &str,
    key: &IdempotencyKey,
    token: FencingToken,
    status: RecordStatus,
    result: &[u8],
    blob: Option<BlobHash>,
    expires_at: UnixMillis,
) -> Result<Reply, StoreError> {
    let err = |e| sql_error("complete", e);
    let (key, token) = (&key.as_bytes()[..], token.get() as i64);
    let hash = blob.as_ref().map(|h| &h.as_bytes()[..]);
    // The record keeps the result, or NULL and the blob's hash.
    let (inline, named) = match hash {
        Some(hash) => (None, Some(hash)),
        None => (Some(result), None),
    };
    // An in-flight record names no blob (claims write none; only a completion does, and only
    // a completed record keeps one), so a result kept inline leaves the column be: updating it
    // would cost its trigger and its index a visit at every completion.
    let (update, value) = match hash {
        Some(hash) => (
            "UPDATE idem_records SET status = ?6, result = NULL, blob = ?4, expires_at = ?5 \
             WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND status = 'in_flight'",
            hash,
        ),
        None => (
            "UPDATE idem_records SET status = ?6, result = ?4, expires_at = ?5 \
             WHERE tenant = ?1 AND key = ?2 AND token = ?3 AND status = 'in_flight'",
            result,
        ),
    };
    let n = tx
        .prepare_cached(update)
        .and_then(|mut s| {
            s.execute(params![
                tenant,
                key,
                token,
                value,
                db_time(expires_at),
                status.as_str(),
            ])
        })
        .map_err(err)?;
    if n == 1 {
        if let Some(hash) = hash {
            tx.prepare_cached(
                "INSERT INTO idem_blobs (tenant, hash, data) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (tenant, hash) DO NOTHING",
            )
            .and_then(|mut s| s.execute(params![tenant, hash, result]))
            .map_err(err)?;
        }
        return Ok(fenced(1));
    }
    // Nothing changed: another owner holds the key, or this very completion was applied by an
    // earlier attempt whose answer was lost.
    let ours = tx
        .prepare_cached(
            "SELECT 1 FROM idem_records WHERE tenant = ?1 AND key = ?2 AND token = ?3 \
             AND status = ?4 AND (result = ?5 OR blob = ?6)",
        )
        .and_then(|mut s| s.exists(params![tenant, key, token, status.as_str(), inline, named]))
        .map_err(err)?;
    Ok(fenced(usize::from(ours)))
}

/// Appends `chunks` at `first` to the stream of `key` if `token` owns its `in_flight` record
/// (see `idem_core::store::stream`): a new holder's first append drops an older holder's chunks.
/// A chunk with a blob hash (in `blobs`, one per chunk) is written to its blob, once.
fn append(
    tx: &Connection,
    tenant: &str,
    key: &IdempotencyKey,
    token: FencingToken,
    first: u64,
    chunks: &[Vec<u8>],
    blobs: &[Option<BlobHash>],
) -> Result<Reply, StoreError> {
    let err = |e| sql_error("append_chunks", e);
    let (key, token) = (&key.as_bytes()[..], token.get() as i64);
    let owns = tx
        .prepare_cached(
            "SELECT 1 FROM idem_records WHERE tenant = ?1 AND key = ?2 AND token = ?3 \
             AND status = 'in_flight'",
        )
        .and_then(|mut s| s.exists(params![tenant, key, token]))
        .map_err(err)?;
    if !owns {
        return Ok(fenced(0));
    }
    if first == 0 {
        tx.prepare_cached("DELETE FROM idem_chunks WHERE tenant = ?1 AND key = ?2 AND token <> ?3")
            .and_then(|mut s| s.execute(params![tenant, key, token]))
            .map_err(err)?;
    }
    let have: i64 = tx
        .prepare_cached(
            "SELECT coalesce(max(seq) + 1, 0) FROM idem_chunks \
             WHERE tenant = ?1 AND key = ?2 AND token = ?3",
        )
        .and_then(|mut s| s.query_row(params![tenant, key, token], |r| r.get(0)))
        .map_err(err)?;
    let have = have.max(0) as u64;
    let skip = match AppendAt::decide(have, first, chunks.len()) {
        AppendAt::Done => return Ok(fenced(1)),
        AppendAt::From(skip) => skip,
        AppendAt::Gap => return Err(out_of_order(BACKEND, first, have)),
    };
    let mut insert = tx
        .prepare_cached(
            "INSERT INTO idem_chunks (tenant, key, token, seq, data, blob) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(err)?;
    let mut keep = tx
        .prepare_cached(
            "INSERT INTO idem_blobs (tenant, hash, data) VALUES (?1, ?2, ?3) \
             ON CONFLICT DO NOTHING",
        )
        .map_err(err)?;
    let appended = (first + skip as u64..)
        .zip(&chunks[skip..])
        .zip(&blobs[skip..]);
    for ((seq, chunk), blob) in appended {
        let seq = seq as i64;
        match blob {
            None => insert.execute(params![tenant, key, token, seq, chunk, None::<&[u8]>]),
            Some(hash) => {
                let hash = &hash.as_bytes()[..];
                keep.execute(params![tenant, hash, chunk])
                    .and_then(|_| insert.execute(params![tenant, key, token, seq, &[][..], hash]))
            }
        }
        .map_err(err)?;
    }
    Ok(fenced(1))
}

/// The whole record of `key`, if there is one (`op` names the operation in errors).
pub(super) fn read_record(
    conn: &Connection,
    op: &str,
    tenant: &str,
    key: &IdempotencyKey,
) -> Result<Option<Record>, StoreError> {
    let err = |e| sql_error(op, e);
    let sql = format!("SELECT {RECORD_COLUMNS} FROM idem_records WHERE tenant = ?1 AND key = ?2");
    let mut stmt = conn.prepare_cached(&sql).map_err(err)?;
    let mut rows = stmt
        .query(params![tenant, &key.as_bytes()[..]])
        .map_err(err)?;
    match rows.next().map_err(err)? {
        Some(row) => decode_record(op, row).map(Some),
        None => Ok(None),
    }
}

/// The record of `key` and at most `limit` chunks of its current token's stream from `from`,
/// read in one transaction (one snapshot of the file).
pub(super) fn read_page(
    conn: &Connection,
    tenant: &str,
    key: &IdempotencyKey,
    from: u64,
    limit: usize,
) -> Result<Option<StreamPage>, StoreError> {
    let err = |e| sql_error("read_chunks", e);
    let tx = conn.unchecked_transaction().map_err(err)?;
    let Some(record) = read_record(&tx, "read_chunks", tenant, key)? else {
        return Ok(None);
    };
    let chunks = tx
        .prepare_cached(
            "SELECT CASE WHEN c.blob IS NULL THEN c.data ELSE (SELECT b.data FROM idem_blobs b \
             WHERE b.tenant = c.tenant AND b.hash = c.blob) END FROM idem_chunks c \
             WHERE c.tenant = ?1 AND c.key = ?2 AND c.token = ?3 AND c.seq >= ?4 \
             ORDER BY c.seq LIMIT ?5",
        )
        .and_then(|mut s| {
            s.query_map(
                params![
                    tenant,
                    &key.as_bytes()[..],
                    record.token.get() as i64,
                    i64::try_from(from).unwrap_or(i64::MAX),
                    limit.max(1) as i64
                ],
                |r| r.get::<_, Option<Vec<u8>>>(0),
            )?
            .collect::<Result<Vec<_>, _>>()
        })
        .map_err(err)?
        .into_iter()
        .map(|chunk| {
            chunk.ok_or_else(|| {
                StoreError::new(
                    BACKEND,
                    StoreErrorKind::Corrupt,
                    "read_chunks: a chunk names a blob that is not in idem_blobs",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    tx.finish().map_err(err)?;
    Ok(Some(StreamPage { record, chunks }))
}

/// A fenced write's answer from the number of rows it changed.
fn fenced(rows: usize) -> Reply {
    Reply::Fenced(if rows == 1 {
        Fenced::Applied
    } else {
        Fenced::Lost
    })
}

/// A row of [`RECORD_COLUMNS`].
pub(super) fn decode_record(op: &str, row: &rusqlite::Row<'_>) -> Result<Record, StoreError> {
    let get = |e| sql_error(op, e);
    let time =
        |i| -> Result<u64, StoreError> { Ok(row.get::<_, i64>(i).map_err(get)?.max(0) as u64) };
    Ok(Record {
        tenant: row.get(0).map_err(get)?,
        key: IdempotencyKey::from_bytes(bytes32(op, row.get(1).map_err(get)?)?),
        tool: row.get(2).map_err(get)?,
        fingerprint: Fingerprint::from_bytes(bytes32(op, row.get(3).map_err(get)?)?),
        status: status(op, &row.get::<_, String>(4).map_err(get)?)?,
        token: FencingToken::from_raw(row.get::<_, i64>(5).map_err(get)? as u64),
        lease_expires_at: time(6)?,
        created_at: time(7)?,
        expires_at: time(8)?,
        result: row.get(9).map_err(get)?,
        note: row.get(10).map_err(get)?,
    })
}
