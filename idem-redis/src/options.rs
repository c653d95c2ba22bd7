//! The options of a Redis store and their URL form (`redis://…?prefix=…&timeout_ms=…`).
//!
//! | URL | connects to |
//! |---|---|
//! | `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` | one server |
//! | `rediss://…` | one server, over TLS (its certificate must chain to a trusted root and name the host) |
//! | `redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…]` | a Redis Cluster, from one or more of its nodes (the client finds the rest) |
//! | `rediss+cluster://…` | a Redis Cluster over TLS |
//!
//! Options: `prefix`, `timeout_ms`, `replay_cache`, `blob_threshold`, `wait_replicas`,
//! `wait_timeout_ms` and `fencing` (see
//! [`RedisOptions`]), `tls_ca`, `tls_cert` and `tls_key` (PEM files: the trusted roots instead of
//! the system's, and a client certificate), and redis-rs's own `protocol`.

use std::path::PathBuf;
use std::time::Duration;

use idem_core::store::{blob, replay_cache};

/// Options of a [`RedisStore`](super::RedisStore), usually taken from the URL.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// One server's URL, or the cluster nodes' (`redis://HOST:PORT` each).
    pub(super) nodes: Vec<String>,
    /// Whether `nodes` are the seeds of a cluster.
    pub(super) cluster: bool,
    /// Prepended to every key (`PREFIX:{TENANT}:KEY`, `PREFIX:meta`).
    pub prefix: String,
    /// Connect and response timeout.
    pub timeout: Duration,
    /// The size of the in-memory cache of completed records for replays, in KiB (0: none).
    pub replay_cache: usize,
    /// Completed results longer than this many bytes are stored once per tenant, as blobs
    /// (`usize::MAX`: never). Default [`blob::DEFAULT_THRESHOLD`], 64 KiB.
    pub blob_threshold: usize,
    /// How many replicas must acknowledge a new claim before its body runs (Redis `WAIT`; 0,
    /// the default, waits for none). A claim acknowledged by fewer within `wait_timeout` is a
    /// store error, and the body does not run.
    pub wait_replicas: u32,
    /// How long a claim waits for `wait_replicas` acknowledgements.
    pub wait_timeout: Duration,
    /// Fence completions, renewals and releases with Lua scripts even on a server that
    /// compares and sets on its own (`fencing=script`; the default, `fencing=auto`, uses the
    /// server's `SET … IFEQ` and `DELIFEQ` where a probe at open finds them): to compare the
    /// two, or for a cluster whose nodes run different servers.
    pub script_fencing: bool,
    /// TLS files: trusted roots (PEM) instead of the system's store.
    pub tls_ca: Option<PathBuf>,
    /// TLS files: a client certificate and its key (PEM).
    pub tls_client: Option<(PathBuf, PathBuf)>,
}

impl RedisOptions {
    /// Parses a `redis://`, `rediss://`, `redis+cluster://` or `rediss+cluster://` URL.
    pub fn from_url(url: &str) -> Result<Self, String> {
        let (url, fragment) = match url.split_once('#') {
            Some((url, fragment)) => (url, Some(fragment)),
            None => (url, None),
        };
        if fragment == Some("insecure") {
            return Err(
                "`#insecure` (no certificate check) is not supported: name the server's CA with \
                 `tls_ca=PATH`"
                    .into(),
            );
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (scheme, rest) = base
            .split_once("://")
            .ok_or_else(|| format!("not a Redis URL: `{}`", scheme_of(url)))?;
        let (node_scheme, cluster) = match scheme.to_ascii_lowercase().as_str() {
            "redis" => ("redis", false),
            "rediss" => ("rediss", false),
            "redis+cluster" => ("redis", true),
            "rediss+cluster" => ("rediss", true),
            other => {
                return Err(format!(
                    "`{other}://` is not a Redis URL: use redis://, rediss://, redis+cluster:// \
                     or rediss+cluster://"
                ));
            }
        };
        let mut options = RedisOptions {
            nodes: Vec::new(),
            cluster,
            prefix: "idem".into(),
            timeout: Duration::from_secs(5),
            replay_cache: replay_cache::DEFAULT_CAPACITY,
            blob_threshold: blob::DEFAULT_THRESHOLD,
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            script_fencing: false,
            tls_ca: None,
            tls_client: None,
        };
        let (mut tls_cert, mut tls_key) = (None, None);
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let millis = || -> Result<u64, String> {
                value.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                    format!("`{name}` must be a positive number of milliseconds, not `{value}`")
                })
            };
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
                "timeout_ms" => options.timeout = Duration::from_millis(millis()?),
                "replay_cache" => {
                    options.replay_cache = replay_cache::parse_capacity(value)?;
                }
                "blob_threshold" => options.blob_threshold = blob::parse_threshold(value)?,
                "wait_replicas" => {
                    options.wait_replicas = value.parse().map_err(|_| {
                        format!("`wait_replicas` must be a number of replicas, not `{value}`")
                    })?;
                }
                "wait_timeout_ms" => options.wait_timeout = Duration::from_millis(millis()?),
                "fencing" => {
                    options.script_fencing = match value {
                        "auto" => false,
                        "script" => true,
                        _ => {
                            return Err(format!(
                                "`fencing` is `auto` (the server's compare-and-set where it has \
                                 one) or `script` (Lua scripts always), not `{value}`"
                            ));
                        }
                    }
                }
                "tls_ca" => options.tls_ca = Some(path(name, value)?),
                "tls_cert" => tls_cert = Some(path(name, value)?),
                "tls_key" => tls_key = Some(path(name, value)?),
                "protocol" => passed_on.push(pair),
                _ => {
                    return Err(format!(
                        "unknown option `{name}`; known: `prefix`, `timeout_ms`, `replay_cache`, \
                         `blob_threshold`, `wait_replicas`, `wait_timeout_ms`, `fencing`, `tls_ca`, \
                         `tls_cert`, `tls_key`, `protocol`"
                    ));
                }
            }
        }
        options.tls_client = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err("`tls_cert` and `tls_key` go together: name both files".into()),
        };
        if node_scheme == "redis" && (options.tls_ca.is_some() || options.tls_client.is_some()) {
            return Err("`tls_ca`, `tls_cert` and `tls_key` need TLS: use rediss://".into());
        }
        let suffix = {
            let mut suffix = String::new();
            if !passed_on.is_empty() {
                suffix = format!("?{}", passed_on.join("&"));
            }
            if let Some(fragment) = fragment {
                suffix.push('#');
                suffix.push_str(fragment);
            }
            suffix
        };
        if cluster {
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((auth, hosts)) => (format!("{auth}@"), hosts),
                None => (String::new(), rest),
            };
            let hosts = hosts.trim_end_matches('/');
            if hosts.contains('/') {
                return Err(
                    "a Redis Cluster has one database: no `/DB` in a redis+cluster:// URL".into(),
                );
            }
            for host in hosts.split(',') {
                if host.is_empty() {
                    return Err(
                        "a redis+cluster:// URL names its nodes: HOST:PORT[,HOST:PORT…]".into(),
                    );
                }
                options
                    .nodes
                    .push(format!("{node_scheme}://{auth}{host}{suffix}"));
            }
        } else {
            options
                .nodes
                .push(format!("{node_scheme}://{rest}{suffix}"));
        }
        for node in &options.nodes {
            redis::Client::open(node.as_str()).map_err(|e| e.to_string())?;
        }
        Ok(options)
    }

    /// Whether the connections use TLS.
    pub fn tls(&self) -> bool {
        self.nodes.iter().any(|n| n.starts_with("rediss://"))
    }
}

/// The scheme part of a URL, never its password.
fn scheme_of(url: &str) -> &str {
    url.split_once(':').map_or("", |(scheme, _)| scheme)
}

fn path(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err(format!("`{name}` needs a file name"));
    }
    Ok(PathBuf::from(
        percent_encoding::percent_decode_str(value)
            .decode_utf8_lossy()
            .into_owned(),
    ))
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
        assert_eq!(o.nodes, ["redis://127.0.0.1:6379/2"]);
        assert!(!o.cluster && !o.tls());
        assert!(RedisOptions::from_url("redis://h/0?prefix=a{b}").is_err());
        assert!(RedisOptions::from_url("redis://h/0?prefix=a:b").is_err());
        assert!(RedisOptions::from_url("redis://h/0?timeout_ms=0").is_err());
        assert!(RedisOptions::from_url("redis://h/0?tls_ca=/ca.pem").is_err());
        assert!(RedisOptions::from_url("rediss://h/0?tls_cert=/c.pem").is_err());
        assert!(RedisOptions::from_url("http://h/0").is_err());
        assert!(!o.script_fencing);
        let o = RedisOptions::from_url("redis://h/0?fencing=script").unwrap();
        assert!(o.script_fencing);
        assert!(
            !RedisOptions::from_url("redis://h/0?fencing=auto")
                .unwrap()
                .script_fencing
        );
        let refused = RedisOptions::from_url("redis://h/0?fencing=lua").unwrap_err();
        assert!(refused.contains("`fencing` is `auto`"), "{refused}");
    }

    #[test]
    fn tls_and_cluster_urls() {
        let o = RedisOptions::from_url(
            "rediss://:pw@cache.example:6380/0?tls_ca=/etc/ca%20dir/ca.pem&wait_replicas=1",
        )
        .unwrap();
        assert!(o.tls());
        assert_eq!(
            o.tls_ca.as_deref(),
            Some(std::path::Path::new("/etc/ca dir/ca.pem"))
        );
        assert_eq!(o.wait_replicas, 1);
        assert_eq!(o.nodes, ["rediss://:pw@cache.example:6380/0"]);
        let c = RedisOptions::from_url("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001/?prefix=p")
            .unwrap();
        assert!(c.cluster);
        assert_eq!(
            c.nodes,
            ["redis://:pw@10.0.0.1:7000", "redis://:pw@10.0.0.2:7001"]
        );
        assert!(RedisOptions::from_url("redis+cluster://h:7000/1").is_err());
        assert!(RedisOptions::from_url("redis+cluster://h:7000,,h:7001").is_err());
        assert!(
            RedisOptions::from_url("rediss+cluster://h:7000#insecure")
                .unwrap_err()
                .contains("tls_ca")
        );
    }
}
