//! The options of a Redis store and their URL form (`redis://…?prefix=…&timeout_ms=…`).

use std::time::Duration;

use crate::store::replay_cache::{self};

/// Options of a [`RedisStore`](super::RedisStore), usually taken from the URL.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    pub(super) connection: String,
    /// Prepended to every key (`PREFIX:{TENANT}:KEY`, `PREFIX:meta`).
    pub prefix: String,
    /// Connect and response timeout.
    pub timeout: Duration,
    /// How many completed records to keep in memory for replays (0: none).
    pub replay_cache: usize,
}

impl RedisOptions {
    /// Parses a `redis://` URL.
    pub fn from_url(url: &str) -> Result<Self, String> {
        if url.to_ascii_lowercase().starts_with("rediss://") {
            return Err("TLS (`rediss://`) is not supported by this build".into());
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut options = RedisOptions {
            connection: base.to_owned(),
            prefix: "idem".into(),
            timeout: Duration::from_secs(5),
            replay_cache: replay_cache::DEFAULT_CAPACITY,
        };
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "prefix" => {
                    let ok = !value.is_empty()
                        && value.len() <= 64
                        && value
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                    if !ok {
                        return Err(format!(
                            "`prefix` must be 1 to 64 letters, digits, `_`, `-` or `.`, not `{value}`"
                        ));
                    }
                    options.prefix = value.to_owned();
                }
                "timeout_ms" => {
                    let ms: u64 = value.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                        format!(
                            "`timeout_ms` must be a positive number of milliseconds, not `{value}`"
                        )
                    })?;
                    options.timeout = Duration::from_millis(ms);
                }
                "replay_cache" => {
                    options.replay_cache = replay_cache::parse_capacity(value)?;
                }
                "protocol" => passed_on.push(pair),
                _ => {
                    return Err(format!(
                        "unknown option `{name}`; known: `prefix`, `timeout_ms`, `replay_cache`, \
                         `protocol`"
                    ));
                }
            }
        }
        if !passed_on.is_empty() {
            options.connection = format!("{base}?{}", passed_on.join("&"));
        }
        redis::Client::open(options.connection.as_str()).map_err(|e| e.to_string())?;
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_are_parsed_and_checked() {
        let o = RedisOptions::from_url("redis://127.0.0.1:6379/2?prefix=idem-test&timeout_ms=250")
            .unwrap();
        assert_eq!(o.prefix, "idem-test");
        assert_eq!(o.timeout, Duration::from_millis(250));
        assert_eq!(o.connection, "redis://127.0.0.1:6379/2");
        assert!(RedisOptions::from_url("redis://h/0?prefix=a{b}").is_err());
        assert!(RedisOptions::from_url("redis://h/0?prefix=a:b").is_err());
        assert!(RedisOptions::from_url("redis://h/0?timeout_ms=0").is_err());
        assert!(RedisOptions::from_url("rediss://h/0").is_err());
    }
}
