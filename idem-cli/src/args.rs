//! The command line: the commands, their options and how durations are read.

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use idem_core::store::{Record, RecordStatus, UnixMillis};

use crate::shared::millis;
use crate::table::printable;

#[derive(Parser)]
#[command(
    name = "idem",
    version,
    about = "Look into an idem store and repair it"
)]
pub(crate) struct Cli {
    /// The store: sqlite://PATH, postgres://…, redis://…
    #[arg(long, env = "IDEM_STORE_URL", global = true)]
    pub(crate) store: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Check that the store answers, its schema, its durability and its clock.
    Doctor {
        /// A JSON tool report (`IDEM_REPORT=tools.json`): show each keyed tool's TTL beside
        /// the resume window of durable runs, a shorter one being a problem.
        #[arg(long, value_name = "REPORT.json")]
        tools: Option<std::path::PathBuf>,
    },
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
pub(crate) enum Dlq {
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
pub(crate) struct Filter {
    /// Only this tenant.
    #[arg(long)]
    pub(crate) tenant: Option<String>,
    /// Only this tool.
    #[arg(long)]
    pub(crate) tool: Option<String>,
    /// Only this status.
    #[arg(long, value_enum)]
    pub(crate) status: Option<Status>,
    /// Only records created longer ago than this (`30s`, `5m`, `2h`, `1d`).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) older_than: Option<Duration>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Status {
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
    pub(crate) fn matches(&self, r: &Record, now: UnixMillis) -> bool {
        self.tool.as_ref().is_none_or(|t| *t == r.tool)
            && self.status.is_none_or(|s| s.matches(r.status))
            && self
                .older_than
                .is_none_or(|d| r.created_at.saturating_add(millis(d)) <= now)
    }
}

/// A duration on the command line: `500ms`, `90s`, `15m`, `1h30m`, `2d`, `1w` (humantime's
/// forms); one that does not fit a `Duration` is an error, never a wrapped value.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| {
        format!(
            "`{}` is not a duration ({e}); write it like 500ms, 90s, 15m, 1h30m or 2d",
            printable(text)
        )
    })
}
