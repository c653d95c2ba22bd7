//! Form 3 of the three: a tool whose own state says whether it already happened.
//!
//! The seeds' `assign_shift(crewmate, shift)` has no natural key: the roster itself knows whether
//! the crewmate is already on the shift. `#[idempotent(mutating, check = already_assigned)]` asks
//! that question before every call: the first call assigns (`Fresh`), a retry answers
//! `{ ok: true, already_assigned: true }` (`Replayed`) without touching the roster again.
//! Compare `set_status` (form 1, natural) and `register_payment` (form 2, a key).
//!
//! Run it with `cargo run --example assign_shift`. It exits non-zero if the roster is wrong.

use std::collections::BTreeSet;
use std::sync::Mutex;

use idem::idempotent;
use serde::{Deserialize, Serialize};

/// The roster: (crewmate, shift) assignments, and how many writes it received.
static ROSTER: Mutex<(BTreeSet<(String, String)>, usize)> = Mutex::new((BTreeSet::new(), 0));

/// What the tool answers the model.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Assigned {
    ok: bool,
    already_assigned: bool,
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("the roster is unreachable")]
struct RosterDown;

/// The state check: is the crewmate already on this shift?
async fn already_assigned(crewmate: &str, shift: &str) -> Result<Option<Assigned>, RosterDown> {
    let roster = ROSTER.lock().map_err(|_| RosterDown)?;
    let found = roster.0.contains(&(crewmate.to_owned(), shift.to_owned()));
    Ok(found.then_some(Assigned {
        ok: true,
        already_assigned: true,
    }))
}

/// Puts a crewmate on a shift.
#[idempotent(mutating, check = already_assigned, name = "crew.assign_shift")]
async fn assign_shift(crewmate: String, shift: String) -> Result<Assigned, RosterDown> {
    let mut roster = ROSTER.lock().map_err(|_| RosterDown)?;
    roster.0.insert((crewmate, shift));
    roster.1 += 1;
    Ok(Assigned {
        ok: true,
        already_assigned: false,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The agent retries, as agents do: three identical calls. No store is needed: the roster is
    // the state.
    for attempt in 1..=3 {
        let out = assign_shift("ana".into(), "night".into()).await?;
        println!(
            "attempt {attempt}: {}",
            serde_json::to_string(&out).expect("outcome as JSON")
        );
    }
    let (assignments, writes) = ROSTER.lock().expect("roster").clone();
    println!("{writes} write(s) to the roster: {assignments:?}");
    if writes != 1 || assignments.len() != 1 {
        eprintln!("the roster was written {writes} times");
        std::process::exit(1);
    }
    println!("Retrying is a fact; assigning twice is not.");
    Ok(())
}
