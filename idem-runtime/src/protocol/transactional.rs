//! The call of a transactional tool (`#[idempotent(…, transactional)]`): the same refusals,
//! replays and outcomes as every keyed tool, with the claim, the body's writes and the record in
//! one transaction of the store's database (the store's `transact`).
//!
//! | the body answers | under the policy | the transaction |
//! |---|---|---|
//! | a value | any | keeps the writes and records the value: `Fresh`, then `Replayed` |
//! | an error classed `Release` | `release`, `classify` | rolls back, the claim too: a corrected retry runs |
//! | an error classed `Store` | `store`, `classify` | rolls the writes back to the savepoint, records the error: replayed |
//! | an error classed `Unknown` | `classify` | rolls back, as `Release`: the writes are gone, so nothing is unknown |
//! | a value or error that cannot be encoded | any | rolls back: `ResultNotStored`, a retry runs |
//!
//! A concurrent call of the key waits for the first to commit, at most the tool's `wait`, then
//! replays (or runs, if the first rolled back); past the wait it answers `InFlight`.

use std::sync::Arc;
use std::time::Duration;

use super::call::{KeyParts, Prepared, prepare, replay};
use super::checked::CheckedRef;
use super::policy::ErrorHandling;
use super::record::{encode_value, too_large_record};
use super::retry_after;
use crate::registry::ToolInfo;
use crate::runtime::Idem;
use crate::value::{Checked, Replayable};
use idem_core::canonical::CanonicalError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::IdempotencyKey;
use idem_core::store::{Claim, ClaimRequest, Orphans, RecordStatus, UnixMillis};
use idem_core::{Error, ErrorClass, StoreError, StoreErrorKind};
use idem_core::{InFlight, Mismatch, Outcome, Unknown};
use idem_postgres::PostgresStore;
use idem_postgres::tokio_postgres::Transaction;
use idem_postgres::transaction::{Settlement, Transacted};

/// What became of the body's answer besides the transaction: kept whole, or too large to
/// replay, or impossible to encode.
enum Kept {
    Whole,
    TooLarge { size: usize, limit: usize },
    NotEncoded(serde_json::Error),
}

/// The body's answer, as the transaction settles it.
struct Answer<T, E> {
    result: Result<T, E>,
    class: Option<ErrorClass>,
    kept: Kept,
}

/// How the body's result settles the transaction under the policy `H`.
fn settlement<V, E, H>(result: Result<V, E>, limit: usize) -> (Settlement, Answer<V, E>)
where
    V: Replayable,
    E: ErrorHandling<H>,
{
    let (class, encoded, keep_writes) = match &result {
        Ok(v) => (None, Some(encode_value(&CheckedRef(v))), true),
        Err(e) => match ErrorHandling::<H>::class(e) {
            ErrorClass::Store => (Some(ErrorClass::Store), Some(e.encode()), false),
            // The writes roll back with the claim: nothing happened, so nothing is unknown.
            ErrorClass::Release | ErrorClass::Unknown => (Some(ErrorClass::Release), None, false),
        },
    };
    let answer = |kept| Answer {
        result,
        class,
        kept,
    };
    match encoded {
        None => (Settlement::RollBack, answer(Kept::Whole)),
        Some(Err(source)) => (Settlement::RollBack, answer(Kept::NotEncoded(source))),
        Some(Ok(bytes)) => {
            let (bytes, kept) = if bytes.len() > limit {
                (
                    too_large_record(bytes.len(), limit),
                    Kept::TooLarge {
                        size: bytes.len(),
                        limit,
                    },
                )
            } else {
                (bytes, Kept::Whole)
            };
            let status = RecordStatus::Completed;
            let settlement = if keep_writes {
                Settlement::Keep(status, bytes)
            } else {
                Settlement::RecordWithoutWrites(status, bytes)
            };
            (settlement, answer(kept))
        }
    }
}

/// The store a transactional tool needs, or the error that says so.
fn postgres<'a>(idem: &'a Idem, tool: &'static str) -> Result<&'a PostgresStore, StoreError> {
    idem.store().postgres().ok_or_else(|| {
        StoreError::new(
            idem.store().backend(),
            StoreErrorKind::Other,
            format!(
                "tool `{tool}` is transactional: its writes and its record commit in one \
                 transaction on the store's database, which needs the Postgres store \
                 (`postgres://…`); this runtime's store is `{}`",
                idem.store().backend()
            ),
        )
    })
}

/// A driver of transactional tools: the handle its tools take, and the Postgres store's
/// transaction on it.
pub(crate) trait Driver {
    /// What the tool's body gets.
    type Handle<'t>;

    /// The store's transaction for one call (see `PostgresStore::transact`).
    fn transact<X, R, B, S>(
        store: &PostgresStore,
        req: Option<ClaimRequest<'_>>,
        wait: Duration,
        savepoint: bool,
        body: B,
        settle: S,
    ) -> impl Future<Output = Result<Transacted<R>, StoreError>>
    where
        B: for<'a, 't> AsyncFnOnce(&'a mut Self::Handle<'t>) -> X,
        S: FnOnce(X) -> (Settlement, R);
}

/// tokio-postgres: the body gets the `Transaction`.
pub(crate) struct TokioPostgres;

impl Driver for TokioPostgres {
    type Handle<'t> = Transaction<'t>;

    fn transact<X, R, B, S>(
        store: &PostgresStore,
        req: Option<ClaimRequest<'_>>,
        wait: Duration,
        savepoint: bool,
        body: B,
        settle: S,
    ) -> impl Future<Output = Result<Transacted<R>, StoreError>>
    where
        B: for<'a, 't> AsyncFnOnce(&'a mut Transaction<'t>) -> X,
        S: FnOnce(X) -> (Settlement, R),
    {
        store.transact(req, wait, savepoint, body, settle)
    }
}

/// sqlx: the body gets the transaction's `PgConnection`, on the pool handed to the store.
#[cfg(feature = "sqlx")]
pub(crate) struct Sqlx;

#[cfg(feature = "sqlx")]
impl Driver for Sqlx {
    type Handle<'t> = sqlx::PgConnection;

    fn transact<X, R, B, S>(
        store: &PostgresStore,
        req: Option<ClaimRequest<'_>>,
        wait: Duration,
        savepoint: bool,
        body: B,
        settle: S,
    ) -> impl Future<Output = Result<Transacted<R>, StoreError>>
    where
        B: for<'a, 't> AsyncFnOnce(&'a mut sqlx::PgConnection) -> X,
        S: FnOnce(X) -> (Settlement, R),
    {
        store.transact_sqlx(req, wait, savepoint, body, settle)
    }
}

/// Runs a transactional tool on the driver `D`: `body` gets the transaction that also holds
/// the claim and the record.
pub(crate) async fn run<D, V, E, H, B>(
    tool: &'static ToolInfo,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    body: B,
) -> Result<Outcome<V>, Error<E>>
where
    V: Replayable,
    E: ErrorHandling<H>,
    D: Driver,
    B: for<'a, 't> AsyncFnOnce(&'a mut D::Handle<'t>) -> Result<V, E>,
{
    let name = tool.name;
    let (scope, key, fingerprint) = match prepare(tool, key, fingerprint)? {
        Prepared::Keyed {
            scope,
            key,
            fingerprint,
        } => (scope, key, fingerprint),
        Prepared::Unprotected => {
            let Some(scope) = crate::runtime::Scope::current() else {
                return Err(Error::NoRuntime { tool: name });
            };
            let store = postgres(scope.idem(), name)?;
            let limit = scope.idem().max_result_bytes();
            let settle = move |result| settlement::<V, E, H>(result, limit);
            let wait = tool.effective_wait(scope.idem().default_wait());
            let ran = D::transact(store, None, wait, E::MAY_STORE, body, settle).await?;
            return match ran {
                Transacted::Settled(answer) => {
                    let class = answer.class.unwrap_or(ErrorClass::Release);
                    answer
                        .result
                        .map(Outcome::Unprotected)
                        .map_err(|error| Error::Tool {
                            error,
                            replayed: false,
                            class,
                        })
                }
                Transacted::NotCommitted(_, source) => Err(Error::NotCommitted {
                    tool: name,
                    key: None,
                    source,
                }),
                Transacted::Answered(_) => unreachable!("no claim, no answer"),
            };
        }
    };
    crate::current::note_call(name, key);
    let (scope, idem) = (&scope, scope.idem());
    let observed = crate::telemetry::Observation::start(tool, scope.tenant(), key);
    let call = async move {
        let store = postgres(idem, name)?;
        let wait = tool.effective_wait(idem.default_wait());
        let now = idem.clock().now();
        let tenant = scope.shared_tenant();
        let request = ClaimRequest {
            tenant: &tenant,
            key,
            tool: name,
            fingerprint,
            now,
            lease: tool.effective_lease(idem),
            ttl: tool.effective_ttl(idem),
            orphans: Orphans::TakeOver,
        };
        let limit = idem.max_result_bytes();
        let settle = move |result| settlement::<V, E, H>(result, limit);
        // The whole transaction runs as the call: the body sees `current()`.
        let transaction = D::transact(store, Some(request), wait, E::MAY_STORE, body, settle);
        let ran = crate::current::run_as(name, key, Arc::default(), transaction).await?;
        answer::<V, E, H>(name, key, now, request.lease, ran)
    };
    let result = observed.within(call).await;
    observed.finish(&result);
    result
}

/// The outcome of a transactional call, from how its transaction ended.
fn answer<V, E, H>(
    name: &'static str,
    key: IdempotencyKey,
    now: UnixMillis,
    lease: Duration,
    ran: Transacted<Answer<V, E>>,
) -> Result<Outcome<V>, Error<E>>
where
    V: Replayable,
    E: ErrorHandling<H>,
{
    let hash = key.short_hash();
    let answer = match ran {
        Transacted::Answered(Claim::Completed { result }) => {
            let replayed = replay::<Checked<V>, E, H>(name, key, &result);
            return replayed.map(|outcome| outcome.map(|checked| checked.0));
        }
        Transacted::Answered(Claim::Mismatch) => {
            return Ok(Outcome::Mismatch(Mismatch::new(name, hash)));
        }
        Transacted::Answered(Claim::InFlight { lease_expires_at }) => {
            // Past the wait for another transaction (`now` + the wait), or a record left
            // `in_flight` by a non-transactional version of the tool.
            let wait = retry_after(lease_expires_at, now, lease);
            return Ok(Outcome::InFlight(InFlight::new(name, hash, wait)));
        }
        Transacted::Answered(Claim::Unknown) => {
            return Ok(Outcome::Unknown(Unknown::new(name, hash)));
        }
        Transacted::Answered(Claim::Acquired { .. }) => {
            unreachable!("an acquired claim runs the body")
        }
        Transacted::NotCommitted(_, source) => {
            return Err(Error::NotCommitted {
                tool: name,
                key: Some(hash),
                source,
            });
        }
        Transacted::Settled(answer) => answer,
    };
    match answer.kept {
        Kept::NotEncoded(source) => {
            return Err(Error::ResultNotStored {
                tool: name,
                key: hash,
                source,
            });
        }
        Kept::TooLarge { size, limit } => {
            return Err(Error::ResultTooLarge {
                tool: name,
                key: hash,
                size,
                limit,
                replayed: false,
            });
        }
        Kept::Whole => {}
    }
    match answer.result {
        Ok(v) => Ok(Outcome::Fresh(v)),
        Err(error) => Err(Error::Tool {
            error,
            replayed: false,
            class: answer.class.unwrap_or(ErrorClass::Release),
        }),
    }
}
