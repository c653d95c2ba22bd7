//! The schema, created and versioned on open (a newer one is refused untouched), and the
//! connection settings (WAL, busy timeout, durability).

use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension};

use super::driver::{BACKEND, sql_error};
use super::options::{SqliteOptions, Synchronous};
use idem_core::{StoreError, StoreErrorKind};

/// The schema version this build writes (2 added the `unknown` status and the operator's
/// `note`; 3 spells the status check as comparisons, for an `IN` list made SQLite build a
/// temporary b-tree at every insert and update of a record; 4 added the chunks of streams; 5 the
/// blobs of large results; 6 lets chunks name blobs; files of versions 1 to 5 are upgraded on
/// open).
pub const SCHEMA_VERSION: u32 = 6;

/// The body of the blob triggers: deletes the blob `old` named when no record and no chunk of
/// its tenant names it any more.
macro_rules! let_go_of_blob {
    () => {
        "BEGIN
    DELETE FROM idem_blobs WHERE tenant = old.tenant AND hash = old.blob
        AND NOT EXISTS (SELECT 1 FROM idem_records WHERE tenant = old.tenant AND blob = old.blob)
        AND NOT EXISTS (SELECT 1 FROM idem_chunks WHERE tenant = old.tenant AND blob = old.blob);
END;
"
    };
}

pub(super) const SCHEMA: &str = concat!(
    "
CREATE TABLE IF NOT EXISTS idem_meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idem_records (
    tenant           TEXT    NOT NULL,
    key              BLOB    NOT NULL,
    tool             TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    status           TEXT    NOT NULL
                     CHECK (status = 'in_flight' OR status = 'completed' OR status = 'unknown'),
    token            INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    result           BLOB,
    note             TEXT,
    blob             BLOB,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);
-- A rowid table: its rows (a chunk each, often kilobytes) stay out of the index's pages, where
-- a WITHOUT ROWID table would put them (twice as slow to append and to read, 1 KiB chunks).
-- A chunk past the threshold names a blob (`blob`, its `data` empty).
CREATE TABLE IF NOT EXISTS idem_chunks (
    tenant TEXT    NOT NULL,
    key    BLOB    NOT NULL,
    token  INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    data   BLOB    NOT NULL,
    blob   BLOB,
    PRIMARY KEY (tenant, key, token, seq)
);
CREATE TRIGGER IF NOT EXISTS idem_records_drop_chunks AFTER DELETE ON idem_records
BEGIN
    DELETE FROM idem_chunks WHERE tenant = old.tenant AND key = old.key;
END;
-- Completed results and chunks past the threshold, once per tenant and SHA-256 (`blob`, in the
-- records and chunks that name one): the completion or append that names a blob writes it if it
-- is new, and these triggers delete it, in the transaction that deletes a record or a chunk or
-- makes a record name another, when no record and no chunk names it any more. No count to
-- keep: SQLite rewrites a whole row, overflow pages and all, to change one column of it, so
-- counting references in the blob's row would write the blob again at every completion that
-- names it.
CREATE TABLE IF NOT EXISTS idem_blobs (
    tenant TEXT NOT NULL,
    hash   BLOB NOT NULL,
    data   BLOB NOT NULL,
    PRIMARY KEY (tenant, hash)
);
CREATE INDEX IF NOT EXISTS idem_records_blob ON idem_records (tenant, blob)
WHERE blob IS NOT NULL;
CREATE INDEX IF NOT EXISTS idem_chunks_blob ON idem_chunks (tenant, blob)
WHERE blob IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS idem_records_drop_blob AFTER DELETE ON idem_records
WHEN old.blob IS NOT NULL
",
    let_go_of_blob!(),
    "CREATE TRIGGER IF NOT EXISTS idem_records_move_blob AFTER UPDATE OF blob ON idem_records
WHEN old.blob IS NOT NULL AND old.blob IS NOT new.blob
",
    let_go_of_blob!(),
    "CREATE TRIGGER IF NOT EXISTS idem_chunks_drop_blob AFTER DELETE ON idem_chunks
WHEN old.blob IS NOT NULL
",
    let_go_of_blob!()
);

/// Upgrades a file of version 1 or 2: SQLite cannot change a CHECK constraint in place, so the
/// records move to a table with the new one (inside the schema transaction: all or nothing).
/// Version 1 had no `note`.
fn upgrade(tx: &rusqlite::Transaction<'_>, from: i64) -> Result<(), StoreError> {
    let columns = "tenant, key, tool, fingerprint, status, token, lease_expires_at, created_at, \
         expires_at, result";
    let note = if from >= 2 { ", note" } else { "" };
    let steps = [
        "ALTER TABLE idem_records RENAME TO idem_records_old;
         DROP INDEX IF EXISTS idem_records_expires_at;"
            .to_owned(),
        SCHEMA.to_owned(),
        format!(
            "INSERT INTO idem_records ({columns}{note}) SELECT {columns}{note} FROM idem_records_old;
             DROP TABLE idem_records_old;
             UPDATE idem_meta SET value = {SCHEMA_VERSION} WHERE name = 'schema_version';"
        ),
    ];
    for step in steps {
        tx.execute_batch(&step)
            .map_err(|e| sql_error(&format!("upgrading the schema from version {from}"), e))?;
    }
    Ok(())
}

pub(super) fn open_connection(options: &SqliteOptions) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        &options.path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|e| {
        StoreError::with_source(
            BACKEND,
            StoreErrorKind::Unavailable,
            format!("cannot open `{}`", options.path.display()),
            e,
        )
    })?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| sql_error("setting busy_timeout", e))?;
    let sync = match options.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.execute_batch(&format!("PRAGMA synchronous = {sync};"))
        .map_err(|e| sql_error("setting synchronous", e))?;
    Ok(conn)
}

/// Switches the file to WAL. Several processes opening a new file at once race for that switch,
/// and SQLite answers `SQLITE_BUSY` at once (without its busy handler) to the losers: they retry
/// until the busy timeout, and find WAL already on.
pub(super) fn enable_wal(conn: &Connection, busy_timeout: Duration) -> Result<String, StoreError> {
    let deadline = std::time::Instant::now() + busy_timeout;
    loop {
        let attempt = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
            .and_then(|mode| {
                if mode.eq_ignore_ascii_case("wal") {
                    Ok(mode)
                } else {
                    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                }
            });
        match attempt {
            Ok(mode) => return Ok(mode),
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(sql_error("enabling WAL", e)),
        }
    }
}

/// Creates the schema, or checks the one found, inside the write lock.
pub(super) fn migrate(conn: &mut Connection, busy_timeout: Duration) -> Result<(), StoreError> {
    let mode = enable_wal(conn, busy_timeout)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::new(
            BACKEND,
            StoreErrorKind::Unavailable,
            format!("the file refused WAL mode (journal_mode is `{mode}`)"),
        ));
    }
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| sql_error("locking the schema", e))?;
    let has_meta: bool = tx
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
        .map_err(|e| sql_error("reading the schema", e))?;
    let found: Option<i64> = if has_meta {
        tx.query_row(
            "SELECT value FROM idem_meta WHERE name = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| sql_error("reading the schema version", e))?
    } else {
        None
    };
    match found {
        None => {
            tx.execute_batch(SCHEMA)
                .map_err(|e| sql_error("creating the schema", e))?;
            tx.execute(
                "INSERT INTO idem_meta (name, value) VALUES ('schema_version', ?1)",
                [SCHEMA_VERSION],
            )
            .map_err(|e| sql_error("recording the schema version", e))?;
        }
        Some(v) if v == i64::from(SCHEMA_VERSION) => {}
        Some(v @ (1 | 2)) => upgrade(&tx, v)?,
        // What a version lacks, then the schema's new tables, indexes and triggers: the chunks'
        // table (4), the blobs' and the records' blob column (5), the chunks' blob column and
        // the blob triggers that look at chunks too (6).
        Some(v @ 3..=5) => {
            let records = if v < 5 {
                "ALTER TABLE idem_records ADD COLUMN blob BLOB;"
            } else {
                ""
            };
            let chunks = if v >= 4 {
                "ALTER TABLE idem_chunks ADD COLUMN blob BLOB;"
            } else {
                ""
            };
            let triggers = if v == 5 {
                "DROP TRIGGER idem_records_drop_blob; DROP TRIGGER idem_records_move_blob;"
            } else {
                ""
            };
            tx.execute_batch(&format!(
                "{records} {chunks} {triggers} {SCHEMA} UPDATE idem_meta SET value = \
                 {SCHEMA_VERSION} WHERE name = 'schema_version';"
            ))
            .map_err(|e| sql_error(&format!("upgrading the schema from version {v}"), e))?
        }
        Some(v) if v > i64::from(SCHEMA_VERSION) => {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Schema,
                format!(
                    "the file has schema version {v}, newer than this build's {SCHEMA_VERSION}; \
                     upgrade idem instead of writing to it"
                ),
            ));
        }
        Some(v) => {
            return Err(StoreError::new(
                BACKEND,
                StoreErrorKind::Schema,
                format!("the file has unknown schema version {v}"),
            ));
        }
    }
    tx.commit()
        .map_err(|e| sql_error("committing the schema", e))
}

#[cfg(test)]
mod tests {
    use rusqlite::params;

    use super::*;
    use crate::SqliteStore;
    use idem_core::store::{RecordStatus, Store};

    #[test]
    fn a_newer_schema_is_refused_not_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("newer.db");
        drop(SqliteStore::open_path(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE idem_meta SET value = 99 WHERE name = 'schema_version'",
            [],
        )
        .unwrap();
        drop(conn);
        let err = SqliteStore::open_path(&path).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Schema);
        assert!(err.to_string().contains("schema version 99"), "{err}");
        let conn = Connection::open(&path).unwrap();
        let v: i64 = conn
            .query_row(
                "SELECT value FROM idem_meta WHERE name = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(v, 99, "the file is left as it was");
    }

    /// A file as an older version wrote it: the status check as an `IN` list of `statuses`,
    /// with the `extra` columns, no records.
    fn old_file(path: &std::path::Path, version: u32, statuses: &str, extra: &str) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE idem_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
             CREATE TABLE idem_records (
                 tenant TEXT NOT NULL, key BLOB NOT NULL, tool TEXT NOT NULL,
                 fingerprint BLOB NOT NULL,
                 status TEXT NOT NULL CHECK (status IN ({statuses})),
                 token INTEGER NOT NULL, lease_expires_at INTEGER NOT NULL,
                 created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, result BLOB, {extra}
                 PRIMARY KEY (tenant, key)) WITHOUT ROWID;
             CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
             INSERT INTO idem_meta VALUES ('schema_version', {version});"
        ))
        .unwrap();
        conn
    }

    #[tokio::test]
    async fn a_version_1_file_is_upgraded_with_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        let conn = old_file(&path, 1, "'in_flight', 'completed'", "");
        let key =
            idem_core::key::derive_key("t", "tool", &[idem_core::key::KeyPart::new(&1).unwrap()]);
        conn.execute(
            "INSERT INTO idem_records VALUES ('t', ?1, 'tool', ?2, 'completed', 5, 0, 1, ?3, ?4)",
            params![&key.as_bytes()[..], &[7u8; 32][..], i64::MAX, &b"kept"[..]],
        )
        .unwrap();
        drop(conn);

        let store = SqliteStore::open_path(&path).unwrap();
        let health = store.health().await.unwrap();
        assert_eq!(health.schema_version, SCHEMA_VERSION);
        let record = store.lookup("t", key).await.unwrap().expect("kept");
        assert_eq!(record.result.as_deref(), Some(&b"kept"[..]));
        assert_eq!(record.status, RecordStatus::Completed);
        // The new status is accepted now.
        let conn = Connection::open(&path).unwrap();
        conn.execute("UPDATE idem_records SET status = 'unknown'", [])
            .unwrap();
        let indexes: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' \
                 AND name = 'idem_records_expires_at' AND tbl_name = 'idem_records'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(indexes, 1, "the expiry index is on the new table");
    }

    #[tokio::test]
    async fn a_version_2_file_is_upgraded_with_its_records_and_notes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v2.db");
        let conn = old_file(
            &path,
            2,
            "'in_flight', 'completed', 'unknown'",
            "note TEXT,",
        );
        let key =
            idem_core::key::derive_key("t", "tool", &[idem_core::key::KeyPart::new(&2).unwrap()]);
        conn.execute(
            "INSERT INTO idem_records VALUES ('t', ?1, 'tool', ?2, 'completed', 5, 0, 1, ?3, ?4, \
             'resolved by hand')",
            params![&key.as_bytes()[..], &[7u8; 32][..], i64::MAX, &b"kept"[..]],
        )
        .unwrap();
        drop(conn);

        let store = SqliteStore::open_path(&path).unwrap();
        assert_eq!(store.health().await.unwrap().schema_version, SCHEMA_VERSION);
        let record = store.lookup("t", key).await.unwrap().expect("kept");
        assert_eq!(record.result.as_deref(), Some(&b"kept"[..]));
        assert_eq!(record.note.as_deref(), Some("resolved by hand"));
        let conn = Connection::open(&path).unwrap();
        let err = conn
            .execute("UPDATE idem_records SET status = 'done'", [])
            .unwrap_err();
        assert!(err.to_string().contains("CHECK"), "{err}");
    }

    /// A file of version 3, 4 or 5, made by this build and taken back: chunks without blobs,
    /// and the blob triggers of 5 (for 4, no blobs; for 3, no chunks either).
    fn older_file(path: &std::path::Path, version: u32) {
        drop(SqliteStore::open_path(path).unwrap());
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "DROP TRIGGER idem_records_drop_blob; DROP TRIGGER idem_records_move_blob;
             DROP TRIGGER idem_chunks_drop_blob; DROP INDEX idem_chunks_blob;
             ALTER TABLE idem_chunks DROP COLUMN blob;",
        )
        .unwrap();
        let older = match version {
            5 => {
                "CREATE TRIGGER idem_records_drop_blob AFTER DELETE ON idem_records
                 WHEN old.blob IS NOT NULL BEGIN
                     DELETE FROM idem_blobs WHERE tenant = old.tenant AND hash = old.blob AND NOT
                     EXISTS (SELECT 1 FROM idem_records WHERE tenant = old.tenant AND blob = old.blob);
                 END;
                 CREATE TRIGGER idem_records_move_blob AFTER UPDATE OF blob ON idem_records
                 WHEN old.blob IS NOT NULL AND old.blob IS NOT new.blob BEGIN
                     DELETE FROM idem_blobs WHERE tenant = old.tenant AND hash = old.blob AND NOT
                     EXISTS (SELECT 1 FROM idem_records WHERE tenant = old.tenant AND blob = old.blob);
                 END;"
            }
            4 => {
                "DROP INDEX idem_records_blob; DROP TABLE idem_blobs;
                 ALTER TABLE idem_records DROP COLUMN blob;"
            }
            _ => {
                "DROP INDEX idem_records_blob; DROP TABLE idem_blobs;
                 ALTER TABLE idem_records DROP COLUMN blob;
                 DROP TRIGGER idem_records_drop_chunks; DROP TABLE idem_chunks;"
            }
        };
        conn.execute_batch(&format!(
            "{older} UPDATE idem_meta SET value = {version} WHERE name = 'schema_version';"
        ))
        .unwrap();
    }

    #[tokio::test]
    async fn versions_3_to_5_are_upgraded_with_the_chunks_and_the_blobs() {
        for version in [3, 4, 5] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("old.db");
            older_file(&path, version);
            let store = SqliteStore::open_path(&path).unwrap();
            assert_eq!(store.health().await.unwrap().schema_version, SCHEMA_VERSION);
            let conn = Connection::open(&path).unwrap();
            let made: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE name IN ('idem_chunks', \
                     'idem_records_drop_chunks', 'idem_blobs', 'idem_records_blob', \
                     'idem_records_drop_blob', 'idem_records_move_blob', 'idem_chunks_blob', \
                     'idem_chunks_drop_blob')",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(
                made, 8,
                "version {version}: the tables, the indexes, the triggers"
            );
            conn.execute("UPDATE idem_records SET blob = NULL", [])
                .expect("the records have the blob's column");
            conn.execute("UPDATE idem_chunks SET blob = NULL", [])
                .expect("the chunks have the blob's column");
            let triggers: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' \
                     AND name LIKE 'idem_records_%_blob' AND sql LIKE '%idem_chunks%'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(
                triggers, 2,
                "version {version}: the records' triggers see chunks"
            );
        }
    }

    /// The status check is evaluated at every write of a record: spelled as an `IN` list, it
    /// made SQLite build a temporary b-tree each time (a third of a fresh call's instructions).
    #[test]
    fn writing_a_record_builds_no_temporary_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.db");
        drop(SqliteStore::open_path(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        for sql in [
            "INSERT OR REPLACE INTO idem_records (tenant, key, tool, fingerprint, status, token, \
             lease_expires_at, created_at, expires_at) VALUES ('t', x'00', 'tool', x'00', \
             'in_flight', 1, 0, 0, 0)",
            "UPDATE idem_records SET status = 'completed', result = x'00', expires_at = 1 \
             WHERE tenant = 't' AND key = x'00' AND token = 1 AND status = 'in_flight'",
        ] {
            let mut plan = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
            let opcodes: Vec<String> = plan
                .query_map([], |r| r.get::<_, String>(1))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                !opcodes.iter().any(|op| op == "OpenEphemeral"),
                "{sql}: {opcodes:?}"
            );
        }
    }

    #[test]
    fn a_missing_directory_is_a_clear_error() {
        let err = SqliteStore::open_path("/nonexistent-idem-dir/x.db").unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable);
        assert!(
            err.to_string().contains("directory does not exist"),
            "{err}"
        );
    }
}
