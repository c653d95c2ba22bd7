//! `idem`: look into an idem store and repair it. `cargo install idem-cli` installs the `idem`
//! binary (from a checkout: `cargo install --path idem-cli`); this library is its implementation.
//!
//! ```text
//! idem --store sqlite://idem.db doctor
//! idem stats
//! idem list --status unknown --older-than 1h
//! idem show --tenant tenant-a 3f2a9c01d4e5
//! idem resolve --tenant tenant-a 3f2a9c01d4e5 --release --reason "never reached the bank"
//! idem purge --dry-run
//! idem dlq list --tenant tenant-a
//! idem dlq ack --tenant tenant-a 9c0e4f1a2b3d
//! ```
//!
//! Every command works against any store URL (`--store`, or `IDEM_STORE_URL`), prints tables
//! for people and JSON with `--json`, and shows keys only as their short hash: a store keeps
//! the SHA-256 of each key, never the key, and no command prints even that digest whole.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod table;

use clap::{Parser, Subcommand, ValueEnum};
use idem_runtime::retry::{DEAD_LETTER_TOOL, DeadLetter};
use idem_runtime::store::admin::{self, AdminStore, Resolution};
use idem_runtime::store::{Fenced, Record, RecordStatus, UnixMillis};
use serde_json::json;

use crate::table::{Align, Table, printable};

#[derive(Parser)]
#[command(
    name = "idem",
    version,
    about = "Look into an idem store and repair it"
)]
struct Cli {
    /// The store: sqlite://PATH, postgres://…, redis://…
    #[arg(long, env = "IDEM_STORE_URL", global = true)]
    store: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check that the store answers, its schema, its durability and its clock.
    Doctor,
    /// Create or upgrade the schema (opening the store does it; this says what it found).
    Migrate,
    /// Count records by tenant, tool and status; oldest in flight, orphans, expired.
    Stats {
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// List records.
    List {
        #[command(flatten)]
        filter: Filter,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show one record, by tenant and key hash (or a prefix of it).
    Show {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// The key hash, as `list` prints it.
        key: String,
    },
    /// Resolve a blocked record (`unknown`, or `in_flight` with a lapsed lease).
    Resolve {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// The key hash, as `list` prints it.
        key: String,
        /// The effect happened: complete the record with this JSON value, which retries replay.
        #[arg(long, value_name = "JSON", conflicts_with = "release")]
        complete: Option<String>,
        /// The effect did not happen: delete the record, so the next call runs.
        #[arg(long)]
        release: bool,
        /// Why (kept with a completed record).
        #[arg(long)]
        reason: String,
    },
    /// The dead-letter queue: steps the retry executor gave up on.
    Dlq {
        #[command(subcommand)]
        command: Dlq,
    },
    /// Delete expired records in batches.
    Purge {
        /// Count what would be deleted, delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Records per batch.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
}

#[derive(Subcommand)]
enum Dlq {
    /// List the entries (of one tenant).
    List {
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Remove an entry once it is handled.
    Ack {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// The entry's id, as `idem dlq list` prints it.
        id: String,
    },
}

#[derive(clap::Args)]
struct Filter {
    /// Only this tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// Only this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Only this status.
    #[arg(long, value_enum)]
    status: Option<Status>,
    /// Only records created longer ago than this (`30s`, `5m`, `2h`, `1d`).
    #[arg(long, value_parser = parse_duration)]
    older_than: Option<Duration>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Status {
    InFlight,
    Completed,
    Unknown,
}

impl Status {
    fn matches(self, status: RecordStatus) -> bool {
        matches!(
            (self, status),
            (Status::InFlight, RecordStatus::InFlight)
                | (Status::Completed, RecordStatus::Completed)
                | (Status::Unknown, RecordStatus::Unknown)
        )
    }
}

impl Filter {
    fn matches(&self, r: &Record, now: UnixMillis) -> bool {
        self.tool.as_ref().is_none_or(|t| *t == r.tool)
            && self.status.is_none_or(|s| s.matches(r.status))
            && self
                .older_than
                .is_none_or(|d| r.created_at.saturating_add(millis(d)) <= now)
    }
}

/// A duration on the command line: `500ms`, `90s`, `15m`, `1h30m`, `2d`, `1w` (humantime's
/// forms); one that does not fit a `Duration` is an error, never a wrapped value.
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| {
        format!(
            "`{}` is not a duration ({e}); write it like 500ms, 90s, 15m, 1h30m or 2d",
            printable(text)
        )
    })
}

/// A failure the user can act on; printed as `idem: …`, exit code 2.
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

fn now() -> UnixMillis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs the `idem` command with the process's arguments; the binary's whole `main`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem: {}", printable(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(Failure(message)) => {
            eprintln!("idem: {}", printable(&message));
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let Some(url) = cli.store.as_deref() else {
        return Err(Failure(
            "no store: pass --store URL or set IDEM_STORE_URL (sqlite://PATH, postgres://…, redis://…)"
                .into(),
        ));
    };
    let store = admin::open(url).await?;
    let json = cli.json;
    match cli.command {
        Command::Doctor => doctor(&*store, json).await,
        Command::Migrate => migrate(&*store, json).await,
        Command::Stats { tenant } => stats(&store, tenant.as_deref(), json).await,
        Command::List { filter, limit } => list(&store, &filter, limit, json).await,
        Command::Show { tenant, key } => show(&store, &tenant, &key, json).await,
        Command::Resolve {
            tenant,
            key,
            complete,
            release,
            reason,
        } => {
            let resolution = match (complete, release) {
                (Some(value), false) => Some(value),
                (None, true) => None,
                _ => return Err(Failure("say --complete JSON or --release".into())),
            };
            resolve(&store, &tenant, &key, resolution, &reason, json).await
        }
        Command::Purge { dry_run, batch } => purge(&store, dry_run, batch, json).await,
        Command::Dlq {
            command: Dlq::List { tenant },
        } => dlq_list(&store, tenant.as_deref(), json).await,
        Command::Dlq {
            command: Dlq::Ack { tenant, id },
        } => dlq_ack(&store, &tenant, &id, json).await,
    }
}

async fn doctor(store: &dyn AdminStore, json: bool) -> Result<ExitCode, Failure> {
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
    if json {
        println!(
            "{}",
            json!({
                "backend": health.backend,
                "reachable": true,
                "schema_version": health.schema_version,
                "expected_schema_version": health.expected_schema_version,
                "durable": health.durable,
                "detail": health.detail,
                "encrypted": health.encrypted,
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
        match skew {
            Some(ms) => println!(
                "clock        {ms:+} ms against the server{}",
                if skew_ok { "" } else { "  ✗" }
            ),
            None => println!("clock        the caller's (embedded store)"),
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

async fn migrate(store: &dyn AdminStore, json: bool) -> Result<ExitCode, Failure> {
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

/// Every record (of `tenant`), walking the store page by page.
async fn every_record(
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

fn progress_bar(what: &'static str) -> indicatif::ProgressBar {
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
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn age(now: UnixMillis, then: UnixMillis) -> String {
    let secs = now.saturating_sub(then) / 1000;
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn status_of(r: &Record, now: UnixMillis) -> &'static str {
    match r.status {
        _ if r.expires_at <= now => "expired",
        RecordStatus::InFlight if r.lease_expires_at <= now => "orphaned",
        status => status.as_str(),
    }
}

async fn stats(
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

fn short_hash(r: &Record) -> String {
    r.key.short_hash().to_string()
}

fn record_json(r: &Record, now: UnixMillis, with_result: bool) -> serde_json::Value {
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

async fn list(
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

/// The one record of `tenant` whose key hash starts with `prefix`.
async fn find(store: &Arc<dyn AdminStore>, tenant: &str, prefix: &str) -> Result<Record, Failure> {
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

async fn show(
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

async fn resolve(
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

async fn purge(
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

async fn dlq_list(
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

async fn dlq_ack(
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
