//! The core of [idem](https://docs.rs/idem-agent): what every part needs and nothing that runs a
//! call. Users depend on the facade, the `idem-agent` package (`use idem::…`), which re-exports
//! this crate; backends and integrations build on it.
//!
//! | module | what it holds |
//! |---|---|
//! | [`key`] | keys and their derivation: one function, [`derive_key`] |
//! | [`canonical`], [`fingerprint`](mod@fingerprint) | canonical JSON (RFC 8785) and the fingerprint of arguments: one function, [`fingerprint()`](fn@fingerprint) |
//! | [`Outcome`], [`Error`] | what a call returns |
//! | [`clock`] | where time is read |
//! | [`store`] | the [`Store`](store::Store) trait, its records, the decision table ([`decide`](store::decide)), opening a store from a URL, the in-memory reference store, and the conformance suite (feature `conformance`) |
//!
//! ```
//! use idem_core::{derive_key, fingerprint};
//! use idem_core::key::KeyPart;
//!
//! // The same intent always derives the same key; the raw parts never leave the call.
//! let parts = [KeyPart::new("run-9").unwrap(), KeyPart::new("step-3").unwrap()];
//! let key = derive_key("tenant-a", "payments.register", &parts);
//! assert_eq!(key.to_string().len(), 12); // only a short hash is ever shown
//!
//! // Fingerprints do not depend on member order.
//! let a = fingerprint(&serde_json::json!({"amount": 500, "customer": "c"}), &[]).unwrap();
//! let b = fingerprint(&serde_json::json!({"customer": "c", "amount": 500}), &[]).unwrap();
//! assert_eq!(a, b);
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
pub mod canonical;
pub mod clock;
mod error;
pub mod fingerprint;
pub mod hex;
pub mod key;
mod outcome;
#[cfg(feature = "rmcp")]
mod rmcp;
pub mod store;

/// The crate that registers stores' drivers, re-exported for backends' `inventory::submit!`.
#[doc(hidden)]
pub use inventory;

pub use batch::Batch;
pub use error::{ClassifyError, Error, ErrorClass, OpenError, StoreError, StoreErrorKind};
pub use fingerprint::{Fingerprint, fingerprint};
pub use key::{
    DownstreamKey, IdempotencyKey, InvalidKey, KeyHash, derive_downstream_key, derive_key,
    validate_key_string,
};
pub use outcome::{InFlight, Mismatch, Outcome, Unknown};
