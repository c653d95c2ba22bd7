//! `idem doctor --tools REPORT.json`: each keyed tool's TTL beside the resume window of durable
//! runs, read from the JSON tool report a binary writes (`IDEM_REPORT=tools.json`).

use std::path::Path;

use serde_json::Value;

use crate::shared::Failure;
use crate::table::printable;

/// What the report says of the tools' TTLs: lines to print, problems, and the JSON to show.
pub(crate) struct Windows {
    pub(crate) lines: Vec<String>,
    pub(crate) problems: Vec<String>,
    pub(crate) json: Value,
}

/// Reads the report at `path` (written by `IDEM_REPORT=…json` or `Report::write`).
pub(crate) fn read(path: &Path) -> Result<Windows, Failure> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure(format!("cannot read the tool report {shown}: {e}")))?;
    let report: Value = serde_json::from_str(&text).map_err(|e| {
        Failure(format!(
            "{shown} is not a JSON tool report ({e}); write one with IDEM_REPORT=tools.json"
        ))
    })?;
    let (Some(tools), Some(checks)) = (
        report.get("tools").and_then(Value::as_array),
        report.get("resume_checks").and_then(Value::as_array),
    ) else {
        return Err(Failure(format!(
            "{shown} is not a tool report of this version (no `tools` or `resume_checks`): \
             write it again with IDEM_REPORT=tools.json"
        )));
    };
    fn text_of(v: &Value, field: &str) -> Option<String> {
        v.get(field)
            .and_then(Value::as_str)
            .map(|s| printable(s).into_owned())
    }
    let Some(window) = text_of(&report, "resume_window") else {
        return Ok(Windows {
            lines: vec![format!(
                "runs         no resume window declared ({} tool(s) in the report)",
                tools.len()
            )],
            problems: Vec::new(),
            json: serde_json::json!({"resume_window": null, "tools": []}),
        });
    };
    let needed = text_of(&report, "needed_ttl").unwrap_or_default();
    let mut lines = vec![format!(
        "runs         resume for up to {window}: keys must live {needed} (window + retry window)"
    )];
    let mut problems = Vec::new();
    for check in checks {
        let tool = text_of(check, "tool").unwrap_or_default();
        let ttl = text_of(check, "ttl").unwrap_or_default();
        let enough = check.get("enough").and_then(Value::as_bool) == Some(true);
        let accepted = check.get("accepted").and_then(Value::as_bool) == Some(true);
        let verdict = match (enough, accepted) {
            (true, _) => "✓".to_owned(),
            (false, true) => "✗ accepted (accept_short_ttl)".to_owned(),
            (false, false) => {
                problems.push(format!(
                    "tool `{tool}`: TTL {ttl} is shorter than {needed}: a run resumed after \
                     {ttl} runs its body again; declare `ttl = \"{needed}\"` on it"
                ));
                "✗".to_owned()
            }
        };
        lines.push(format!("  {tool:<30} TTL {ttl:<8} {verdict}"));
    }
    let json = serde_json::json!({
        "resume_window": window,
        "needed_ttl": needed,
        "tools": checks,
    });
    Ok(Windows {
        lines,
        problems,
        json,
    })
}
