//! The options of a Postgres store and their URL form (`postgres://…?schema=…&pool_size=…`).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::tls::{SslMode, TlsOptions};
use idem_core::store::{blob, replay_cache};

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
    /// How long a statement may go unanswered on the client's side before the call fails with
    /// a timeout and its connection is dropped: a stalled server, or a network that swallows
    /// packets without closing the connection, which the server's own timeout never sees.
    /// Default: the statement timeout and 2 s more (12 s), or 12 s without one.
    pub response_timeout: Duration,
    /// The size of the in-memory cache of completed records for replays, in KiB (0: none).
    pub replay_cache: usize,
    /// Completed results longer than this many bytes are stored once per tenant, as blobs
    /// (`usize::MAX`: never). Default [`blob::DEFAULT_THRESHOLD`], 64 KiB.
    pub blob_threshold: usize,
    /// TLS: `sslmode`, `sslrootcert`, `sslcert`, `sslkey`.
    pub tls: TlsOptions,
    /// Whether the server is reached through a transaction pooler (PgBouncer with
    /// `pool_mode = transaction`, Supabase's and Neon's poolers): `?pooler=transaction`. Then
    /// no statement is prepared by name and no session setting is sent, since consecutive
    /// statements may run on different server connections.
    pub transaction_pooler: bool,
}

/// The defaults of a URL without options; for [`PostgresStore::from_pool`](super::PostgresStore::from_pool),
/// only `schema`, `replay_cache` and `blob_threshold` matter.
impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            config: tokio_postgres::Config::new(),
            schema: "public".into(),
            pool_size: 16,
            pool_timeout: Duration::from_secs(5),
            statement_timeout: Some(Duration::from_secs(10)),
            response_timeout: Duration::from_secs(12),
            replay_cache: replay_cache::DEFAULT_CAPACITY,
            blob_threshold: blob::DEFAULT_THRESHOLD,
            tls: TlsOptions::default(),
            transaction_pooler: false,
        }
    }
}

impl PostgresOptions {
    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn from_url(url: &str) -> Result<Self, String> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut options = PostgresOptions::default();
        let mut statement_timeout_given = false;
        let mut response_timeout = None;
        let mut client_cert = None;
        let mut client_key = None;
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
                "response_timeout_ms" => {
                    let ms = millis(name, value)?;
                    if ms == 0 {
                        return Err(
                            "`response_timeout_ms` must be positive: a call must end".into()
                        );
                    }
                    response_timeout = Some(Duration::from_millis(ms));
                }
                "statement_timeout_ms" => {
                    let ms = millis(name, value)?;
                    options.statement_timeout = (ms > 0).then(|| Duration::from_millis(ms));
                    statement_timeout_given = true;
                }
                "replay_cache" => {
                    options.replay_cache = replay_cache::parse_capacity(value)?;
                }
                "blob_threshold" => options.blob_threshold = blob::parse_threshold(value)?,
                "pooler" => {
                    options.transaction_pooler = match value {
                        "transaction" => true,
                        "none" => false,
                        other => {
                            return Err(format!(
                                "`pooler` must be `transaction` (PgBouncer's transaction mode, \
                                 Supabase's or Neon's pooler) or `none`, not `{other}`"
                            ));
                        }
                    };
                }
                "sslmode" => options.tls.mode = SslMode::parse(value)?,
                "sslrootcert" => {
                    options.tls.root_cert = match value {
                        "" => return Err("`sslrootcert` needs a file name or `system`".into()),
                        "system" => None,
                        path => Some(PathBuf::from(percent_decoded(path))),
                    };
                }
                "sslcert" => client_cert = Some(PathBuf::from(percent_decoded(value))),
                "sslkey" => client_key = Some(PathBuf::from(percent_decoded(value))),
                _ => passed_on.push(pair),
            }
        }
        options.tls.client_cert = match (client_cert, client_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err("`sslcert` and `sslkey` go together: name both files".into()),
        };
        let rest = if passed_on.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", passed_on.join("&"))
        };
        options.config = tokio_postgres::Config::from_str(&rest).map_err(|e| e.to_string())?;
        options.config.ssl_mode(options.tls.negotiation());
        if options.config.get_connect_timeout().is_none() {
            options.config.connect_timeout(Duration::from_secs(5));
        }
        if options.config.get_application_name().is_none() {
            options.config.application_name("idem");
        }
        if options.transaction_pooler {
            if statement_timeout_given && options.statement_timeout.is_some() {
                return Err(
                    "`statement_timeout_ms` cannot be sent through a transaction pooler (it is a \
                     session setting): set it on the role instead (`ALTER ROLE … SET \
                     statement_timeout = …`)"
                        .into(),
                );
            }
            options.statement_timeout = None;
        }
        options.response_timeout = response_timeout.unwrap_or_else(|| {
            options.statement_timeout.unwrap_or(Duration::from_secs(10)) + Duration::from_secs(2)
        });
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

/// A URL query value with its `%XX` escapes decoded (a file name may hold any character).
fn percent_decoded(value: &str) -> String {
    percent_encoding::percent_decode_str(value)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

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
        assert!(PostgresOptions::from_url("postgres://h/db?sslmode=allow").is_err());
        let timeouts = |q: &str| PostgresOptions::from_url(&format!("postgres://h/db?{q}"));
        assert_eq!(
            timeouts("").unwrap().response_timeout,
            Duration::from_secs(12)
        );
        assert_eq!(
            timeouts("statement_timeout_ms=3000")
                .unwrap()
                .response_timeout,
            Duration::from_secs(5)
        );
        assert_eq!(
            timeouts("response_timeout_ms=700")
                .unwrap()
                .response_timeout,
            Duration::from_millis(700)
        );
        assert!(timeouts("response_timeout_ms=0").is_err());
        let pooled = PostgresOptions::from_url("postgres://h/db?pooler=transaction").unwrap();
        assert!(pooled.transaction_pooler);
        assert_eq!(pooled.statement_timeout, None);
        assert_eq!(
            pooled.config.get_options(),
            None,
            "no session setting is sent"
        );
        assert!(
            PostgresOptions::from_url("postgres://h/db?pooler=transaction&statement_timeout_ms=5")
                .unwrap_err()
                .contains("ALTER ROLE")
        );
        assert!(PostgresOptions::from_url("postgres://h/db?pooler=session").is_err());
        assert!(PostgresOptions::from_url("postgres://h/db?sslcert=/c.pem").is_err());
        assert_eq!(PostgresOptions::default().tls.mode, SslMode::Prefer);
        let tls = PostgresOptions::from_url(
            "postgres://h/db?sslmode=verify-full&sslrootcert=/etc/ca%20dir/ca.pem\
             &sslcert=/c.pem&sslkey=/k.pem",
        )
        .unwrap()
        .tls;
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(
            tls.root_cert.as_deref(),
            Some(Path::new("/etc/ca dir/ca.pem"))
        );
        assert_eq!(tls.client_cert, Some(("/c.pem".into(), "/k.pem".into())));
        let system =
            PostgresOptions::from_url("postgres://h/db?sslmode=verify-ca&sslrootcert=system");
        assert_eq!(system.unwrap().tls.root_cert, None);
        assert!(PostgresOptions::from_url("postgres://h/db?no_such_option=1").is_err());
    }
}
