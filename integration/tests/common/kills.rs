//! Killing a worker process at random moments: the loop the kill tests share.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// Starts `child` (given its phase file) `cycles` times and kills each with SIGKILL after a
/// random delay of `base_ms` plus up to `spread_ms`; then a last child, never killed, finishes
/// what is left. Answers how many kills landed after each phase (the last mark in the child's
/// phase file; `-` before the first).
pub fn kill_cycles(
    dir: &Path,
    cycles: u32,
    seed: u64,
    (base_ms, spread_ms): (u64, u64),
    child: impl Fn(&Path) -> std::process::Child,
) -> HashMap<char, usize> {
    let mut kills: HashMap<char, usize> = HashMap::new();
    let mut seed = seed ^ u64::from(cycles);
    let mut random = |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    for cycle in 0..cycles {
        let phases = dir.join(format!("phases-{cycle}"));
        let mut running = child(&phases);
        std::thread::sleep(Duration::from_millis(base_ms + random(spread_ms)));
        let killed = running.try_wait().unwrap().is_none();
        running.kill().ok();
        let status = running.wait().unwrap();
        if killed {
            let text = std::fs::read_to_string(&phases).unwrap_or_default();
            let last = text
                .lines()
                .last()
                .and_then(|l| l.chars().next())
                .unwrap_or('-');
            *kills.entry(last).or_default() += 1;
        } else {
            assert!(status.success(), "an unkilled child failed");
        }
    }
    let phases = dir.join("phases-final");
    let last = child(&phases).wait_with_output().unwrap();
    assert!(
        last.status.success(),
        "{}",
        String::from_utf8_lossy(&last.stderr)
    );
    kills
}
