//! The startup audit: the registered tools checked against a runtime.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use super::tool::{Form, ToolInfo, format_duration, tools};
use crate::runtime::Idem;

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
/// a TTL shorter than the resume window of durable runs plus the retry window (unless accepted,
/// then a warning: [`IdemBuilder::accept_short_ttl`](crate::IdemBuilder::accept_short_ttl)),
/// a transactional tool on a store other than Postgres, an unreachable store or a schema other than this build's. Warnings: a TTL shorter than the
/// retry window, a keyed tool without a stable `name`, a store that does not survive restarts.
///
/// With [`IDEM_REPORT`](super::report::REPORT_ENV) set, it also writes the tool report (once per
/// process), with `idem`'s defaults.
pub async fn audit(idem: &Idem) -> Audit {
    super::report::write_report_from_env(Some(idem));
    audit_tools(idem, &tools()).await
}

/// Whether `idem`'s store can run transactional tools.
fn can_transact(idem: &Idem) -> bool {
    #[cfg(feature = "postgres")]
    return idem.store().postgres().is_some();
    #[cfg(not(feature = "postgres"))]
    {
        let _ = idem;
        false
    }
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
        } else if let Some(needed) = idem.needed_ttl().filter(|needed| ttl < *needed) {
            findings.push(resume_finding(idem, tool, ttl, needed));
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
        if tool.transactional && !can_transact(idem) {
            findings.push(Finding {
                severity: Severity::Error,
                tool: Some(tool.name),
                message: format!(
                    "transactional: its writes and its record commit in one transaction on the \
                     store's database, which needs the Postgres store (`postgres://…`, feature \
                     `postgres`); this runtime's store is `{}`",
                    idem.store().backend()
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
    for accepted in idem.accepted_short_ttls() {
        if !tools.iter().any(|t| t.name == accepted.as_str()) {
            findings.push(Finding {
                severity: Severity::Warning,
                tool: None,
                message: format!(
                    "`accept_short_ttl(\"{accepted}\")` names no registered tool; check the \
                     tool's stable name"
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

/// The finding of a keyed tool whose TTL is shorter than the runtime's resume window plus its
/// retry window: an error, or a warning (logged) when the runtime accepts the risk for it.
fn resume_finding(idem: &Idem, tool: &ToolInfo, ttl: Duration, needed: Duration) -> Finding {
    let resume = idem.resume_window().unwrap_or_default();
    let window = format!(
        "the resume window {} + the retry window {}",
        format_duration(resume),
        format_duration(idem.retry_window())
    );
    if idem.accepts_short_ttl(tool.name) {
        tracing::warn!(
            tool = tool.name,
            ttl = %format_duration(ttl),
            needed = %format_duration(needed),
            "idem: accepted risk: the tool's keys may expire before its durable runs are resumed"
        );
        return Finding {
            severity: Severity::Warning,
            tool: Some(tool.name),
            message: format!(
                "TTL {} is shorter than {window}, accepted (`accept_short_ttl`): a run resumed \
                 after {} runs its body again",
                format_duration(ttl),
                format_duration(ttl)
            ),
        };
    }
    Finding {
        severity: Severity::Error,
        tool: Some(tool.name),
        message: format!(
            "TTL {} is shorter than {window}: a durable run resumed after {} would find the key \
             purged and run the body again. Declare `ttl = \"{}\"` (or more) on the tool, \
             shorten the resume window, or accept the risk with \
             `Idem::builder().accept_short_ttl(\"{}\")`",
            format_duration(ttl),
            format_duration(ttl),
            format_duration(needed),
            tool.name
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::Severity;
    use super::audit_tools;
    use crate::registry::tool::tests::{A, B, NATURAL, SHORT};
    use crate::runtime::Idem;

    #[tokio::test]
    async fn the_audit_finds_collisions_short_ttls_and_unstable_names() {
        let idem = Idem::builder().build(idem_core::store::memory::MemoryStore::new());
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
}
