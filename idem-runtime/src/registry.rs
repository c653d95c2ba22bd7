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

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::runtime::{DEFAULT_LEASE, DEFAULT_TTL, Idem};
use crate::store::Orphans;

/// Which of the three forms of idempotency a tool uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Form {
    /// `mutating`: a side effect guarded by a key in the store.
    Keyed,
    /// `natural`: safe to repeat as it is (`set_status("active")`); no store traffic.
    Natural,
    /// `check = …` without a key: the tool asks its state check whether the effect already
    /// happened (`assign_shift`) before running; no store traffic.
    StateCheck,
}

/// What happens to the claim when the tool body returns an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorPolicy {
    /// Delete the claim: the error happened before any effect, a corrected retry may run.
    Release,
    /// Store the error and replay it, as Stripe does for requests that started executing.
    Store,
    /// Block the key as `unknown`: the effect may have happened.
    Unknown,
    /// The error type says, error by error ([`ClassifyError`](crate::ClassifyError)).
    Classify,
}

impl ErrorPolicy {
    /// The attribute value: `release`, `store`, `unknown` or `classify`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorPolicy::Release => "release",
            ErrorPolicy::Store => "store",
            ErrorPolicy::Unknown => "unknown",
            ErrorPolicy::Classify => "classify",
        }
    }
}

/// What a later call does with an orphan of a tool **without** a state check: an `in_flight`
/// record whose lease lapsed, because its owner crashed or was cancelled, maybe after the effect.
/// (A tool with `check = …` always asks its check.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OrphanPolicy {
    /// Take it over and run the body again (DESIGN §2's default): right for tools whose effect
    /// is deduplicated downstream (a derived `Idempotency-Key`) or harmless to repeat.
    TakeOver,
    /// Mark it `unknown` and block the key until an operator resolves it: the body never runs
    /// twice, at the price of a human decision after a crash.
    Unknown,
}

impl OrphanPolicy {
    /// The attribute value: `takeover` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrphanPolicy::TakeOver => "takeover",
            OrphanPolicy::Unknown => "unknown",
        }
    }
}

/// The registration of one `#[idempotent]` tool. Built by the macro in a `const` context.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ToolInfo {
    /// The stable name that goes into the key (`name = "…"`, else the fn name).
    pub name: &'static str,
    /// Whether `name` was declared explicitly (renaming the fn then keeps the keys).
    pub stable_name: bool,
    /// The Rust function's name.
    pub function: &'static str,
    /// `module_path!()` of the tool.
    pub module: &'static str,
    /// Source file.
    pub file: &'static str,
    /// Source line of the attribute.
    pub line: u32,
    /// Keyed or natural.
    pub form: Form,
    /// The declared key parts, in order (`run_id`, `req.step_id`).
    pub key_parts: &'static [&'static str],
    /// Whether a `None` key part is an error (`required`) rather than an unprotected call.
    pub key_required: bool,
    /// Declared TTL, if any (else the runtime's default).
    #[serde(serialize_with = "ser_opt_duration")]
    pub ttl: Option<Duration>,
    /// Declared lease, if any (else the runtime's default).
    #[serde(serialize_with = "ser_opt_duration")]
    pub lease: Option<Duration>,
    /// Argument fields left out of the fingerprint, as paths.
    pub skip: &'static [&'static [&'static str]],
    /// What an error of the body does to the claim.
    pub on_error: ErrorPolicy,
    /// What a later call does with an orphan, when there is no state check.
    pub on_orphan: OrphanPolicy,
    /// The state check (`check = path`) that reconciles orphans, or decides a keyless tool.
    pub check: Option<&'static str>,
}

fn ser_opt_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format_duration(*d)),
        None => s.serialize_none(),
    }
}

impl ToolInfo {
    /// A keyed tool with the runtime's defaults; chain the other `const fn`s to refine it.
    pub const fn new(
        name: &'static str,
        function: &'static str,
        module: &'static str,
        file: &'static str,
        line: u32,
    ) -> Self {
        ToolInfo {
            name,
            stable_name: false,
            function,
            module,
            file,
            line,
            form: Form::Keyed,
            key_parts: &[],
            key_required: false,
            ttl: None,
            lease: None,
            skip: &[],
            on_error: ErrorPolicy::Release,
            on_orphan: OrphanPolicy::TakeOver,
            check: None,
        }
    }

    /// Marks `name` as declared explicitly.
    pub const fn stable_name(mut self) -> Self {
        self.stable_name = true;
        self
    }

    /// Marks the tool naturally idempotent.
    pub const fn natural(mut self) -> Self {
        self.form = Form::Natural;
        self
    }

    /// The key parts.
    pub const fn key(mut self, parts: &'static [&'static str], required: bool) -> Self {
        self.key_parts = parts;
        self.key_required = required;
        self
    }

    /// The declared TTL in milliseconds.
    pub const fn ttl_ms(mut self, ms: u64) -> Self {
        self.ttl = Some(Duration::from_millis(ms));
        self
    }

    /// The declared lease in milliseconds.
    pub const fn lease_ms(mut self, ms: u64) -> Self {
        self.lease = Some(Duration::from_millis(ms));
        self
    }

    /// The skipped argument paths.
    pub const fn skip(mut self, paths: &'static [&'static [&'static str]]) -> Self {
        self.skip = paths;
        self
    }

    /// The state check, by its path as written.
    pub const fn check(mut self, path: &'static str) -> Self {
        self.check = Some(path);
        self
    }

    /// Marks the tool as decided by its state check alone (no key).
    pub const fn state_check(mut self) -> Self {
        self.form = Form::StateCheck;
        self
    }

    /// The error policy.
    pub const fn on_error(mut self, policy: ErrorPolicy) -> Self {
        self.on_error = policy;
        self
    }

    /// The orphan policy.
    pub const fn on_orphan(mut self, policy: OrphanPolicy) -> Self {
        self.on_orphan = policy;
        self
    }

    /// What a claim of this tool does with orphans and `unknown` records: its state check
    /// decides when it has one, else its `on_orphan` policy.
    pub fn orphans(&self) -> Orphans {
        match (self.check, self.on_orphan) {
            (Some(_), _) => Orphans::Reconcile,
            (None, OrphanPolicy::TakeOver) => Orphans::TakeOver,
            (None, OrphanPolicy::Unknown) => Orphans::Block,
        }
    }

    /// The TTL in force under `idem`.
    pub fn effective_ttl(&self, idem: &Idem) -> Duration {
        self.ttl.unwrap_or(idem.default_ttl())
    }

    /// The lease in force under `idem`.
    pub fn effective_lease(&self, idem: &Idem) -> Duration {
        self.lease.unwrap_or(idem.default_lease())
    }
}

/// What the macro submits to `inventory`.
#[doc(hidden)]
pub struct Registration(pub &'static ToolInfo);

inventory::collect!(Registration);

/// Every registered tool, sorted by name, then module and function (registration order is
/// unspecified, so it is never exposed).
pub fn tools() -> Vec<&'static ToolInfo> {
    let mut all: Vec<&'static ToolInfo> = inventory::iter::<Registration>
        .into_iter()
        .map(|r| r.0)
        .collect();
    sort_tools(&mut all);
    all
}

/// The one order of tools in listings and reports: by name, then where they are defined
/// (registration order is unspecified, so it is never exposed).
fn sort_tools(tools: &mut [&'static ToolInfo]) {
    tools.sort_by(|a, b| {
        (a.name, a.module, a.function, a.file, a.line)
            .cmp(&(b.name, b.module, b.function, b.file, b.line))
    });
}

/// Writes a duration the way the attribute takes it: `24h`, `30s`, `1500ms`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// How serious a finding of the audit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Something to look at; the runtime is still correct.
    Warning,
    /// The runtime cannot keep its promise: fix before serving.
    Error,
}

/// One finding of [`audit`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// How serious it is.
    pub severity: Severity,
    /// The tool concerned, if any (store findings concern none).
    pub tool: Option<&'static str>,
    /// What is wrong and what to do.
    pub message: String,
}

/// The result of [`audit`]: findings sorted by severity (errors first), then tool.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Audit {
    /// The findings.
    pub findings: Vec<Finding>,
}

impl Audit {
    /// Whether no finding is an error.
    pub fn is_ok(&self) -> bool {
        self.errors().next().is_none()
    }

    /// The findings of severity `Error`.
    pub fn errors(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
    }
}

impl fmt::Display for Audit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.findings.is_empty() {
            return write!(f, "idem audit: no findings");
        }
        write!(f, "idem audit: {} finding(s)", self.findings.len())?;
        for finding in &self.findings {
            let level = match finding.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            match finding.tool {
                Some(tool) => write!(f, "\n  {level}: tool `{tool}`: {}", finding.message)?,
                None => write!(f, "\n  {level}: {}", finding.message)?,
            }
        }
        Ok(())
    }
}

/// Checks the registered tools against `idem` at startup.
///
/// Errors: two tools sharing a name (their keys would collide), a TTL shorter than the lease,
/// an unreachable store or a schema other than this build's. Warnings: a TTL shorter than the
/// retry window, a keyed tool without a stable `name`, a store that does not survive restarts.
pub async fn audit(idem: &Idem) -> Audit {
    audit_tools(idem, &tools()).await
}

/// [`audit`] over an explicit list of tools.
pub async fn audit_tools(idem: &Idem, tools: &[&'static ToolInfo]) -> Audit {
    let mut findings = Vec::new();
    let mut by_name: BTreeMap<&str, Vec<&ToolInfo>> = BTreeMap::new();
    for tool in tools {
        by_name.entry(tool.name).or_default().push(tool);
    }
    for (name, same) in by_name.iter().filter(|(_, v)| v.len() > 1) {
        let places: Vec<String> = same
            .iter()
            .map(|t| format!("{}::{} ({}:{})", t.module, t.function, t.file, t.line))
            .collect();
        findings.push(Finding {
            severity: Severity::Error,
            tool: Some(same[0].name),
            message: format!(
                "{} tools share the name `{name}`, so their keys collide: {}; give each a \
                 distinct `name = \"…\"`",
                same.len(),
                places.join(", ")
            ),
        });
    }
    for tool in tools.iter().filter(|t| t.form == Form::Keyed) {
        let (ttl, lease) = (tool.effective_ttl(idem), tool.effective_lease(idem));
        if ttl < lease {
            findings.push(Finding {
                severity: Severity::Error,
                tool: Some(tool.name),
                message: format!(
                    "TTL {} is shorter than the lease {}: a running call's record would expire \
                     under it and a retry would run the body again",
                    format_duration(ttl),
                    format_duration(lease)
                ),
            });
        } else if ttl < idem.retry_window() {
            findings.push(Finding {
                severity: Severity::Warning,
                tool: Some(tool.name),
                message: format!(
                    "TTL {} is shorter than the retry window {}: a retry after {} runs the body \
                     again",
                    format_duration(ttl),
                    format_duration(idem.retry_window()),
                    format_duration(ttl)
                ),
            });
        }
        if !tool.stable_name {
            findings.push(Finding {
                severity: Severity::Warning,
                tool: Some(tool.name),
                message: format!(
                    "no stable `name`: renaming `{}` would orphan its stored keys; declare \
                     `name = \"{}\"`",
                    tool.function, tool.name
                ),
            });
        }
    }
    match idem.health().await {
        Ok(h) if h.schema_version != h.expected_schema_version => findings.push(Finding {
            severity: Severity::Error,
            tool: None,
            message: format!(
                "the {} store has schema version {}, this build writes {}",
                h.backend, h.schema_version, h.expected_schema_version
            ),
        }),
        Ok(h) if !h.durable => findings.push(Finding {
            severity: Severity::Warning,
            tool: None,
            message: format!(
                "the {} store does not survive a restart (or a power loss): a retry after one \
                 runs the body again{}",
                h.backend,
                h.detail.map(|d| format!(" ({d})")).unwrap_or_default()
            ),
        }),
        Ok(_) => {}
        Err(e) => findings.push(Finding {
            severity: Severity::Error,
            tool: None,
            message: format!("the store is not usable: {e}"),
        }),
    }
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.tool.cmp(&b.tool)));
    Audit { findings }
}

/// The tool report: every registered tool with its key, TTL, lease and policy.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Default TTL applied to tools that declare none.
    #[serde(serialize_with = "ser_duration")]
    pub default_ttl: Duration,
    /// Default lease applied to tools that declare none.
    #[serde(serialize_with = "ser_duration")]
    pub default_lease: Duration,
    /// The tools, sorted by name.
    pub tools: Vec<&'static ToolInfo>,
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

/// The report of every registered tool, with the built-in defaults (24h TTL, 30s lease).
pub fn report() -> Report {
    Report::new(tools(), DEFAULT_TTL, DEFAULT_LEASE)
}

/// The environment variable that makes any binary linking `#[idempotent]` tools write their
/// report: `IDEM_REPORT=tools.md` (Markdown) or `IDEM_REPORT=tools.json` (JSON), written when
/// the binary builds its first [`Idem`] runtime, with that runtime's defaults.
pub const REPORT_ENV: &str = "IDEM_REPORT";

/// Writes the report where [`REPORT_ENV`] says, once per process: with `idem`'s defaults when
/// a runtime is being built, else (a tool that needs no runtime ran first) with the built-in
/// ones. An error is told on stderr (the variable asked for the file) and the program goes on.
pub(crate) fn write_report_from_env(idem: Option<&Idem>) {
    static WRITTEN: std::sync::Once = std::sync::Once::new();
    if WRITTEN.is_completed() {
        return;
    }
    let Some(path) = std::env::var_os(REPORT_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    WRITTEN.call_once(|| {
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
            tools,
        }
    }

    /// The report as pretty JSON (stable: tools sorted, fields in a fixed order).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The report as a Markdown table.
    pub fn to_markdown(&self) -> String {
        let mut out = String::from("# Idempotent tools\n\n");
        out.push_str(&format!(
            "{} tool(s). Defaults: TTL {}, lease {}. Generated by `idem::registry::report()`.\n\n",
            self.tools.len(),
            format_duration(self.default_ttl),
            format_duration(self.default_lease)
        ));
        out.push_str(
            "| tool | form | key | TTL | lease | on error | on orphan | fingerprint skips | defined at |\n",
        );
        out.push_str("|---|---|---|---|---|---|---|---|---|\n");
        for t in &self.tools {
            let form = match (t.form, t.check) {
                (Form::Keyed, None) => "keyed (mutating)".to_owned(),
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
                    .map(|p| format!("`{p}`"))
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
            let (ttl, lease, on_error, on_orphan) = match t.form {
                Form::Keyed => (
                    dur(t.ttl, self.default_ttl),
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
                "| {name} | {form} | {key} | {ttl} | {lease} | {on_error} | {on_orphan} | {skip} | `{}::{}` ({}:{}) |\n",
                t.module, t.function, t.file, t.line
            ));
        }
        out
    }
}

impl Idem {
    /// The tool report with this runtime's defaults.
    pub fn report(&self) -> Report {
        Report::new(tools(), self.default_ttl(), self.default_lease())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    static A: ToolInfo = ToolInfo::new("payments.register", "register", "m", "f.rs", 1)
        .stable_name()
        .key(&["run_id", "step_id"], false)
        .ttl_ms(3_600_000);
    static B: ToolInfo = ToolInfo::new("payments.register", "register_v2", "m2", "g.rs", 9)
        .stable_name()
        .key(&["id"], true);
    static SHORT: ToolInfo = ToolInfo::new("short", "short", "m", "f.rs", 5)
        .key(&["id"], false)
        .ttl_ms(1_000)
        .lease_ms(5_000);
    static NATURAL: ToolInfo = ToolInfo::new("set_status", "set_status", "m", "f.rs", 7).natural();

    #[test]
    fn durations_are_written_as_the_attribute_takes_them() {
        assert_eq!(format_duration(Duration::from_secs(86_400)), "1d");
        assert_eq!(format_duration(Duration::from_secs(7_200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1_500)), "1500ms");
        assert_eq!(format_duration(Duration::ZERO), "0ms");
    }

    #[tokio::test]
    async fn the_audit_finds_collisions_short_ttls_and_unstable_names() {
        let idem = Idem::builder().build(crate::store::memory::MemoryStore::new());
        let audit = audit_tools(&idem, &[&A, &B, &SHORT, &NATURAL]).await;
        let text = audit.to_string();
        assert!(!audit.is_ok());
        assert_eq!(audit.errors().count(), 2, "{text}");
        assert!(
            text.contains("2 tools share the name `payments.register`"),
            "{text}"
        );
        assert!(
            text.contains("TTL 1s is shorter than the lease 5s"),
            "{text}"
        );
        assert!(
            text.contains("TTL 1h is shorter than the retry window 1d"),
            "{text}"
        );
        assert!(text.contains("renaming `short` would orphan"), "{text}");
        assert!(
            text.contains("memory store does not survive a restart"),
            "{text}"
        );
        assert!(
            !text.contains("set_status"),
            "natural tools have no TTL to audit: {text}"
        );
        assert_eq!(
            audit.findings[0].severity,
            Severity::Error,
            "errors come first"
        );
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
            md.contains("| `run_id`, `step_id` | 1h | 30s (default) | release |"),
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
}
