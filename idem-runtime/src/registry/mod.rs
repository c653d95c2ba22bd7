//! Every `#[idempotent]` tool registers itself here, for the startup audit and the report.
//!
//! ```no_run
//! # async fn f(idem: idem_runtime::Idem) {
//! for tool in idem_runtime::registry::tools() {
//!     println!("{} keyed by {:?}", tool.name, tool.key_parts);
//! }
//! let audit = idem_runtime::registry::audit(&idem).await;
//! assert!(audit.is_ok(), "{audit}");
//! std::fs::write("TOOLS.md", idem_runtime::registry::report().to_markdown()).unwrap();
//! # }
//! ```

mod audit;
mod report;
mod tool;

pub use audit::{Audit, Finding, Severity, audit, audit_tools};
pub(crate) use report::write_report_from_env;
pub use report::{REPORT_ENV, Report, ResumeCheck, report};
pub use tool::{
    DEFAULT_WAIT, ErrorPolicy, Form, OrphanPolicy, Registration, ToolInfo, format_duration, tools,
};
