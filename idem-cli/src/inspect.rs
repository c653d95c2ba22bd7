//! The commands that look: `doctor`, `migrate`, `stats`, `list`, `show`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use idem_core::store::admin::AdminStore;
use idem_core::store::{RecordStatus, UnixMillis};
use serde_json::json;

use crate::args::Filter;
use crate::shared::*;
use crate::table::{Align, Table, printable};

pub(crate) async fn doctor(
    store: &dyn AdminStore,
    tools: Option<&std::path::Path>,
    json: bool,
) -> Result<ExitCode, Failure> {
    let windows = tools.map(crate::windows::read).transpose()?;
    let health = store.health().await?;
    let skew = store
        .server_time()
        .await?
        .map(|server| server as i64 - now() as i64);
    let schema_ok = health.schema_version == health.expected_schema_version;
    let skew_ok = skew.is_none_or(|s| s.abs() <= 1000);
    let mut problems = Vec::new();
    if !schema_ok {
        problems.push(format!(
            "schema version {} found, this build writes {}: run `idem migrate`",
            health.schema_version, health.expected_schema_version
        ));
    }
    if !health.durable {
        problems.push(format!(
            "claims are not durable: {}",
            health
                .detail
                .clone()
                .unwrap_or_else(|| "see the store's settings".into())
        ));
    }
    if !skew_ok {
        problems.push(format!(
            "this machine's clock is {} ms off the server's: leases and TTLs are measured by callers' clocks",
            skew.unwrap_or(0)
        ));
    }
    if let Some(windows) = &windows {
        problems.extend(windows.problems.iter().cloned());
    }
    if json {
        println!(
            "{}",
            json!({
                "runs": windows.as_ref().map(|w| &w.json),
                "backend": health.backend,
                "reachable": true,
                "schema_version": health.schema_version,
                "expected_schema_version": health.expected_schema_version,
                "durable": health.durable,
                "detail": health.detail,
                "encrypted": health.encrypted,
                "fencing": health.fencing,
                "clock_skew_ms": skew,
                "problems": problems,
            })
        );
    } else {
        println!("store        {} (reachable)", health.backend);
        println!(
            "schema       version {} (this build: {}){}",
            health.schema_version,
            health.expected_schema_version,
            if schema_ok { "" } else { "  ✗" }
        );
        println!(
            "durability   {}",
            match (&health.durable, &health.detail) {
                (true, _) => "claims survive a crash".to_owned(),
                (false, Some(d)) => format!("NOT durable: {d}"),
                (false, None) => "NOT durable".to_owned(),
            }
        );
        match health.encrypted {
            Some(true) => println!("connection   encrypted (TLS)"),
            Some(false) => println!("connection   NOT encrypted (plain text)"),
            None => {}
        }
        if let Some(fencing) = &health.fencing {
            println!("fencing      {fencing}");
        }
        match skew {
            Some(ms) => println!(
                "clock        {ms:+} ms against the server{}",
                if skew_ok { "" } else { "  ✗" }
            ),
            None => println!("clock        the caller's (embedded store)"),
        }
        for line in windows.iter().flat_map(|w| &w.lines) {
            println!("{line}");
        }
        for p in &problems {
            println!("problem: {p}");
        }
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub(crate) async fn migrate(store: &dyn AdminStore, json: bool) -> Result<ExitCode, Failure> {
    let health = store.health().await?;
    if json {
        println!(
            "{}",
            json!({"backend": health.backend, "schema_version": health.schema_version})
        );
    } else {
        println!(
            "{}: schema version {} (created or upgraded on open)",
            health.backend, health.schema_version
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn stats(
    store: &Arc<dyn AdminStore>,
    tenant: Option<&str>,
    json: bool,
) -> Result<ExitCode, Failure> {
    let now = now();
    let mut counts: BTreeMap<(String, String, &'static str), u64> = BTreeMap::new();
    let (mut total, mut orphans, mut expired, mut unknown) = (0u64, 0u64, 0u64, 0u64);
    let mut oldest_in_flight: Option<UnixMillis> = None;
    every_record(store, tenant, |r| {
        let status = status_of(&r, now);
        total += 1;
        match status {
            "orphaned" => orphans += 1,
            "expired" => expired += 1,
            "unknown" => unknown += 1,
            _ => {}
        }
        if r.status == RecordStatus::InFlight && r.expires_at > now {
            oldest_in_flight = Some(oldest_in_flight.map_or(r.created_at, |o| o.min(r.created_at)));
        }
        *counts.entry((r.tenant, r.tool, status)).or_default() += 1;
        true
    })
    .await?;
    if json {
        let rows: Vec<_> = counts
            .iter()
            .map(|((t, tool, s), n)| json!({"tenant": t, "tool": tool, "status": s, "count": n}))
            .collect();
        println!(
            "{}",
            json!({
                "records": total,
                "orphaned": orphans,
                "unknown": unknown,
                "expired_awaiting_purge": expired,
                "oldest_in_flight_age_ms": oldest_in_flight.map(|t| now.saturating_sub(t)),
                "by_tenant_tool_status": rows,
            })
        );
    } else {
        let mut table = Table::new(&[
            ("tenant", Align::Left),
            ("tool", Align::Left),
            ("status", Align::Left),
            ("records", Align::Right),
        ]);
        for ((t, tool, status), n) in &counts {
            table.row([t.as_str(), tool.as_str(), status, &n.to_string()]);
        }
        print!("{}", table.render());
        println!();
        println!(
            "{total} record(s): {unknown} unknown, {orphans} orphaned (lapsed lease), {expired} expired awaiting purge"
        );
        match oldest_in_flight {
            Some(t) => println!("oldest in flight: {} old", age(now, t)),
            None => println!("nothing in flight"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn list(
    store: &Arc<dyn AdminStore>,
    filter: &Filter,
    limit: usize,
    json: bool,
) -> Result<ExitCode, Failure> {
    let now = now();
    let mut found = Vec::new();
    every_record(store, filter.tenant.as_deref(), |r| {
        if filter.matches(&r, now) {
            found.push(r);
        }
        found.len() < limit
    })
    .await?;
    if json {
        let rows: Vec<_> = found.iter().map(|r| record_json(r, now, false)).collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        let mut table = Table::new(&[
            ("tenant", Align::Left),
            ("tool", Align::Left),
            ("key", Align::Left),
            ("status", Align::Left),
            ("age", Align::Right),
            ("note", Align::Left),
        ]);
        for r in &found {
            table.row([
                r.tenant.as_str(),
                r.tool.as_str(),
                &short_hash(r),
                status_of(r, now),
                &age(now, r.created_at),
                r.note.as_deref().unwrap_or(""),
            ]);
        }
        print!("{}", table.render());
        println!("{} record(s)", found.len());
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn show(
    store: &Arc<dyn AdminStore>,
    tenant: &str,
    key: &str,
    json: bool,
) -> Result<ExitCode, Failure> {
    let r = find(store, tenant, key).await?;
    let now = now();
    let value = record_json(&r, now, true);
    if json {
        println!("{value}");
    } else {
        println!("tenant       {}", printable(&r.tenant));
        println!("tool         {}", printable(r.tool.as_str()));
        println!("key          {} (short hash)", short_hash(&r));
        println!("status       {}", status_of(&r, now));
        println!("created      {} ago", age(now, r.created_at));
        if r.expires_at > now {
            println!("expires in   {}", age(r.expires_at, now));
        }
        if r.status == RecordStatus::InFlight && r.lease_expires_at > now {
            println!("lease ends   in {}", age(r.lease_expires_at, now));
        }
        if let Some(note) = &r.note {
            println!("note         {}", printable(note));
        }
        if !value["result"].is_null() {
            println!("result       {}", value["result"]);
        }
    }
    Ok(ExitCode::SUCCESS)
}
