//! The runtime of [idem](https://docs.rs/idem-agent): the call protocol (claim → replay |
//! refuse | check | run → settle), the runtime handle ([`Idem`], [`Scope`]), the tool registry,
//! its audit and report, the current call ([`current()`]), the retry executor, telemetry and
//! transactional tools. Users depend on the facade, the `idem-agent` package (`use idem::…`),
//! which re-exports this crate, the core (`idem-core`: keys, fingerprints, outcomes, the `Store`
//! trait) and the `#[idempotent]` attribute; this crate's docs describe the machinery.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::OpenError> {
//! let idem = idem_runtime::Idem::open("memory://").await?; // sqlite://, postgres://… with a backend
//! let tenant = idem.scope("tenant-a");
//! assert_eq!(tenant.tenant(), "tenant-a");
//! // tenant.run(register_payment(…)).await
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod current;
mod lease_state;
mod metric_keys;
pub mod protocol;
pub mod registry;
pub mod retry;
pub mod run;
mod runtime;
mod store_handle;
mod streamed;
pub mod telemetry;
mod timer;
pub mod transactional;
mod value;

#[doc(hidden)]
pub mod __private;

pub use current::{Current, CurrentBatch, current, current_batch};
pub use protocol::batch::MAX_BATCH_ITEMS;
pub use registry::audit;
pub use runtime::{
    DEFAULT_LEASE, DEFAULT_MAX_ARGUMENT_BYTES, DEFAULT_MAX_RESULT_BYTES, DEFAULT_TTL, Idem,
    IdemBuilder, Scope,
};
pub use store_handle::IdemStore;
pub use streamed::{Emitter, Streamed};
#[doc(hidden)]
pub use value::Checked;
pub use value::{ClassifiedError, Replayable, StoredError, ToolResult};
