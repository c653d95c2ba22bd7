//! The tool report (Markdown and JSON), and `IDEM_REPORT`, which has any binary write it.

use std::time::Duration;

use serde::Serialize;

use super::tool::{Form, ToolInfo, format_duration, ser_opt_duration, sort_tools, tools};
use crate::runtime::{DEFAULT_LEASE, DEFAULT_TTL, Idem};

/// The tool report: every registered tool with its key, TTL, lease and policy.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Default TTL applied to tools that declare none.
    #[serde(serialize_with = "ser_duration")]
    pub default_ttl: Duration,
    /// Default lease applied to tools that declare none.
    #[serde(serialize_with = "ser_duration")]
    pub default_lease: Duration,
    /// How long a call of a keyed tool that declares no `wait` waits for a concurrent call of
    /// its key (zero: it answers in flight at once).
    #[serde(serialize_with = "ser_duration")]
    pub default_wait: Duration,
    /// How long durable runs may be resumed, when the runtime declares it; with
    /// [`Report::needed_ttl`], every keyed tool's TTL is set beside it.
    #[serde(serialize_with = "ser_opt_duration")]
    pub resume_window: Option<Duration>,
    /// The key lifetime keyed tools need: the resume window plus the retry window.
    #[serde(serialize_with = "ser_opt_duration")]
    pub needed_ttl: Option<Duration>,
    /// Each keyed tool's TTL beside the resume window, when there is one (sorted as the tools).
    pub resume_checks: Vec<ResumeCheck>,
    /// The tools, sorted by name.
    pub tools: Vec<&'static ToolInfo>,
}

/// A keyed tool's TTL beside the resume window of durable runs: what `idem doctor --tools`
/// shows from a JSON report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResumeCheck {
    /// The tool's stable name.
    pub tool: &'static str,
    /// The TTL in force (declared, else the default).
    #[serde(serialize_with = "ser_duration")]
    pub ttl: Duration,
    /// The key lifetime the runs need: the resume window plus the retry window.
    #[serde(serialize_with = "ser_duration")]
    pub needed: Duration,
    /// Whether the TTL is at least that.
    pub enough: bool,
    /// Whether the runtime accepts a shorter TTL for this tool (`accept_short_ttl`).
    pub accepted: bool,
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

/// The report of every registered tool, with the built-in defaults (24h TTL, 30s lease).
pub fn report() -> Report {
    Report::new(tools(), DEFAULT_TTL, DEFAULT_LEASE)
}

/// The environment variable that makes any binary linking `#[idempotent]` tools write their
/// report: `IDEM_REPORT=tools.md` (Markdown) or `IDEM_REPORT=tools.json` (JSON). It is written
/// once per process, at the first of two moments: the startup [`audit`](super::audit) (with that
/// runtime's defaults), or the first call of any tool (with the defaults of the runtime in scope,
/// or the built-in ones). Building a runtime writes nothing.
pub const REPORT_ENV: &str = "IDEM_REPORT";

/// Writes the report where [`REPORT_ENV`] says, once per process: with `idem`'s defaults when
/// there is a runtime, else (a tool that needs no runtime ran first) with the built-in ones. An
/// error is told on stderr (the variable asked for the file) and the program goes on. The
/// variable is read once: every later call costs one atomic load (this is on every call's path).
pub(crate) fn write_report_from_env(idem: Option<&Idem>) {
    static DONE: std::sync::Once = std::sync::Once::new();
    if DONE.is_completed() {
        return;
    }
    DONE.call_once(|| {
        let Some(path) = std::env::var_os(REPORT_ENV).filter(|p| !p.is_empty()) else {
            return;
        };
        let report = idem.map_or_else(report, Idem::report);
        if let Err(e) = report.write(&path) {
            eprintln!(
                "idem: {REPORT_ENV} asked for the tool report at {}, which could not be written: {e}",
                std::path::Path::new(&path).display()
            );
        }
    });
}

impl Report {
    /// Writes the report to `path`: JSON when it ends in `.json`, Markdown otherwise.
    pub fn write(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        let path = path.as_ref();
        let text = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => self.to_json() + "\n",
            _ => self.to_markdown(),
        };
        std::fs::write(path, text)
    }

    /// A report of `tools` with the given defaults (see also [`Idem::report`]).
    pub fn new(
        mut tools: Vec<&'static ToolInfo>,
        default_ttl: Duration,
        default_lease: Duration,
    ) -> Self {
        sort_tools(&mut tools);
        Report {
            default_ttl,
            default_lease,
            default_wait: Duration::ZERO,
            resume_window: None,
            needed_ttl: None,
            resume_checks: Vec::new(),
            tools,
        }
    }

    /// The report with the runtime's default wait (see [`Report::default_wait`]).
    pub fn with_default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// The report with a resume window of durable runs, and the key lifetime it makes every
    /// keyed tool need (the window plus the retry window); `accepted` names the tools whose
    /// shorter TTL the runtime accepts.
    pub fn with_resume_window(
        mut self,
        resume_window: Duration,
        needed_ttl: Duration,
        accepted: &[String],
    ) -> Self {
        self.resume_window = Some(resume_window);
        self.needed_ttl = Some(needed_ttl);
        self.resume_checks = self
            .tools
            .iter()
            .filter(|t| t.form == Form::Keyed)
            .map(|t| {
                let ttl = t.ttl.unwrap_or(self.default_ttl);
                ResumeCheck {
                    tool: t.name,
                    ttl,
                    needed: needed_ttl,
                    enough: ttl >= needed_ttl,
                    accepted: accepted.iter().any(|a| a == t.name),
                }
            })
            .collect();
        self
    }

    /// The report as pretty JSON (stable: tools sorted, fields in a fixed order).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The report as a Markdown table.
    pub fn to_markdown(&self) -> String {
        let mut out = String::from("# Idempotent tools\n\n");
        let wait = if self.default_wait.is_zero() {
            String::new()
        } else {
            format!(", wait {}", format_duration(self.default_wait))
        };
        out.push_str(&format!(
            "{} tool(s). Defaults: TTL {}, lease {}{wait}. Generated by `idem::registry::report()`.\n\n",
            self.tools.len(),
            format_duration(self.default_ttl),
            format_duration(self.default_lease)
        ));
        if let (Some(resume), Some(needed)) = (self.resume_window, self.needed_ttl) {
            out.push_str(&format!(
                "Durable runs resume for up to {}: every keyed tool's TTL must be at least {} \
                 (the resume window plus the retry window); a shorter one is marked ✗.\n\n",
                format_duration(resume),
                format_duration(needed)
            ));
        }
        out.push_str(
            "| tool | form | key | TTL | lease | wait | on error | on orphan | fingerprint skips | defined at |\n",
        );
        out.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
        for t in &self.tools {
            let form = match (t.form, t.check) {
                (Form::Keyed, None) if t.transactional => {
                    "keyed (mutating), transactional".to_owned()
                }
                (Form::Keyed, None) => match t.batch {
                    Some(list) => format!(
                        "keyed (mutating), batch: a key per item of `{list}` (at most {} a call)",
                        crate::MAX_BATCH_ITEMS
                    ),
                    None if t.stream => {
                        "keyed (mutating), stream: its chunks recorded and replayed".to_owned()
                    }
                    None => "keyed (mutating)".to_owned(),
                },
                (Form::Keyed, Some(check)) => {
                    format!("keyed (mutating), orphans reconciled by `{check}`")
                }
                (Form::StateCheck, check) => format!("state check `{}`", check.unwrap_or("?")),
                (Form::Natural, _) => "natural".to_owned(),
            };
            let key = if t.key_parts.is_empty() {
                "—".to_owned()
            } else {
                let parts = t
                    .key_parts
                    .iter()
                    .map(|p| {
                        if t.run_parts.contains(p) {
                            format!("`{p}` (from the run)")
                        } else {
                            format!("`{p}`")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                if t.key_required {
                    format!("{parts} (required)")
                } else {
                    parts
                }
            };
            let dur = |d: Option<Duration>, default: Duration| match d {
                Some(d) => format_duration(d),
                None => format!("{} (default)", format_duration(default)),
            };
            // Beside the window, when runs resume: the TTL in force, and whether it is enough.
            let ttl = |t: &ToolInfo| {
                let declared = dur(t.ttl, self.default_ttl);
                match self.needed_ttl {
                    Some(needed) if t.ttl.unwrap_or(self.default_ttl) < needed => {
                        format!("{declared} ✗ (runs need {})", format_duration(needed))
                    }
                    Some(_) => format!("{declared} ✓"),
                    None => declared,
                }
            };
            // How long a concurrent call of the key waits for this one: "—" for none.
            let effective = t.effective_wait(self.default_wait);
            let wait = match (t.form, t.wait) {
                (Form::Keyed, _) if effective.is_zero() => "—".to_owned(),
                (Form::Keyed, Some(_)) => format_duration(effective),
                (Form::Keyed, None) => format!("{} (default)", format_duration(effective)),
                _ => "—".to_owned(),
            };
            let (ttl, lease, on_error, on_orphan) = match t.form {
                // Its claim commits with its writes: no lease, no orphan.
                Form::Keyed if t.transactional => (ttl(t), "—".into(), t.on_error.as_str(), "—"),
                Form::Keyed => (
                    ttl(t),
                    dur(t.lease, self.default_lease),
                    t.on_error.as_str(),
                    match t.check {
                        Some(_) => "check",
                        None => t.on_orphan.as_str(),
                    },
                ),
                Form::Natural | Form::StateCheck => ("—".into(), "—".into(), "—", "—"),
            };
            let skip = if t.skip.is_empty() {
                "—".to_owned()
            } else {
                t.skip
                    .iter()
                    .map(|p| format!("`{}`", p.join(".")))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let name = if t.stable_name {
                format!("`{}`", t.name)
            } else {
                format!("`{}` (fn name)", t.name)
            };
            out.push_str(&format!(
                "| {name} | {form} | {key} | {ttl} | {lease} | {wait} | {on_error} | {on_orphan} | {skip} | `{}::{}` ({}:{}) |\n",
                t.module, t.function, t.file, t.line
            ));
        }
        out
    }
}

impl Idem {
    /// The tool report with this runtime's defaults.
    pub fn report(&self) -> Report {
        let report = Report::new(tools(), self.default_ttl(), self.default_lease())
            .with_default_wait(self.default_wait());
        match self.resume_window().zip(self.needed_ttl()) {
            Some((resume, needed)) => {
                report.with_resume_window(resume, needed, self.accepted_short_ttls())
            }
            None => report,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Report;
    use crate::registry::tool::tests::{A, NATURAL, SHORT};
    use crate::runtime::{DEFAULT_LEASE, DEFAULT_TTL};

    #[test]
    fn a_report_is_written_as_json_or_markdown_by_extension() {
        let dir = std::env::temp_dir().join(format!("idem-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let report = Report::new(vec![&A], DEFAULT_TTL, DEFAULT_LEASE);
        report.write(dir.join("tools.json")).unwrap();
        report.write(dir.join("tools.md")).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("tools.json")).unwrap()).unwrap();
        assert_eq!(json["tools"][0]["name"], "payments.register");
        let md = std::fs::read_to_string(dir.join("tools.md")).unwrap();
        assert!(md.starts_with("# Idempotent tools"), "{md}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_report_is_sorted_and_complete() {
        let report = Report::new(vec![&SHORT, &A, &NATURAL], DEFAULT_TTL, DEFAULT_LEASE);
        let md = report.to_markdown();
        let a = md.find("`payments.register`").unwrap();
        let n = md.find("`set_status` (fn name)").unwrap();
        let s = md.find("`short` (fn name)").unwrap();
        assert!(a < n && n < s, "{md}");
        assert!(
            md.contains("| `run_id`, `step_id` | 1h | 30s (default) | — | release |"),
            "{md}"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["default_ttl"], "1d");
        assert_eq!(
            json["tools"][0]["key_parts"],
            serde_json::json!(["run_id", "step_id"])
        );
        assert_eq!(json["tools"][1]["form"], "natural");
    }

    #[test]
    fn a_transactional_tool_says_so_and_has_no_lease() {
        static ORDER: crate::registry::ToolInfo =
            crate::registry::ToolInfo::new("orders.create", "create", "m", "f.rs", 9)
                .stable_name()
                .key(&["run_id"], false)
                .transactional()
                .wait_ms(500);
        let report = Report::new(vec![&ORDER], DEFAULT_TTL, DEFAULT_LEASE);
        let md = report.to_markdown();
        assert!(
            md.contains(
                "| `orders.create` | keyed (mutating), transactional | `run_id` | 1d (default) \
                 | — | 500ms | release | — |"
            ),
            "{md}"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["tools"][0]["transactional"], true);
        assert_eq!(json["tools"][0]["wait"], "500ms");
    }

    #[test]
    fn a_batch_tool_says_over_which_list_and_never_waits() {
        static SEND: crate::registry::ToolInfo =
            crate::registry::ToolInfo::new("mail.send_all", "send_all", "m", "f.rs", 11)
                .stable_name()
                .key(&["run_id", "mails[].id"], false)
                .batch("mails");
        let report = Report::new(vec![&SEND], DEFAULT_TTL, DEFAULT_LEASE)
            .with_default_wait(std::time::Duration::from_secs(5));
        let md = report.to_markdown();
        assert!(
            md.contains(
                "| `mail.send_all` | keyed (mutating), batch: a key per item of `mails` (at most \
                 1000 a call) | `run_id`, `mails[].id` | 1d (default) | 30s (default) | — |"
            ),
            "{md}"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["tools"][0]["batch"], "mails");
    }

    #[test]
    fn a_streaming_tool_says_so_and_never_waits() {
        static DRAFT: crate::registry::ToolInfo =
            crate::registry::ToolInfo::new("report.draft", "draft", "m", "f.rs", 12)
                .stable_name()
                .key(&["run_id", "step_id"], true)
                .stream();
        let report = Report::new(vec![&DRAFT], DEFAULT_TTL, DEFAULT_LEASE)
            .with_default_wait(std::time::Duration::from_secs(5));
        let md = report.to_markdown();
        assert!(
            md.contains(
                "| `report.draft` | keyed (mutating), stream: its chunks recorded and replayed | \
                 `run_id`, `step_id` (required) | 1d (default) | 30s (default) | — |"
            ),
            "{md}"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["tools"][0]["stream"], true);
    }

    #[test]
    fn a_keyed_tool_waits_as_declared_else_as_the_runtime_says() {
        // A keyed tool waits as declared, else as the runtime's default says.
        static SEND: crate::registry::ToolInfo =
            crate::registry::ToolInfo::new("mail.send", "send", "m", "f.rs", 10)
                .stable_name()
                .key(&["run_id"], false)
                .wait_ms(10_000);
        let waits = Report::new(vec![&SEND, &A], DEFAULT_TTL, DEFAULT_LEASE)
            .with_default_wait(std::time::Duration::from_secs(5));
        let md = waits.to_markdown();
        assert!(md.contains("lease 30s, wait 5s."), "{md}");
        assert!(md.contains("| 30s (default) | 10s | release |"), "{md}");
        assert!(
            md.contains("| 30s (default) | 5s (default) | release |"),
            "{md}"
        );
        let json: serde_json::Value = serde_json::from_str(&waits.to_json()).unwrap();
        assert_eq!(json["default_wait"], "5s");
        assert_eq!(json["tools"][0]["wait"], "10s");
    }
}
