//! The options of a Postgres store and their URL form (`postgres://…?schema=…&pool_size=…`).

use std::str::FromStr;
use std::time::Duration;

use crate::store::replay_cache;

/// Options of a [`PostgresStore`](super::PostgresStore), usually taken from the URL.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    pub(super) config: tokio_postgres::Config,
    /// The Postgres schema (namespace) holding idem's tables.
    pub schema: String,
    /// Most connections the pool opens.
    pub pool_size: usize,
    /// How long a call waits for a free connection (or for a new one) before a timeout error.
    pub pool_timeout: Duration,
    /// The server-side `statement_timeout` of idem's connections (`None`: the server's).
    pub statement_timeout: Option<Duration>,
    /// How many completed records to keep in memory for replays (0: none).
    pub replay_cache: usize,
}

impl PostgresOptions {
    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn from_url(url: &str) -> Result<Self, String> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut options = PostgresOptions {
            config: tokio_postgres::Config::new(),
            schema: "public".into(),
            pool_size: 16,
            pool_timeout: Duration::from_secs(5),
            statement_timeout: Some(Duration::from_secs(10)),
            replay_cache: replay_cache::DEFAULT_CAPACITY,
        };
        let millis = |name: &str, value: &str| -> Result<u64, String> {
            value.parse().map_err(|_| {
                format!("`{name}` must be a whole number of milliseconds, not `{value}`")
            })
        };
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "schema" => {
                    if !is_identifier(value) {
                        return Err(format!(
                            "`schema` must be a lowercase SQL identifier (letters, digits, `_`, \
                             at most 63), not `{value}`"
                        ));
                    }
                    options.schema = value.to_owned();
                }
                "pool_size" => {
                    options.pool_size = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        format!("`pool_size` must be a positive number, not `{value}`")
                    })?;
                }
                "pool_timeout_ms" => {
                    options.pool_timeout = Duration::from_millis(millis(name, value)?);
                }
                "statement_timeout_ms" => {
                    let ms = millis(name, value)?;
                    options.statement_timeout = (ms > 0).then(|| Duration::from_millis(ms));
                }
                "replay_cache" => {
                    options.replay_cache = replay_cache::parse_capacity(value)?;
                }
                "sslmode" if value != "disable" => {
                    return Err(
                        "TLS is not supported by this build: use `sslmode=disable` on a \
                                private network or a local connection"
                            .into(),
                    );
                }
                _ => passed_on.push(pair),
            }
        }
        let rest = if passed_on.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", passed_on.join("&"))
        };
        options.config = tokio_postgres::Config::from_str(&rest).map_err(|e| e.to_string())?;
        if options.config.get_connect_timeout().is_none() {
            options.config.connect_timeout(Duration::from_secs(5));
        }
        if options.config.get_application_name().is_none() {
            options.config.application_name("idem");
        }
        if let Some(timeout) = options.statement_timeout {
            let ours = format!("-c statement_timeout={}", timeout.as_millis());
            let all = match options.config.get_options() {
                Some(theirs) => format!("{theirs} {ours}"),
                None => ours,
            };
            options.config.options(all);
        }
        Ok(options)
    }
}

pub(super) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && s.len() <= 63
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_are_parsed_and_checked() {
        let o = PostgresOptions::from_url(
            "postgres://app@127.0.0.1:5432/db?schema=idem_x&pool_size=4&application_name=w1",
        )
        .unwrap();
        assert_eq!(o.schema, "idem_x");
        assert_eq!(o.pool_size, 4);
        assert_eq!(o.config.get_application_name(), Some("w1"));
        assert_eq!(
            o.config.get_connect_timeout(),
            Some(&Duration::from_secs(5))
        );
        assert!(PostgresOptions::from_url("postgres://h/db?schema=Bad-Name").is_err());
        assert!(PostgresOptions::from_url("postgres://h/db?pool_size=0").is_err());
        assert!(PostgresOptions::from_url("postgres://h/db?sslmode=require").is_err());
        assert!(PostgresOptions::from_url("postgres://h/db?no_such_option=1").is_err());
    }
}
