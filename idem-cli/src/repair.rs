//! The commands that change the store: `resolve`, `purge`, and the dead-letter queue's `dlq list`
//! and `dlq ack`.

use std::process::ExitCode;
use std::sync::Arc;

use idem_core::store::Fenced;
use idem_core::store::admin::{self, AdminStore, Resolution};
use idem_runtime::retry::{DEAD_LETTER_TOOL, DeadLetter};
use serde_json::json;

use crate::shared::*;
use crate::table::{Align, Table, printable};

pub(crate) async fn resolve(
    store: &Arc<dyn AdminStore>,
    tenant: &str,
    key: &str,
    complete: Option<String>,
    reason: &str,
    json: bool,
) -> Result<ExitCode, Failure> {
    if reason.trim().is_empty() {
        return Err(Failure("--reason must say why".into()));
    }
    let record = find(store, tenant, key).await?;
    let now = now();
    if !admin::is_blocked(&record, now) {
        return Err(Failure(format!(
            "the record {} is {}: only unknown records and orphans (lapsed leases) are resolved",
            short_hash(&record),
            status_of(&record, now)
        )));
    }
    let encoded = match &complete {
        Some(_) if record.tool == "http" => {
            return Err(Failure(
                "an HTTP response cannot be made up here: use --release".into(),
            ));
        }
        Some(text) => {
            let value: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| Failure(format!("--complete takes the tool's value as JSON: {e}")))?;
            Some(serde_json::to_vec(&json!({ "ok": value }))?)
        }
        None => None,
    };
    let resolution = match &encoded {
        Some(bytes) => Resolution::Complete { result: bytes },
        None => Resolution::Release,
    };
    let outcome = store
        .resolve(&record.tenant, record.key, resolution, reason, now)
        .await?;
    let what = if encoded.is_some() {
        "completed"
    } else {
        "released"
    };
    match outcome {
        Fenced::Applied => {
            if json {
                println!(
                    "{}",
                    json!({"key": short_hash(&record), "resolved": what, "reason": reason})
                );
            } else {
                println!("{} {what}: {}", short_hash(&record), printable(reason));
            }
            Ok(ExitCode::SUCCESS)
        }
        Fenced::Lost => Err(Failure(format!(
            "the record {} changed meanwhile (a call completed or took it over); nothing was changed",
            short_hash(&record)
        ))),
    }
}

pub(crate) async fn purge(
    store: &Arc<dyn AdminStore>,
    dry_run: bool,
    batch: usize,
    json: bool,
) -> Result<ExitCode, Failure> {
    let now = now();
    let deleted = if dry_run {
        let mut expired = 0u64;
        every_record(store, None, |r| {
            expired += u64::from(r.expires_at <= now);
            true
        })
        .await?;
        expired
    } else {
        let progress = progress_bar("purging");
        let mut deleted = 0u64;
        loop {
            let n = store.purge_expired(now, batch.max(1)).await?;
            deleted += n as u64;
            progress.inc(n as u64);
            if n < batch.max(1) {
                break;
            }
        }
        progress.finish_and_clear();
        deleted
    };
    let verb = if dry_run { "would delete" } else { "deleted" };
    if json {
        println!("{}", json!({"dry_run": dry_run, "expired": deleted}));
    } else if store.expires_on_its_own() && !dry_run {
        println!(
            "{}: records expire on their own; nothing to purge",
            store.backend()
        );
    } else {
        println!("{verb} {deleted} expired record(s)");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn dlq_list(
    store: &Arc<dyn AdminStore>,
    tenant: Option<&str>,
    json: bool,
) -> Result<ExitCode, Failure> {
    let mut letters: Vec<DeadLetter> = Vec::new();
    every_record(store, tenant, |r| {
        if r.tool == DEAD_LETTER_TOOL
            && let Some(letter) = r
                .result
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
        {
            letters.push(letter);
        }
        true
    })
    .await?;
    letters.sort_by(|a, b| (a.at, &a.id).cmp(&(b.at, &b.id)));
    if json {
        println!("{}", serde_json::to_string(&letters)?);
    } else {
        let now = now();
        let mut table = Table::new(&[
            ("id", Align::Left),
            ("tenant", Align::Left),
            ("tool", Align::Left),
            ("key", Align::Left),
            ("reason", Align::Left),
            ("attempts", Align::Right),
            ("age", Align::Right),
        ]);
        for l in &letters {
            table.row([
                l.id.as_str(),
                l.tenant.as_str(),
                l.tool.as_str(),
                l.key.as_str(),
                l.reason.as_str(),
                &l.attempts.to_string(),
                &age(now, l.at),
            ]);
        }
        print!("{}", table.render());
        println!("{} dead letter(s)", letters.len());
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn dlq_ack(
    store: &Arc<dyn AdminStore>,
    tenant: &str,
    id: &str,
    json: bool,
) -> Result<ExitCode, Failure> {
    let record = find(store, tenant, id).await?;
    if record.tool != DEAD_LETTER_TOOL {
        return Err(Failure(format!("{id} is not a dead-letter entry")));
    }
    store.delete(&record.tenant, record.key).await?;
    if json {
        println!("{}", json!({"acknowledged": short_hash(&record)}));
    } else {
        println!("{} acknowledged", short_hash(&record));
    }
    Ok(ExitCode::SUCCESS)
}
