//! The schema: created on open under an advisory lock (workers starting together do not race),
//! versioned in `idem_meta`, upgraded in place; a newer one is refused untouched.

use tokio_postgres::types::Type;

use super::driver::{BACKEND, pg_error};
use super::store::PostgresStore;
use idem_core::{StoreError, StoreErrorKind};

/// The schema version this build writes (2 added the `unknown` status, the orphan policy of
/// `idem_claim` and the operator's `note`; 3 the chunks of streams; 4 the blobs of large
/// results; 5 lets chunks name blobs; older schemas are upgraded on open).
pub const SCHEMA_VERSION: u32 = 5;

/// A constant for `pg_advisory_xact_lock`, so migrations of one database run one at a time.
pub(super) const MIGRATION_LOCK: i64 = 0x6964_656d_0001; // "idem" + 1

/// The schema, version 5. `{s}` is the quoted schema name.
pub(super) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS {s}.idem_records (
    tenant           text     NOT NULL,
    key              bytea    NOT NULL,
    tool             text     NOT NULL,
    fingerprint      bytea    NOT NULL,
    status           text     NOT NULL,
    token            bigint   NOT NULL,
    lease_expires_at bigint   NOT NULL,
    created_at       bigint   NOT NULL,
    expires_at       bigint   NOT NULL,
    result           bytea,
    note             text,
    PRIMARY KEY (tenant, key)
);
-- Looked up before altering: `ALTER TABLE` and `CREATE INDEX` lock the table even when there
-- is nothing to do (`IF [NOT] EXISTS` is checked under the lock), and a lock that waits for a
-- transactional tool's transaction holds every claim queued behind it.
--
-- The CHECK constraints of tables earlier builds made (the key's and the fingerprint's length,
-- the status, under the names Postgres gave them) are dropped: Postgres parses a table's CHECK
-- expressions from their stored text again at every INSERT and UPDATE (`ExecRelCheck`, per
-- statement), about 25 us of the 370 us of server CPU a fresh call cost on a 2-vCPU machine
-- (perf: `pg_strtok`, `nodeRead`), and fresh calls went from 0.82-0.83x the raw writes with
-- them to 0.87-0.91x without (alternated, one session). idem binds only keys and fingerprints
-- of 32 bytes and its three statuses; a row edited by hand into another shape is refused as
-- corrupt where it is read in full, and never taken over (a takeover asks for `in_flight`).
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{s}.idem_records'::regclass
                   AND attname = 'note' AND NOT attisdropped) THEN
        ALTER TABLE {s}.idem_records ADD COLUMN note text;
    END IF;
    IF to_regclass('{s}.idem_records_expires_at') IS NULL THEN
        CREATE INDEX idem_records_expires_at ON {s}.idem_records (expires_at);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '{s}.idem_records'::regclass
               AND conname IN ('idem_records_key_check', 'idem_records_fingerprint_check',
                               'idem_records_status_check')) THEN
        ALTER TABLE {s}.idem_records DROP CONSTRAINT IF EXISTS idem_records_key_check,
            DROP CONSTRAINT IF EXISTS idem_records_fingerprint_check,
            DROP CONSTRAINT IF EXISTS idem_records_status_check;
    END IF;
    -- The chunks of streams, each under the token of the claim that wrote it; deleting a
    -- record (release, purge, an operator) deletes its chunks.
    IF to_regclass('{s}.idem_chunks') IS NULL THEN
        CREATE TABLE {s}.idem_chunks (
            tenant text   NOT NULL,
            key    bytea  NOT NULL,
            token  bigint NOT NULL,
            seq    bigint NOT NULL,
            data   bytea  NOT NULL,
            PRIMARY KEY (tenant, key, token, seq),
            FOREIGN KEY (tenant, key) REFERENCES {s}.idem_records (tenant, key) ON DELETE CASCADE
        );
    END IF;
    -- Completed results past the threshold, once per tenant and SHA-256, with how many records
    -- name each (`blob`): the completion that names one counts it (its row locked until the
    -- completion commits), and the triggers below let go of it when a record that names it is
    -- deleted or names another, in the same transaction.
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{s}.idem_records'::regclass
                   AND attname = 'blob' AND NOT attisdropped) THEN
        ALTER TABLE {s}.idem_records ADD COLUMN blob bytea;
    END IF;
    IF to_regclass('{s}.idem_blobs') IS NULL THEN
        CREATE TABLE {s}.idem_blobs (
            tenant text   NOT NULL,
            hash   bytea  NOT NULL,
            refs   bigint NOT NULL,
            data   bytea  NOT NULL,
            PRIMARY KEY (tenant, hash)
        );
    END IF;
    -- A chunk past the threshold names a blob too (`blob`, its `data` empty), counted in by
    -- the append that writes it and let go of when the chunk is deleted (with its record, or
    -- by a new holder's first append).
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{s}.idem_chunks'::regclass
                   AND attname = 'blob' AND NOT attisdropped) THEN
        ALTER TABLE {s}.idem_chunks ADD COLUMN blob bytea;
    END IF;
END
$do$;

CREATE OR REPLACE FUNCTION {s}.idem_let_go_of_blob() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE {s}.idem_blobs SET refs = refs - 1 WHERE tenant = OLD.tenant AND hash = OLD.blob;
    DELETE FROM {s}.idem_blobs WHERE tenant = OLD.tenant AND hash = OLD.blob AND refs <= 0;
    RETURN NULL;
END
$fn$;

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '{s}.idem_records'::regclass
                   AND tgname = 'idem_records_drop_blob') THEN
        CREATE TRIGGER idem_records_drop_blob AFTER DELETE ON {s}.idem_records
            FOR EACH ROW WHEN (OLD.blob IS NOT NULL) EXECUTE FUNCTION {s}.idem_let_go_of_blob();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '{s}.idem_records'::regclass
                   AND tgname = 'idem_records_move_blob') THEN
        CREATE TRIGGER idem_records_move_blob AFTER UPDATE OF blob ON {s}.idem_records
            FOR EACH ROW WHEN (OLD.blob IS NOT NULL AND OLD.blob IS DISTINCT FROM NEW.blob)
            EXECUTE FUNCTION {s}.idem_let_go_of_blob();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '{s}.idem_chunks'::regclass
                   AND tgname = 'idem_chunks_drop_blob') THEN
        CREATE TRIGGER idem_chunks_drop_blob AFTER DELETE ON {s}.idem_chunks
            FOR EACH ROW WHEN (OLD.blob IS NOT NULL) EXECUTE FUNCTION {s}.idem_let_go_of_blob();
    END IF;
END
$do$;

-- The claim: the decision table of store::decide (idem-runtime) in one call. Orphans (p_orphans): 0 take over, 1 reconcile (take over
-- lapsed and unknown records for the caller's state check), 2 block (mark lapsed records
-- unknown). Decisions: 0 acquired, 1 acquired by takeover, 2 mismatch, 3 completed (replay),
-- 4 in flight, 5 unknown.
CREATE OR REPLACE FUNCTION {s}.idem_claim(
    p_tenant text, p_key bytea, p_tool text, p_fingerprint bytea, p_token bigint,
    p_now bigint, p_lease bigint, p_ttl bigint, p_orphans smallint,
    OUT decision smallint, OUT token bigint, OUT lease_expires_at bigint,
    OUT expires_at bigint, OUT result bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    held {s}.idem_records%ROWTYPE;
    held_blob bytea;
BEGIN
    FOR attempt IN 1..16 LOOP
        -- A plain read first: replays, mismatches and in-flight answers take no lock.
        SELECT * INTO held FROM {s}.idem_records r
        WHERE r.tenant = p_tenant AND r.key = p_key;
        IF NOT FOUND THEN
            INSERT INTO {s}.idem_records AS r (tenant, key, tool, fingerprint, status, token,
                lease_expires_at, created_at, expires_at, result)
            VALUES (p_tenant, p_key, p_tool, p_fingerprint, 'in_flight', p_token,
                p_now + p_lease, p_now, p_now + p_ttl, NULL)
            ON CONFLICT (tenant, key) DO NOTHING;
            IF FOUND THEN
                decision := 0; token := p_token; RETURN;
            END IF;
        ELSIF held.expires_at <= p_now THEN
            UPDATE {s}.idem_records r SET tool = p_tool, fingerprint = p_fingerprint,
                status = 'in_flight', token = p_token, lease_expires_at = p_now + p_lease,
                created_at = p_now, expires_at = p_now + p_ttl, result = NULL, blob = NULL
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.expires_at <= p_now;
            IF FOUND THEN
                decision := 0; token := p_token; RETURN;
            END IF;
        ELSIF held.fingerprint <> p_fingerprint THEN
            decision := 2; RETURN;
        ELSIF held.status = 'completed' THEN
            IF held.blob IS NOT NULL THEN
                -- Its bytes are the hash's, whoever names it now; a blob gone since the read
                -- went with the record's last change: decide again.
                SELECT b.data INTO held_blob FROM {s}.idem_blobs b
                WHERE b.tenant = p_tenant AND b.hash = held.blob;
                CONTINUE WHEN NOT FOUND;
            END IF;
            decision := 3; expires_at := held.expires_at;
            result := coalesce(held.result, held_blob); RETURN;
        ELSIF held.token = p_token THEN
            -- This very claim, sent again after a lost answer: it is ours. It created the
            -- record (created now) or took an older one over.
            decision := CASE WHEN held.created_at = p_now THEN 0 ELSE 1 END;
            token := p_token; RETURN;
        ELSIF held.status = 'unknown' THEN
            IF p_orphans <> 1 THEN
                decision := 5; RETURN;
            END IF;
            UPDATE {s}.idem_records r SET status = 'in_flight', token = p_token,
                lease_expires_at = p_now + p_lease, result = NULL
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.status = 'unknown'
              AND r.fingerprint = p_fingerprint AND r.expires_at > p_now;
            IF FOUND THEN
                decision := 1; token := p_token; RETURN;
            END IF;
        ELSIF held.lease_expires_at > p_now THEN
            decision := 4; lease_expires_at := held.lease_expires_at; RETURN;
        ELSIF p_orphans = 2 THEN
            UPDATE {s}.idem_records r SET status = 'unknown'
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.status = 'in_flight'
              AND r.token = held.token AND r.lease_expires_at <= p_now
              AND r.expires_at > p_now;
            IF FOUND THEN
                decision := 5; RETURN;
            END IF;
        ELSE
            UPDATE {s}.idem_records r SET token = p_token, lease_expires_at = p_now + p_lease
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.status = 'in_flight'
              AND r.fingerprint = p_fingerprint AND r.lease_expires_at <= p_now
              AND r.expires_at > p_now;
            IF FOUND THEN
                decision := 1; token := p_token; RETURN;
            END IF;
        END IF;
        -- Another claim changed the record between the read and the write: decide again.
    END LOOP;
    RAISE EXCEPTION 'idem_claim: the record kept changing under the claim'
        USING ERRCODE = '40001';
END
$fn$;
"#;

/// Version 1 to 2, before [`SCHEMA`] runs: the claim function of version 1 (one argument
/// fewer) goes. (Its status constraint, which refused `unknown`, goes with the others: see
/// [`SCHEMA`].)
pub(super) const UPGRADE_1_TO_2: &str = r#"
DROP FUNCTION IF EXISTS {s}.idem_claim(text, bytea, text, bytea, bigint, bigint, bigint, bigint);
"#;

impl PostgresStore {
    /// Creates the schema, or checks that the one found is this build's.
    pub(super) async fn migrate(&self, schema: &str) -> Result<(), StoreError> {
        const OP: &str = "opening the store";
        let mut client = self.client(OP).await?;
        let tx = client.transaction().await.map_err(|e| pg_error(OP, e))?;
        // Unnamed statements only (`query_typed`, `batch_execute`): a transaction pooler cannot
        // route a named one, and a migration gains nothing from preparing.
        tx.query_typed(
            "SELECT pg_advisory_xact_lock($1)",
            &[(&MIGRATION_LOCK, Type::INT8)],
        )
        .await
        .map_err(|e| pg_error(OP, e))?;
        let quoted = format!("\"{schema}\"");
        // A schema that exists is used as it is: creating one needs a privilege on the database
        // that a user given its own schema need not have.
        let missing = tx
            .query_typed(
                "SELECT 1 FROM pg_namespace WHERE nspname = $1",
                &[(&schema, Type::NAME)],
            )
            .await
            .map_err(|e| pg_error(OP, e))?
            .is_empty();
        if missing {
            tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {quoted}"))
                .await
                .map_err(|e| pg_error(OP, e))?;
        }
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {quoted}.idem_meta (name text PRIMARY KEY, value integer NOT NULL);"
        ))
        .await
        .map_err(|e| pg_error(OP, e))?;
        let found: Option<i32> = tx
            .query_typed(&self.inner.sql.version.sql, &[])
            .await
            .map_err(|e| pg_error(OP, e))?
            .first()
            .map(|row| row.get(0));
        match found {
            Some(v) if v > SCHEMA_VERSION as i32 => {
                return Err(StoreError::new(
                    BACKEND,
                    StoreErrorKind::Schema,
                    format!(
                        "the schema `{schema}` was written by a newer idem (schema version {v}); \
                         this build understands up to {SCHEMA_VERSION}: upgrade idem, or point \
                         `?schema=` elsewhere"
                    ),
                ));
            }
            found => {
                if found == Some(1) {
                    tx.batch_execute(&UPGRADE_1_TO_2.replace("{s}", &quoted))
                        .await
                        .map_err(|e| pg_error(OP, e))?;
                }
                // (Re)create what is missing, idempotently.
                tx.batch_execute(&SCHEMA.replace("{s}", &quoted))
                    .await
                    .map_err(|e| pg_error(OP, e))?;
                tx.query_typed(
                    &format!(
                        "INSERT INTO {quoted}.idem_meta (name, value) VALUES ('schema_version', $1) \
                         ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"
                    ),
                    &[(&(SCHEMA_VERSION as i32), Type::INT4)],
                )
                .await
                .map_err(|e| pg_error(OP, e))?;
            }
        }
        tx.commit().await.map_err(|e| pg_error(OP, e))
    }
}
