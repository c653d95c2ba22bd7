//! The hand-written SQLite store of the baselines: the same table, index and durability as
//! idem's, no idem; its writes, one call at a time or 64 calls to a transaction.

use rusqlite::{Connection, params};

use super::{RawArgs, payment_json, raw_key};

/// Opens the store at `path` (WAL, `synchronous=FULL`) and creates its table.
pub fn connection(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
         CREATE TABLE IF NOT EXISTS raw (
            tenant TEXT NOT NULL, key BLOB NOT NULL, fingerprint BLOB NOT NULL,
            status TEXT NOT NULL, token INTEGER NOT NULL, lease_expires_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, result BLOB,
            PRIMARY KEY (tenant, key)) WITHOUT ROWID;
         CREATE INDEX IF NOT EXISTS raw_expires_at ON raw (expires_at);",
    )
    .expect("schema");
    conn
}

/// The claim of call `n`: INSERT `in_flight` with the arguments' fingerprint, under a key hashed
/// as a hand-written store would (random B-tree positions, like idem's).
fn claim(conn: &Connection, n: u64) {
    conn.prepare_cached(
        "INSERT INTO raw VALUES ('tenant-a', ?1, ?2, 'in_flight', ?3, 30000, 0, ?4, NULL)",
    )
    .expect("prepare")
    .execute(params![
        &raw_key("tenant-a", n)[..],
        &RawArgs::payment("run-1", n).fingerprint()[..],
        n as i64,
        86_400_000 + n as i64
    ])
    .expect("insert");
}

/// The completion of call `n`: UPDATE `completed` with the result, fenced by its token.
fn complete(conn: &Connection, n: u64) {
    conn.prepare_cached(
        "UPDATE raw SET status = 'completed', result = ?3, expires_at = ?5 \
         WHERE tenant = ?1 AND key = ?2 AND token = ?4",
    )
    .expect("prepare")
    .execute(params![
        "tenant-a",
        &raw_key("tenant-a", n)[..],
        payment_json(n),
        n as i64,
        86_400_000 + n as i64
    ])
    .expect("update");
}

/// A fresh call `n`: its claim, then its completion, each its own durable commit.
pub fn two_writes(conn: &Connection, n: u64) {
    claim(conn, n);
    complete(conn, n);
}

/// Calls a perfect group commit shares: the concurrent callers of [`group_commit`].
pub const GROUP: u64 = 64;

/// The ceiling of group commit: the claims of [`GROUP`] calls from `first` in one durable
/// transaction and their completions in another (two commits in each call's life), with no
/// waiting between them.
pub fn group_commit(conn: &Connection, first: u64) {
    conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
    for n in first..first + GROUP {
        claim(conn, n);
    }
    conn.execute_batch("COMMIT; BEGIN IMMEDIATE")
        .expect("commit");
    for n in first..first + GROUP {
        complete(conn, n);
    }
    conn.execute_batch("COMMIT").expect("commit");
}
