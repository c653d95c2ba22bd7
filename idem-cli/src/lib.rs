//! `idem`: look into an idem store and repair it. `cargo install idem-cli` installs the `idem`
//! binary (from a checkout: `cargo install --path idem-cli`); this library is its implementation.
//!
//! ```text
//! idem --store sqlite://idem.db doctor
//! idem doctor --tools tools.json
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

mod args;
mod inspect;
mod repair;
mod shared;
mod table;
mod windows;

use std::process::ExitCode;

use clap::Parser;
use idem_core::store::admin;
// The backends register their URL schemes when they are linked: naming them makes sure they are.
use idem_postgres as _;
use idem_redis as _;
use idem_sqlite as _;

use crate::args::{Cli, Command, Dlq};
use crate::inspect::{doctor, list, migrate, show, stats};
use crate::repair::{dlq_ack, dlq_list, purge, resolve};
use crate::shared::Failure;
use crate::table::printable;

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
        Command::Doctor { tools } => doctor(&*store, tools.as_deref(), json).await,
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
