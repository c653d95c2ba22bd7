//! Form 1 of the three: a tool that is safe to repeat as it is.
//!
//! `set_status(entity, status)` writes a value; writing it twice leaves the same state as writing
//! it once, so it needs no key and no store: `#[idempotent(natural)]` registers it as such (the
//! audit and the tool report list it), and every call runs the body and answers `Fresh` without a
//! store round trip. Compare `register_payment` (form 2, a key) and `assign_shift` (form 3, a
//! state check).
//!
//! Run it with `cargo run --example set_status`. It exits non-zero if the state is wrong.

use std::collections::HashMap;
use std::sync::Mutex;

use idem::store::faulty::{Faults, FaultyStore};
use idem::store::memory::MemoryStore;
use idem::{Idem, idempotent};

/// The system of record: entity → status, and how many writes it received.
static STATUSES: Mutex<Option<(HashMap<String, String>, usize)>> = Mutex::new(None);

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("unknown status `{0}`")]
struct UnknownStatus(String);

/// Sets the status of an entity. Repeating it with the same arguments changes nothing.
#[idempotent(natural, name = "crm.set_status")]
async fn set_status(entity: String, status: String) -> Result<String, UnknownStatus> {
    if !["active", "paused", "closed"].contains(&status.as_str()) {
        return Err(UnknownStatus(status));
    }
    let mut guard = STATUSES.lock().expect("statuses");
    let (statuses, writes) = guard.get_or_insert_with(Default::default);
    statuses.insert(entity, status.clone());
    *writes += 1;
    Ok(status)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A natural tool never touches the store. To show it, give it a store that fails every
    // operation: a keyed tool would fail closed here, this one works.
    let always_down = FaultyStore::new(MemoryStore::new(), Faults::seeded(0).fail_before(1.0));
    let idem = Idem::with_store(always_down);
    let tenant = idem.scope("tenant-a");

    // The agent retries, as agents do: three identical calls.
    for attempt in 1..=3 {
        let out = tenant
            .run(set_status("crew-7".into(), "active".into()))
            .await?;
        println!(
            "attempt {attempt}: {}",
            serde_json::to_string(&out).expect("outcome as JSON")
        );
    }
    let guard = STATUSES.lock().expect("statuses");
    let (statuses, writes) = guard.as_ref().expect("written");
    println!(
        "{writes} writes, final state: crew-7 = {}",
        statuses["crew-7"]
    );
    let tool = idem::registry::tools()
        .into_iter()
        .find(|t| t.name == "crm.set_status")
        .expect("registered");
    println!(
        "registered as {:?}: no key, no store traffic (the store failed every operation)",
        tool.form
    );

    if *writes != 3 || statuses.len() != 1 || statuses["crew-7"] != "active" {
        eprintln!("wrong state: {statuses:?} after {writes} writes");
        std::process::exit(1);
    }
    println!("Repeating a natural tool is harmless: same state after 3 calls as after 1.");
    Ok(())
}
