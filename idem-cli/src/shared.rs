//! What the commands share: the failure a user can act on, the clock, walking a store's records,
//! and how a record is shown (its short hash, its age, its status, as JSON).

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::store::admin::AdminStore;
use idem_core::store::{Record, RecordStatus, UnixMillis};
use serde_json::json;

/// A failure the user can act on; printed as `idem: …`, exit code 2.
pub(crate) struct Failure(pub(crate) String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

pub(crate) fn now() -> UnixMillis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Every record (of `tenant`), walking the store page by page.
pub(crate) async fn every_record(
    store: &Arc<dyn AdminStore>,
    tenant: Option<&str>,
    mut visit: impl FnMut(Record) -> bool,
) -> Result<(), Failure> {
    let progress = progress_bar("scanning");
    let mut cursor: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    loop {
        let page = store.scan(tenant, cursor.as_deref(), 1000).await?;
        for record in page.records {
            progress.inc(1);
            // SCAN (Redis) may return a record twice.
            if seen.insert((record.tenant.clone(), *record.key.as_bytes())) && !visit(record) {
                progress.finish_and_clear();
                return Ok(());
            }
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    progress.finish_and_clear();
    Ok(())
}

pub(crate) fn progress_bar(what: &'static str) -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(what);
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// `d` in milliseconds, saturating: a duration past the year 500 million is "forever".
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn age(now: UnixMillis, then: UnixMillis) -> String {
    let secs = now.saturating_sub(then) / 1000;
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

pub(crate) fn status_of(r: &Record, now: UnixMillis) -> &'static str {
    match r.status {
        _ if r.expires_at <= now => "expired",
        RecordStatus::InFlight if r.lease_expires_at <= now => "orphaned",
        status => status.as_str(),
    }
}

pub(crate) fn short_hash(r: &Record) -> String {
    r.key.short_hash().to_string()
}

pub(crate) fn record_json(r: &Record, now: UnixMillis, with_result: bool) -> serde_json::Value {
    let mut value = json!({
        "tenant": r.tenant,
        "tool": r.tool,
        "key": short_hash(r),
        "status": status_of(r, now),
        "created_at_ms": r.created_at,
        "expires_at_ms": r.expires_at,
        "lease_expires_at_ms": r.lease_expires_at,
        "note": r.note,
    });
    if with_result {
        value["result"] = match r
            .result
            .as_deref()
            .map(serde_json::from_slice::<serde_json::Value>)
        {
            Some(Ok(v)) => v,
            Some(Err(_)) => json!({"bytes": r.result.as_ref().map_or(0, Vec::len)}),
            None => serde_json::Value::Null,
        };
    }
    value
}

/// The one record of `tenant` whose key hash starts with `prefix`.
pub(crate) async fn find(
    store: &Arc<dyn AdminStore>,
    tenant: &str,
    prefix: &str,
) -> Result<Record, Failure> {
    let prefix = prefix.to_ascii_lowercase();
    if prefix.len() < 6 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Failure(
            "a key hash is hexadecimal, at least 6 digits, as `idem list` prints it".into(),
        ));
    }
    let mut found = Vec::new();
    every_record(store, Some(tenant), |r| {
        if short_hash(&r).starts_with(&prefix) {
            found.push(r);
        }
        found.len() < 2
    })
    .await?;
    match found.len() {
        0 => Err(Failure(format!(
            "no record of tenant `{tenant}` has the key hash {prefix}"
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(Failure(format!(
            "several records match {prefix}: give more digits"
        ))),
    }
}
