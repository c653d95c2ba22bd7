//! The options of a SQLite store and their URL form (`sqlite://PATH?synchronous=…`).

use std::path::PathBuf;
use std::time::Duration;

use idem_core::store::{blob, replay_cache};

/// How hard SQLite syncs a commit to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// Every commit is synced before it is answered or read: it survives a power loss (the
    /// default). The store syncs the WAL itself, as SQLite's `synchronous=FULL` would inside
    /// `COMMIT`, so that a batch of the group commit is applied while the last one syncs.
    Full,
    /// `synchronous=NORMAL`: a commit survives a crash of the process, not of the machine.
    Normal,
}

/// Options of a [`SqliteStore`](super::SqliteStore), usually taken from the URL.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The database file; created if missing.
    pub path: PathBuf,
    /// Commit durability.
    pub synchronous: Synchronous,
    /// How long to wait for another process's write lock before failing with a timeout.
    pub busy_timeout: Duration,
    /// The size of the in-memory cache of completed records for replays, in KiB (0: none).
    pub replay_cache: usize,
    /// Completed results longer than this many bytes are stored once per tenant, as blobs
    /// (`usize::MAX`: never).
    pub blob_threshold: usize,
}

impl SqliteOptions {
    /// Defaults for a file: `synchronous=FULL`, 5 s busy timeout.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteOptions {
            path: path.into(),
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            replay_cache: replay_cache::DEFAULT_CAPACITY,
            blob_threshold: blob::DEFAULT_THRESHOLD,
        }
    }

    /// Parses the part of a `sqlite://` URL after the scheme: `PATH[?option=value&…]`.
    pub fn from_url_rest(rest: &str) -> Result<Self, String> {
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(
                "the URL names no file: write `sqlite://PATH`, e.g. `sqlite://idem.db`".into(),
            );
        }
        let mut options = SqliteOptions::new(path);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match (name, value.to_ascii_lowercase().as_str()) {
                ("synchronous", "full") => options.synchronous = Synchronous::Full,
                ("synchronous", "normal") => options.synchronous = Synchronous::Normal,
                ("synchronous", _) => {
                    return Err(format!(
                        "`synchronous` must be `full` or `normal`, not `{value}`"
                    ));
                }
                ("replay_cache", _) => {
                    options.replay_cache = replay_cache::parse_capacity(value)?;
                }
                ("blob_threshold", _) => options.blob_threshold = blob::parse_threshold(value)?,
                ("busy_timeout_ms", v) => {
                    let ms: u64 = v.parse().map_err(|_| {
                        format!("`busy_timeout_ms` must be a whole number of milliseconds, not `{value}`")
                    })?;
                    options.busy_timeout = Duration::from_millis(ms);
                }
                _ => {
                    return Err(format!(
                        "unknown option `{name}`; known: `synchronous`, `busy_timeout_ms`, `replay_cache`, `blob_threshold`"
                    ));
                }
            }
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_are_parsed_and_checked() {
        let o = SqliteOptions::from_url_rest(
            "data/idem.db?synchronous=normal&busy_timeout_ms=250&blob_threshold=4096",
        )
        .unwrap();
        assert_eq!(o.blob_threshold, 4096);
        assert_eq!(o.path, PathBuf::from("data/idem.db"));
        assert_eq!(o.synchronous, Synchronous::Normal);
        assert_eq!(o.busy_timeout, Duration::from_millis(250));
        assert!(
            SqliteOptions::from_url_rest("")
                .unwrap_err()
                .contains("names no file")
        );
        assert!(
            SqliteOptions::from_url_rest("a.db?synchronous=off")
                .unwrap_err()
                .contains("`full` or `normal`")
        );
        assert!(
            SqliteOptions::from_url_rest("a.db?journal=x")
                .unwrap_err()
                .contains("unknown option `journal`")
        );
    }
}
