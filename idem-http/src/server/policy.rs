//! The policy a layer publishes (draft -07 §2.5.2: a resource must publish its expiration
//! policy), written from its settings so that it says what the layer does.

use std::fmt::Write as _;
use std::time::Duration;

use http::{Method, StatusCode};

use super::config::Config;
use super::error_body::ErrorBody;
use super::problem::Problem;

/// A duration as a person reads it: `30 min`, `24 h`, `90 s`, `250 ms`.
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0 s".to_owned(),
        _ if ms.is_multiple_of(3_600_000) => format!("{} h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{} min", ms / 60_000),
        _ if ms.is_multiple_of(1_000) => format!("{} s", ms / 1_000),
        _ => format!("{ms} ms"),
    }
}

/// The statuses `stores` does not keep, as a list with ranges (`400, 401, 403, 500-599`).
fn released(stores: fn(StatusCode) -> bool) -> Vec<String> {
    let codes: Vec<u16> = (100..=599)
        .filter(|&c| StatusCode::from_u16(c).is_ok_and(|s| !stores(s)))
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < codes.len() {
        let mut j = i;
        while j + 1 < codes.len() && codes[j + 1] == codes[j] + 1 {
            j += 1;
        }
        out.push(match j - i {
            0 => codes[i].to_string(),
            1 => format!("{}, {}", codes[i], codes[j]),
            _ => format!("{}-{}", codes[i], codes[j]),
        });
        i = j + 1;
    }
    out
}

impl Config {
    /// The policy this layer applies, in Markdown, generated from its settings (draft
    /// -07 §2.5.2 asks a resource to publish it).
    pub(super) fn policy(&self) -> String {
        let methods: Vec<&str> = self.methods.iter().map(Method::as_str).collect();
        let ttl = self.ttl.unwrap_or(self.idem.default_ttl());
        let lease = self.lease.unwrap_or(self.idem.default_lease());
        let wait = self.wait();
        let mut out = String::from("# Idempotency policy\n\n");
        let routes = if self.enforced.is_some() {
            " on the routes this service guards (other routes pass through without a key)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "- Requests: {}{routes} {}carry an `Idempotency-Key` header.",
            methods.join(", "),
            if self.required { "must " } else { "may " }
        );
        let _ = writeln!(
            out,
            "- Key: 1 to 255 visible ASCII characters, as a structured-field String (`\"…\"`){}. \
             One header, not empty. Otherwise: 400.",
            if self.lenient { " or bare" } else { "" }
        );
        out.push_str(match (self.default_principal, self.shared_anonymous) {
            (true, false) => {
                "- Scope: keys belong to the caller, told apart by its `Authorization` \
                 credentials; two callers never share a key. A request with a key and no \
                 credentials: 400 (`unidentified-caller`).\n"
            }
            (true, true) => {
                "- Scope: keys belong to the caller, told apart by its `Authorization` \
                 credentials; callers without credentials share one scope, and may see each \
                 other's responses for the same key.\n"
            }
            (false, false) => {
                "- Scope: keys belong to the caller as this service identifies it; two callers \
                 never share a key. A request with a key whose caller it cannot identify: 400 \
                 (`unidentified-caller`).\n"
            }
            (false, true) => {
                "- Scope: keys belong to the caller as this service identifies it; callers it \
                 cannot identify share one scope, and may see each other's responses for the \
                 same key.\n"
            }
        });
        out.push_str(
            "- Fingerprint: method, path, query (its name-value pairs, decoded and sorted) and \
             body (JSON canonicalized per RFC 8785, form fields sorted, other bodies as bytes)",
        );
        if self.skip.is_empty() {
            out.push_str(". ");
        } else {
            let fields: Vec<String> = self.skip.iter().map(|p| p.join(".")).collect();
            let _ = write!(out, ", without the fields {}. ", fields.join(", "));
        }
        out.push_str("The same key with another fingerprint: 422.\n");
        if wait.is_zero() {
            let _ = writeln!(
                out,
                "- While the first request runs: 409 with `Retry-After: 1` (retry soon, with the \
                 same key; a request holds its key for up to {}).",
                human(lease)
            );
        } else {
            let _ = writeln!(
                out,
                "- While the first request runs: a request with its key waits up to {} for it \
                 and receives its response; past that, 409 with `Retry-After: 1` (retry soon, \
                 with the same key; a request holds its key for up to {}).",
                human(wait),
                human(lease)
            );
        }
        let released = released(self.stores);
        let _ = writeln!(
            out,
            "- After it: its status, headers and body, replayed with `Idempotent-Replayed: true`, \
             errors included, for {}.{}",
            human(ttl),
            if released.is_empty() {
                String::new()
            } else {
                format!(
                    " Responses {} are not kept: a corrected retry runs.",
                    released.join(", ")
                )
            }
        );
        out.push_str(
            "- Streamed responses (`text/event-stream`, or a chunked body): each frame is \
             recorded before it is sent. A request with the key of a response still being \
             streamed receives its status, headers and frames so far, then the rest as they \
             come; one that comes after it, the whole stream again. A stream that broke off is \
             cut short, never ended as if complete.\n",
        );
        out.push_str(
            "- Unknown outcome: when the service ran a request but could not finish its \
             response (its body failed), the key is blocked, and every request with it gets 423 \
             (`outcome-unknown`): retrying cannot settle it; ask the service's operator.",
        );
        if self.rerun_orphans {
            out.push_str(
                " A request whose server stopped before it answered runs again with the next \
                 retry once its hold lapses.\n",
            );
        } else {
            out.push_str(
                " So is the key of a request whose server stopped before it answered, once its \
                 hold lapses: it is never run twice.\n",
            );
        }
        let errors = match self.errors {
            ErrorBody::Problem => {
                "`application/problem+json` (RFC 9457), each `type` a section of this document"
            }
            ErrorBody::Stripe => {
                "Stripe's error envelope (`application/json`, `{\"error\": {\"type\": …, \"message\": …}}`)"
            }
            ErrorBody::Custom(_) => "in this service's own error format",
        };
        let _ = writeln!(
            out,
            "- Request bodies over {} bytes: 413. Errors are {errors}.",
            self.max_body
        );
        out.push_str("\n## Errors\n");
        for problem in Problem::ALL {
            let status = match self.errors {
                ErrorBody::Problem => Some(problem.status()),
                ErrorBody::Stripe => Some(problem.stripe().0),
                ErrorBody::Custom(_) => None,
            };
            let _ = write!(out, "\n### {}\n\n", problem.code());
            if let Some(status) = status {
                let _ = write!(out, "{}: ", status.as_u16());
            }
            let _ = writeln!(out, "{}.", problem.title());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{human, released};
    use crate::server::config::default_stores;

    #[test]
    fn durations_and_statuses_read_as_written() {
        assert_eq!(human(Duration::from_secs(30 * 60)), "30 min");
        assert_eq!(human(Duration::from_secs(24 * 3600)), "24 h");
        assert_eq!(human(Duration::from_secs(90)), "90 s");
        assert_eq!(human(Duration::from_millis(1500)), "1500 ms");
        assert_eq!(
            released(default_stores),
            ["400, 401", "403-405", "409", "413", "415", "422", "429"]
        );
        assert_eq!(released(|s| s.is_success()), ["100-199", "300-599"]);
        assert!(released(|_| true).is_empty());
    }
}
