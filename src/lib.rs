//! placeholder
pub use idem_macros::idempotent;
pub use idem_runtime::*;
