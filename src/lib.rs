//! # idem: make the tools of an LLM agent safe to retry
//!
//! Agents retry tools all the time: a network timeout, a generic retry handler, a model that
//! calls again after an ambiguous error. When the tool has a side effect (charge a card, create a
//! ticket, send a mail), a blind retry duplicates it. `idem` turns "called N times" into "it
//! happened once".
//!
//! ```
//! use idem::{Idem, Outcome, idempotent};
//! # #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
//! # pub struct Payment { pub id: String, pub amount_cents: u64 }
//! # #[derive(Debug)] pub struct PaymentError;
//!
//! #[idempotent(key = "run_id, step_id", mutating, name = "payments.register")]
//! async fn register_payment(run_id: String, step_id: String, customer: String, amount_cents: u64)
//!     -> Result<Payment, PaymentError>
//! {
//!     // the side effect: runs at most once per (tenant, run_id, step_id)
//!     Ok(Payment { id: format!("pay_{customer}"), amount_cents })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idem::open("memory://").await?; // or sqlite://idem.db
//! let tenant = idem.scope("tenant-a");
//! let first = tenant.run(register_payment("r-9".into(), "3".into(), "cus_42".into(), 500)).await;
//! let retry = tenant.run(register_payment("r-9".into(), "3".into(), "cus_42".into(), 500)).await;
//! assert!(first.unwrap().is_fresh());
//! assert!(matches!(retry.unwrap(), Outcome::Replayed(p) if p.amount_cents == 500));
//! # Ok(()) }
//! ```
//!
//! The attribute rewrites the tool to return `Result<Outcome<T>, idem::Error<E>>`: it
//! canonicalizes the arguments, claims the key in a persistent store **before** the body runs,
//! runs the body at most once, stores its result, and answers every retry from the store.
//!
//! | the store holds | and | the call returns | body runs? |
//! |---|---|---|---|
//! | nothing, or a record past its TTL | | [`Outcome::Fresh`] | yes |
//! | a record | other arguments | [`Outcome::Mismatch`] | never |
//! | a completed record | same arguments | [`Outcome::Replayed`] | never |
//! | an in-flight record, lease live | same arguments | [`Outcome::InFlight`] | never |
//! | an in-flight record, lease lapsed | same arguments | [`Outcome::Fresh`] (takeover) | yes |
//!
//! If the store cannot be reached the call fails closed with [`Error::Store`]: the body does not
//! run. Keys, fingerprints and the `Store` trait are described in [`idem_core`], the call
//! protocol and the runtime in [`idem_runtime`]; the options of the attribute in
//! [`idempotent`].
//!
//! # The guide
//!
//! The manual is the guide, in the repository (`guide/`, an mdBook whose code blocks are
//! compiled and run by the tests), a chapter per topic:
//!
//! | topic | chapter |
//! |---|---|
//! | installing, the features, the two commands | [Getting started](https://github.com/idem-rs/idem/blob/main/guide/src/getting-started.md) |
//! | the decision table, the outcomes, errors, downstream keys | [The contract and the outcomes](https://github.com/idem-rs/idem/blob/main/guide/src/contract.md) |
//! | every option, keys, fingerprints, the registry | [The attribute](https://github.com/idem-rs/idem/blob/main/guide/src/attribute.md) |
//! | leases, orphans, `unknown`, what a crash leaves | [Crashes, leases and unknown outcomes](https://github.com/idem-rs/idem/blob/main/guide/src/crashes.md) |
//! | SQLite, Postgres, Redis, TLS, pools, clusters | [Stores and scaling out](https://github.com/idem-rs/idem/blob/main/guide/src/stores.md) |
//! | exactly once for writes to your own database | [Transactional tools](https://github.com/idem-rs/idem/blob/main/guide/src/transactional.md) |
//! | MCP, rig, the retry executor and dead letters | [Agents](https://github.com/idem-rs/idem/blob/main/guide/src/agents.md) |
//! | durable engines: keys from the run, resume windows | [Durable runs](https://github.com/idem-rs/idem/blob/main/guide/src/durable-runs.md) |
//! | a duplicate that waits for the first call's result | [Duplicates that wait](https://github.com/idem-rs/idem/blob/main/guide/src/waiting.md) |
//! | a key and an outcome per item, one round trip | [Batches](https://github.com/idem-rs/idem/blob/main/guide/src/batches.md) |
//! | streaming tools: chunks recorded, replayed, followed | [Streams](https://github.com/idem-rs/idem/blob/main/guide/src/streams.md) |
//! | large results stored once, content-addressed | [Large results](https://github.com/idem-rs/idem/blob/main/guide/src/large-results.md) |
//! | the `Idempotency-Key` layer and client | [HTTP](https://github.com/idem-rs/idem/blob/main/guide/src/http.md) |
//! | the `idem` command, telemetry | [Operating](https://github.com/idem-rs/idem/blob/main/guide/src/operating.md) |
//! | a failing store, fuzzing, a soak | [Testing your tools](https://github.com/idem-rs/idem/blob/main/guide/src/testing.md) |
//! | figures against raw stores | [Benchmarks](https://github.com/idem-rs/idem/blob/main/guide/src/benchmarks.md) |
//! | what it does not do (yet) | [Known limits](https://github.com/idem-rs/idem/blob/main/guide/src/limits.md) |
//! | the crate graph | [The crates](https://github.com/idem-rs/idem/blob/main/guide/src/architecture.md) |

//!
//! # Features
//!
//! The default build is the embedded SQLite store; everything else is opt-in (the memory store
//! is always there). Rust 1.89 or later, except with `rig` (1.95, rig-core's own minimum).
#![cfg_attr(feature = "document-features", doc = document_features::document_features!())]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(inline)]
pub use idem_core::*;
#[doc(inline)]
pub use idem_runtime::*;

/// Stores: where claims and results live. The [`Store`](store::Store) trait, its records and
/// the decision table are the core's ([`idem_core::store`]); each backend is a crate of its own,
/// here under the name of its feature.
pub mod store {
    #[doc(inline)]
    pub use idem_core::store::*;

    /// The shared PostgreSQL store (feature `postgres`): the `idem-postgres` crate,
    /// [`idem_postgres`].
    #[cfg(feature = "postgres")]
    pub mod postgres {
        #[doc(inline)]
        pub use idem_postgres::*;
    }

    /// The shared Redis store (feature `redis`): the `idem-redis` crate, [`idem_redis`].
    #[cfg(feature = "redis")]
    pub mod redis {
        #[doc(inline)]
        pub use idem_redis::*;
    }

    /// The embedded SQLite store (feature `sqlite`, the default): the `idem-sqlite` crate,
    /// [`idem_sqlite`].
    #[cfg(feature = "sqlite")]
    pub mod sqlite {
        #[doc(inline)]
        pub use idem_sqlite::*;
    }
}

/// HTTP on both sides of the wire (features `http-server` and `http-client`): the `idem-http`
/// crate, [`idem_http`].
#[cfg(any(feature = "http-server", feature = "http-client"))]
pub mod http {
    #[doc(inline)]
    pub use idem_http::*;
}

/// MCP tools with rmcp (feature `rmcp`): the `idem-mcp` crate, [`idem_mcp`].
#[cfg(feature = "rmcp")]
pub mod mcp {
    #[doc(inline)]
    pub use idem_mcp::*;
}

/// rig tools (feature `rig`): the `idem-rig` crate, [`idem_rig`].
#[cfg(feature = "rig")]
pub mod rig {
    #[doc(inline)]
    pub use idem_rig::*;
}

/// Restate handlers (feature `restate`): the `idem-restate` crate, [`idem_restate`].
#[cfg(feature = "restate")]
pub mod restate {
    #[doc(inline)]
    pub use idem_restate::*;
}

/// What the `#[idempotent]` macro expands to calls: the runtime's, and the rig integration's
/// key part of a tool context. Not a public API.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "rig")]
    pub use idem_rig::ContextKeyPart;
    pub use idem_runtime::__private::*;
}

/// Makes an async tool function safe to retry.
///
/// ```
/// # use idem::idempotent;
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Ticket;
/// #[idempotent(key = "run_id, step_id", mutating, name = "crm.create_ticket", ttl = "7d")]
/// async fn create_ticket(run_id: String, step_id: u32, title: String) -> Result<Ticket, String> {
///     Ok(Ticket)
/// }
/// ```
///
/// The function must be `async`, return `Result<T, E>` (or an alias of one), and declare what it
/// does: `mutating` or `natural`. It is rewritten to return
/// `Result<Outcome<T>, idem::Error<E>>`, and registered in [`registry`] for the startup
/// [`audit`] and the tool report. Calls run inside a tenant's scope
/// (`idem.scope(tenant).run(call)`) or under a process default (`idem.install(tenant)`);
/// without either they fail closed with [`Error::NoRuntime`].
///
/// # `mutating`
///
/// The tool has a side effect. It must declare a `key`; the compiler refuses it otherwise:
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(mutating)] // error: `mutating` tools must declare `key = "…"`
/// async fn charge(run_id: String) -> Result<u64, String> { Ok(1) }
/// ```
///
/// # `key = "run_id, step_id"`
///
/// The parameters that identify the *intent*, in order. Together with the tenant and the tool's
/// name they derive the key (SHA-256, length-prefixed; only a short hash is ever shown). A part
/// may be a field path into a parameter (`key = "req.run_id"`) or into `self`
/// (`key = "self.account_id, ticket_ref"`), so tools whose arguments are one struct work.
/// String parts must be 1 to 255 visible ASCII characters, checked before the store is touched.
///
/// `run_id` and `step_id` without a parameter of that name come from the durable run the tool
/// is called in ([`run`]): an engine integration opens the run's step, and the tool writes no
/// key plumbing. Outside a step such a tool answers [`Error::NoRun`]; a parameter of that name
/// wins. `step_id` alone is refused (step ids repeat from run to run):
///
/// ```
/// # use idem::idempotent;
/// #[idempotent(key = "run_id, step_id", mutating, name = "payments.charge")]
/// async fn charge(customer: String, amount_cents: u64) -> Result<u64, std::fmt::Error> {
///     Ok(amount_cents)
/// }
///
/// # async fn f(idem: idem::Idem) -> Result<(), Box<dyn std::error::Error>> {
/// let run = idem::run::Run::new("order-1042")?;
/// let step = run.step("charge", charge("cus_1".into(), 500))?;
/// idem.scope("tenant-a").run(step).await?;
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(key = "step_id", mutating)] // error: key on the run too
/// async fn charge(amount_cents: u64) -> Result<u64, String> { Ok(amount_cents) }
/// ```
///
/// Parts that change between attempts or look like personal data are refused at compile time:
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(key = "run_id, attempt", mutating)] // error: `attempt` changes between attempts
/// async fn charge(run_id: String, attempt: u32) -> Result<u64, String> { Ok(1) }
/// ```
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(key = "tool_call_id", mutating)] // error: the LLM's id names a message, not an effect
/// async fn charge(tool_call_id: String) -> Result<u64, String> { Ok(1) }
/// ```
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(key = "email", mutating)] // error: looks like personal data
/// async fn send_receipt(email: String) -> Result<(), String> { Ok(()) }
/// ```
///
/// # Optional keys and `required`
///
/// A key part of type `Option<_>` makes the key optional, as the seeds advise for a
/// client-supplied `idempotency_key`: when the caller passes `None` the call runs unprotected and
/// returns [`Outcome::Unprotected`], never a silent replay. With `required`, `None` is
/// [`Error::MissingKey`] and the body does not run.
///
/// ```
/// # use idem::idempotent;
/// #[idempotent(key = "idempotency_key", mutating, name = "mail.send")]
/// async fn send_mail(idempotency_key: Option<String>, to: String) -> Result<(), String> { Ok(()) }
/// ```
///
/// # `natural`
///
/// The tool is safe to repeat as it is (`set_status("active")`): it is registered, touches no
/// store and always returns [`Outcome::Fresh`]. It takes no key options:
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(natural, key = "entity")] // error: `key` does not apply to `natural` tools
/// async fn set_status(entity: String) -> Result<(), String> { Ok(()) }
/// ```
///
/// # `name = "payments.register"`
///
/// The stable name that goes into the key (default: the function's name). Set it, and renaming
/// the Rust function keeps the stored keys; the audit warns about keyed tools without one.
///
/// # `ttl = "24h"` and `lease = "30s"`
///
/// How long a record lives (default 24 h, from completion) and how long an in-flight call blocks
/// others before a retry may take it over (default 30 s). Units: `ms`, `s`, `m`, `h`, `d`,
/// combinable (`1h30m`); checked at compile time, and a TTL shorter than the lease is refused:
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(key = "run_id", mutating, ttl = "24 hours")] // error: not a duration
/// async fn charge(run_id: String) -> Result<u64, String> { Ok(1) }
/// ```
///
/// # `skip = "sent_at, req.trace_id"`
///
/// Arguments or fields left out of the fingerprint: volatile data a client library injects, which
/// would otherwise turn a faithful retry into a mismatch.
///
/// # `on_error = "release" | "store" | "unknown" | "classify"`
///
/// What an error of the body means for the key ([`ErrorClass`]), reported to the caller in
/// [`Error::Tool`]'s `class`:
///
/// - `release` (the default): no effect happened; the claim is deleted, so a corrected retry runs.
/// - `store`: a definite end that retries must see (what Stripe does for requests that started
///   executing); the error is stored and replayed. The error type must be
///   `Serialize + Deserialize`.
/// - `unknown`: the effect may have happened (a timeout after the request left). The key is
///   blocked: later calls get [`Outcome::Unknown`] and the body does not run, until the tool's
///   `check` finds out (at the next call) or the TTL ends.
/// - `classify`: the error type implements [`ClassifyError`] and says, error by error, which of
///   the three it is; it must also be `Serialize + Deserialize`.
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// struct Declined;
/// // error: `Declined` does not implement `idem::ClassifyError`
/// #[idempotent(key = "run_id", mutating, on_error = "classify")]
/// async fn charge(run_id: String) -> Result<u64, Declined> { Err(Declined) }
/// ```
///
/// # `on_orphan = "takeover" | "unknown"`
///
/// For keyed tools without a `check`: what a later call does with an *orphan*, the `in_flight`
/// record of a call that died (crash, panic, cancelled future) after its claim, once its lease
/// lapsed. `takeover` (the default) runs the body again with a new fencing token: right when the
/// effect is deduplicated downstream (pass `idem::current().derive(…)` as the provider's
/// idempotency key) or harmless to repeat. `unknown` marks the record unknown and answers
/// [`Outcome::Unknown`]: the body never runs twice, at the price of a human decision after a crash.
/// With a `check`, the check decides and `on_orphan` is refused.
///
/// # `check = path::to_fn`
///
/// A state check: an `async fn` that receives the tool's arguments by reference (and `self`, for
/// methods taking `&self`) and answers whether the effect already happened,
/// `Result<Option<T>, E>` with the tool's `T` and `E`: `Some(result)` if it did.
///
/// - With `mutating` and no `key` (form 3 on its own, like `assign_shift`): the check runs before
///   every call; `Some(v)` answers `Replayed(v)` without running the body, `None` runs it
///   (`Fresh`). No store is involved; concurrent first calls may both find nothing, so the effect
///   itself must tolerate that (a unique constraint, an upsert).
/// - With a `key`: the check runs only when a claim takes over an orphan (an `in_flight` record
///   whose lease lapsed: its owner crashed or was cancelled, maybe after the effect) or an
///   `unknown` record (an error classified unknown). `Some(v)`
///   stores `v` as the completed result and answers `Replayed(v)`; `None` runs the body. Inside
///   the check, `idem::current()` is the call, so it can ask a provider by the same downstream key.
///
/// A check that fails answers [`Error::CheckFailed`]: the body does not
/// run, and a claim taken for the check keeps the key until its lease lapses.
///
/// ```
/// # use idem::idempotent;
/// # #[derive(Debug, serde::Serialize, serde::Deserialize)] struct Shift { already_assigned: bool }
/// async fn already_assigned(crewmate: &str, shift: &str) -> Result<Option<Shift>, String> {
///     Ok(None) // ask the roster
/// }
///
/// #[idempotent(mutating, check = already_assigned)]
/// async fn assign_shift(crewmate: String, shift: String) -> Result<Shift, String> {
///     Ok(Shift { already_assigned: false })
/// }
/// ```
///
/// ```compile_fail
/// # use idem::idempotent;
/// # async fn already_set(entity: &str) -> Result<Option<()>, String> { Ok(None) }
/// #[idempotent(natural, check = already_set)] // a natural tool has nothing to reconcile
/// async fn set_status(entity: String) -> Result<(), String> { Ok(()) }
/// ```
///
/// # `wait = "5s"`
///
/// How long a call that finds its key held by a call still running waits for that call to
/// finish (default: the runtime's [`IdemBuilder::wait`](crate::IdemBuilder::wait), none unless
/// set). The duplicate a model or a worker sends while the first call runs then gets the first
/// call's result as [`Outcome::Replayed`] (or its stored error) instead of
/// [`Outcome::InFlight`]; the body still runs once. It works across processes: the waiting call
/// watches the key (Postgres `LISTEN`/`NOTIFY`, Redis pub/sub, in-process notices; SQLite
/// written by another process is polled with a backoff of 5 to 100 ms) and claims it again when
/// the first settles it. If the first call released its key (an error that says nothing
/// happened), one waiting call runs; if its process died, one takes it over once its lease
/// lapses, as a retry would: never two bodies at once. Past `wait` the call answers
/// `InFlight`. `wait = "0s"` turns a runtime default off for one tool.
///
/// ```
/// # use idem::idempotent;
/// #[idempotent(key = "run_id, step_id", mutating, wait = "10s")]
/// async fn send_invoice(run_id: String, step_id: String, to: String) -> Result<u64, String> {
///     Ok(1)
/// }
/// ```
///
/// # Batches: `key = "run_id, items[].id"`
///
/// `items[]` in the key makes a batch tool over the `Vec` parameter `items`: a key per item
/// (the other parts with the item's `.id`; `items[]` alone keys on the item itself) and a
/// fingerprint per item (the other arguments with that item). The claims of all the items take
/// one store round trip, their settlements one more. The body gets only the items to run now,
/// in their order, and returns one result per item, in the same order: `Vec<Result<T, E>>`,
/// rewritten to `Result<Batch<T, E>, idem::Error<E>>`, one answer per item given ([`Batch`]:
/// `Fresh`, `Replayed`, `Mismatch`, `InFlight`, `Unknown`, or that item's own error). Each
/// item's error follows `on_error`; a bad item (a mismatch, an invalid key, a key repeated in
/// the batch) never blocks the others. At most [`MAX_BATCH_ITEMS`] items a call. Inside the
/// body, [`current_batch()`] gives each item's downstream key.
///
/// ```
/// # use idem::idempotent;
/// # #[derive(serde::Serialize)] struct Mail { id: u32, subject: String }
/// #[idempotent(key = "run_id, mails[].id", mutating)]
/// async fn send_mails(run_id: String, mails: Vec<Mail>) -> Vec<Result<u64, String>> {
///     mails.iter().map(|mail| Ok(u64::from(mail.id))).collect()
/// }
/// ```
///
/// A batch tool is not `transactional`, has no `check` and does not `wait`; it returns one
/// result per item:
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(key = "run_id, ids[]", mutating)] // error: return `Vec<Result<T, E>>`
/// async fn send_all(run_id: String, ids: Vec<String>) -> Result<Vec<u64>, String> {
///     Ok(Vec::new())
/// }
/// ```
///
/// # Streams: `out: Emitter<T>`
///
/// A parameter of type [`Emitter<T>`](Emitter) makes a streaming tool: the body sends chunks
/// through it (`out.emit(chunk).await`), and each is recorded under the call's key, fenced by
/// its claim, before a reader gets it. Callers do not pass the emitter; it is neither a key
/// part nor fingerprinted. The tool's `Result<V, E>` is rewritten to
/// `Result<Outcome<Streamed<T, V, E>>, idem::Error<E>>`: a [`Streamed`] gives the chunks, then
/// the end (`finish()`). A retry after the call completed replays the chunks and the end; a retry
/// while it streams follows it (the chunks so far, then the rest), and breaks off rather than
/// mix two holders' chunks. The arguments are owned (the stream is read after the call that
/// starts it returns).
///
/// ```
/// # use idem::{Emitter, idempotent};
/// #[idempotent(key = "run_id, step_id", mutating)]
/// async fn summarize(run_id: String, step_id: u32, text: String, out: Emitter<String>)
///     -> Result<usize, String>
/// {
///     for sentence in text.split(". ") {
///         out.emit(sentence.to_owned()).await;
///     }
///     Ok(text.len())
/// }
/// ```
///
/// A streaming tool is keyed (not `natural`), has no `check`, does not `wait` (its retries
/// follow the stream) and is not `transactional` or a batch:
///
/// ```compile_fail
/// # use idem::{Emitter, idempotent};
/// #[idempotent(key = "run_id", mutating, wait = "5s")] // error: a retry follows the stream
/// async fn summarize(run_id: String, out: Emitter<String>) -> Result<usize, String> {
///     Ok(0)
/// }
/// ```
///
/// # `transactional` and `wait = "2s"`
///
/// For effects in the database that also holds idem's records (the Postgres store, feature
/// `postgres`): the tool takes a transaction on that database as its first parameter, which
/// callers never pass (`&mut tokio_postgres::Transaction<'_>`, or with the feature `sqlx`,
/// `&mut sqlx::PgConnection` on the pool handed to `PostgresStore::use_sqlx`), and its claim, its writes and its recorded result commit in that one
/// transaction. A crash, a cancellation or an error leaves all of it or none of it: exactly once,
/// with no lease, no orphan and no `unknown` state ([`transactional`] has the whole table). A
/// concurrent call of the same key waits for the first to commit (on the row's lock, not a
/// notice), at most `wait` (default 2 s, not the runtime's default), then replays; past it, it answers [`Outcome::InFlight`]. On another store the call is refused
/// before it runs, and the startup [`audit`] reports the tool.
///
/// ```
/// # #[cfg(feature = "postgres")] mod tool {
/// # use idem::idempotent;
/// use idem::store::postgres::tokio_postgres::{Error, Transaction};
///
/// #[idempotent(key = "run_id, step_id", mutating, transactional, name = "orders.create")]
/// async fn create_order(
///     tx: &mut Transaction<'_>,
///     run_id: String,
///     step_id: String,
///     item: String,
/// ) -> Result<i64, Error> {
///     let row = tx
///         .query_one("INSERT INTO orders (item) VALUES ($1) RETURNING id", &[&item])
///         .await?;
///     Ok(row.get(0))
/// }
/// // idem.scope("tenant-a").run(create_order(run_id, step_id, item)).await?
/// # }
/// ```
///
/// What only a lease or an orphan needs is refused on such a tool (`lease`, `on_orphan`,
/// `check`, `on_error = "unknown"`), and so is a tool without its transaction:
///
/// ```compile_fail
/// # use idem::idempotent;
/// // error: a `transactional` tool takes its transaction first
/// #[idempotent(key = "run_id", mutating, transactional)]
/// async fn create_order(run_id: String) -> Result<i64, String> { Ok(1) }
/// ```
///
/// # Arguments and results
///
/// Every argument of a keyed tool must be `Serialize` (it is fingerprinted), and the value must
/// be `Serialize + Deserialize` (it is stored for replays); otherwise the compiler says so at the
/// parameter or the return type:
///
/// ```compile_fail
/// # use idem::idempotent;
/// struct Connection;
/// #[idempotent(key = "run_id", mutating)]
/// async fn charge(run_id: String, conn: Connection) -> Result<u64, String> { Ok(1) }
/// ```
///
/// ```compile_fail
/// # use idem::idempotent;
/// #[idempotent(key = "run_id", mutating)] // error: `#[idempotent]` tools must be `async fn`
/// fn charge(run_id: String) -> Result<u64, String> { Ok(1) }
/// ```
#[doc(inline)]
pub use idem_macros::idempotent;
