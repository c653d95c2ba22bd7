//! Transactional tools: exactly once, not at most once, for effects in the store's own database.
//!
//! A tool declared `transactional` takes a transaction on the database of the Postgres store as
//! its first parameter; callers do not pass it. The type it takes names the driver:
//! `&mut tokio_postgres::Transaction<'_>` (feature `postgres`, idem's own pool; re-exported as
//! `idem::store::postgres::tokio_postgres`), or `&mut sqlx::PgConnection` (feature `sqlx`, sqlx
//! 0.8, on the pool you hand the store with
//! [`PostgresStore::use_sqlx`](idem_postgres::PostgresStore::use_sqlx); write
//! `.execute(&mut *tx)` as in any sqlx transaction). The claim of its key, the tool's own writes and
//! its recorded result commit in that one transaction (the "atomic phase" of Stripe's published
//! design): a crash, a cancellation or an error at any point leaves all of it or none of it, and
//! the retry replays or simply runs again.
//!
//! The tool, as the facade's `#[idempotent]` takes it (the attribute is the facade's):
//!
//! ```no_run
//! # #[cfg(feature = "postgres")] mod example {
//! use idem_postgres::tokio_postgres::{self, Transaction};
//!
//! // #[idempotent(key = "run_id, step_id", mutating, transactional)]
//! async fn create_order(
//!     tx: &mut Transaction<'_>,
//!     run_id: String,
//!     step_id: String,
//!     item: String,
//! ) -> Result<i64, tokio_postgres::Error> {
//!     let row = tx
//!         .query_one("INSERT INTO orders (item) VALUES ($1) RETURNING id", &[&item])
//!         .await?;
//!     Ok(row.get(0))
//! }
//! // idem.scope("tenant-a").run(create_order(run_id, step_id, item)).await?
//! # }
//! ```
//!
//! | what happens | then |
//! |---|---|
//! | the body returns a value | its writes and the record commit together: `Fresh`; every retry replays it |
//! | the body returns an error (`on_error = "release"`, the default) | everything rolls back, the claim too: a corrected retry runs |
//! | the body returns an error (`on_error = "store"`) | its writes roll back to a savepoint, the error is recorded and replayed |
//! | the process dies, the call is cancelled, the connection drops | the server rolls everything back: the retry runs |
//! | a concurrent call of the same key | waits for the first to commit (at most `wait`, default 2 s), then replays, or runs if the first rolled back; past the wait it answers `InFlight` |
//! | the same key with other arguments | `Mismatch`, as for every tool |
//!
//! There is no lease (the record is never seen `in_flight`), no orphan and no `unknown` state:
//! `lease`, `check`, `on_orphan` and `on_error = "unknown"` are compile-time errors on such a
//! tool, and a store other than Postgres refuses its calls before they run (and fails the
//! startup [`audit`](crate::registry::audit)).
//!
//! **Foreign effects are not rolled back.** An HTTP call, a mail or a message sent from the
//! body happens even if the transaction then rolls back, and happens again when the retry runs.
//! Send it with a downstream key ([`current()`](crate::current())`.derive("…")`, the same on
//! every run of the intent) so that the other side deduplicates it, or stage it in the
//! transaction (a row in an outbox table of yours) and send it after the commit.
//!
//! Choose it over a state check when the effect *is* a write to this database: the state check
//! settles orphans after the fact, the transaction leaves none.

use std::future::Future;

use idem_core::canonical::CanonicalError;
use idem_core::fingerprint::Fingerprint;
use idem_core::{Error, Outcome};
#[cfg(feature = "postgres")]
use idem_postgres::tokio_postgres;

use crate::protocol::call::KeyParts;
use crate::protocol::policy::ErrorHandling;
use crate::registry::ToolInfo;
use crate::value::Replayable;

/// The transactions a transactional tool (`#[idempotent(…, transactional)]`) can take as its
/// first parameter, by the type the parameter points to: the driver is chosen by the type the
/// tool names. Implemented by idem for each driver behind its feature; not for you to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction idem can give a transactional tool",
    label = "the first parameter of a `transactional` tool is its transaction",
    note = "take `tx: &mut idem::store::postgres::tokio_postgres::Transaction<'_>` (feature `postgres`) or `tx: &mut sqlx::PgConnection` (feature `sqlx`)"
)]
pub trait Transactional {
    /// The transaction, for any lifetime of the connection it borrows.
    type Of<'t>;

    /// Runs the tool: claim, `body` on the transaction, and the record, committed together.
    /// Called by the code `#[idempotent]` generates.
    #[doc(hidden)]
    fn run<H, V, E, B>(
        tool: &'static ToolInfo,
        policy: H,
        key: KeyParts,
        fingerprint: Result<Fingerprint, CanonicalError>,
        body: B,
    ) -> impl Future<Output = Result<Outcome<V>, Error<E>>>
    where
        E: ErrorHandling<H>,
        V: Replayable,
        B: for<'a, 't> AsyncFnOnce(&'a mut Self::Of<'t>) -> Result<V, E>;
}

#[cfg(feature = "postgres")]
impl Transactional for tokio_postgres::Transaction<'_> {
    type Of<'t> = tokio_postgres::Transaction<'t>;

    fn run<H, V, E, B>(
        tool: &'static ToolInfo,
        _policy: H,
        key: KeyParts,
        fingerprint: Result<Fingerprint, CanonicalError>,
        body: B,
    ) -> impl Future<Output = Result<Outcome<V>, Error<E>>>
    where
        E: ErrorHandling<H>,
        V: Replayable,
        B: for<'a, 't> AsyncFnOnce(&'a mut tokio_postgres::Transaction<'t>) -> Result<V, E>,
    {
        use crate::protocol::transactional::{TokioPostgres, run};
        run::<TokioPostgres, V, E, H, B>(tool, key, fingerprint, body)
    }
}

#[cfg(feature = "sqlx")]
impl Transactional for sqlx::PgConnection {
    type Of<'t> = sqlx::PgConnection;

    fn run<H, V, E, B>(
        tool: &'static ToolInfo,
        _policy: H,
        key: KeyParts,
        fingerprint: Result<Fingerprint, CanonicalError>,
        body: B,
    ) -> impl Future<Output = Result<Outcome<V>, Error<E>>>
    where
        E: ErrorHandling<H>,
        V: Replayable,
        B: for<'a, 't> AsyncFnOnce(&'a mut sqlx::PgConnection) -> Result<V, E>,
    {
        use crate::protocol::transactional::{Sqlx, run};
        run::<Sqlx, V, E, H, B>(tool, key, fingerprint, body)
    }
}
