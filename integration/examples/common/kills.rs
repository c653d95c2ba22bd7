//! Kills a process gives itself, for the kill tests of the durable-run examples: at a named
//! point, with a chance, at most once per point. Included with
//! `#[path = "common/kills.rs"] mod kills;`.

use std::path::PathBuf;

/// Where and how often to kill: `CRASH_DIR` (a marker file per point that killed once) and
/// `CRASH_PERCENT` (the chance at each point). Without `CRASH_DIR`, never.
pub struct Kills {
    dir: Option<PathBuf>,
    percent: u32,
}

impl Kills {
    /// The settings from the environment.
    pub fn from_env() -> Kills {
        Kills {
            dir: std::env::var_os("CRASH_DIR").map(PathBuf::from),
            percent: std::env::var("CRASH_PERCENT")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0),
        }
    }

    /// Kills this process (SIGKILL) at `point` with the configured chance, unless `point`
    /// already killed once.
    pub fn maybe(&self, point: &str) {
        let Some(dir) = &self.dir else {
            return;
        };
        if (uuid::Uuid::new_v4().as_u128() % 100) as u32 >= self.percent {
            return;
        }
        let first_time = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(point))
            .is_ok();
        if !first_time {
            return;
        }
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        loop {
            std::thread::park();
        }
    }
}
