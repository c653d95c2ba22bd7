//! TLS to Postgres and Redis, against private TLS-only servers whose CA and certificates the
//! test generates (rcgen).
//!
//! Postgres: `verify-full` with the CA succeeds (and the health check says the connections are
//! encrypted); the wrong CA, or a host name the certificate does not name, fail with an error
//! that says so; `verify-ca` accepts any name under the right CA; a plain connection is refused
//! with an error that says TLS is required; a client certificate logs in a user the server
//! authenticates by certificate.
//!
//! Redis (`rediss://`): the same, with `tls_ca`, `tls_cert` and `tls_key`; there is no way to
//! turn the certificate check off.
//!
//! Needs the Postgres binaries (`pg_config --bindir`) and a `redis-server` built with TLS; runs
//! when `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_REDIS_URL` say they are installed here.

#[path = "common/servers.rs"]
mod servers;

use std::convert::Infallible;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use idem::store::conformance::test_server_url;
use idem::{Idem, OpenError, Outcome, idempotent};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use servers::PrivatePostgres;

/// A CA, and files signed by it, in a directory of the test's.
struct Pki {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), cert.pem()).unwrap();
        Pki {
            dir,
            issuer: Issuer::new(params, key),
        }
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// Writes `NAME.crt` and `NAME.key`: a certificate for `names` (a server's DNS names) with
    /// `common_name` (a client's user name), for `purpose`.
    fn issue(
        &self,
        file: &str,
        names: &[&str],
        common_name: &str,
        purpose: ExtendedKeyUsagePurpose,
    ) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![purpose];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (crt, pem) = (
            self.dir.path().join(format!("{file}.crt")),
            self.dir.path().join(format!("{file}.key")),
        );
        std::fs::write(&crt, cert.pem()).unwrap();
        std::fs::write(&pem, key.serialize_pem()).unwrap();
        std::fs::set_permissions(&pem, std::fs::Permissions::from_mode(0o600)).unwrap();
        (crt, pem)
    }
}

/// A private TLS-only server (its certificate names `localhost` only, issued by `pki`) with a
/// user `certuser` that logs in by client certificate.
struct TlsServer {
    pg: PrivatePostgres,
    pki: Pki,
}

/// Starts a private server for one test (stopped when dropped), or `None` when Postgres is not
/// installed here.
fn server() -> Option<TlsServer> {
    test_server_url("IDEM_TEST_POSTGRES_URL")?;
    let pki = Pki::new("idem test CA");
    let (crt, key) = pki.issue(
        "server",
        &["localhost"],
        "localhost",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let ca = pki.ca();
    let pg = PrivatePostgres::create_with(|data: &Path| {
        for (from, to) in [(&crt, "server.crt"), (&key, "server.key"), (&ca, "ca.crt")] {
            std::fs::copy(from, data.join(to)).unwrap();
        }
        std::fs::set_permissions(
            data.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let mut conf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        conf.push_str(
            "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'ca.crt'\n",
        );
        std::fs::write(data.join("postgresql.conf"), conf).unwrap();
        // TLS only: no `host` line, so a plain TCP connection finds no entry.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all certuser 127.0.0.1/32 cert\n\
             hostssl all postgres 127.0.0.1/32 trust\n",
        )
        .unwrap();
    });
    pg.psql("CREATE ROLE certuser LOGIN; CREATE SCHEMA certschema AUTHORIZATION certuser;");
    Some(TlsServer { pg, pki })
}

impl TlsServer {
    fn url(&self, user: &str, host: &str) -> String {
        format!("postgres://{user}@{host}:{}/postgres", self.pg.port)
    }
}

#[idempotent(key = "run_id", mutating, name = "tls.charge")]
async fn charge(run_id: String) -> Result<u32, Infallible> {
    let _ = run_id;
    Ok(1)
}

/// Opens `url` and makes one fresh call through it; answers the health check's `encrypted`.
async fn works(url: &str) -> Option<bool> {
    let idem = Idem::open(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let answer = idem
        .scope("tenant-tls")
        .run(charge(uuid::Uuid::new_v4().to_string()))
        .await;
    assert!(matches!(answer, Ok(Outcome::Fresh(1))), "{answer:?}");
    idem.health().await.unwrap().encrypted
}

/// The whole message of an open error, causes included.
fn refused(result: Result<Idem, OpenError>) -> String {
    let error = result.expect_err("the connection is refused");
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(&format!(" / {cause}"));
        source = cause.source();
    }
    text
}

#[tokio::test]
async fn verify_full_with_the_ca_succeeds_and_the_health_check_says_encrypted() {
    let Some(server) = server() else { return };
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url("postgres", "localhost"),
        server.pki.ca().display()
    );
    assert_eq!(works(&url).await, Some(true));
}

#[tokio::test]
async fn the_wrong_ca_is_refused_and_the_error_says_the_handshake_failed() {
    let Some(server) = server() else { return };
    let other = Pki::new("another CA");
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url("postgres", "localhost"),
        other.ca().display()
    );
    let text = refused(Idem::open(&url).await);
    assert!(text.contains("TLS handshake failed"), "{text}");
    assert!(text.contains("UnknownIssuer"), "{text}");
}

#[tokio::test]
async fn a_host_name_the_certificate_does_not_name_fails_verify_full_but_not_verify_ca() {
    let Some(server) = server() else { return };
    let ca = server.pki.ca();
    let full = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url("postgres", "127.0.0.1"),
        ca.display()
    );
    let text = refused(Idem::open(&full).await);
    assert!(text.contains("TLS handshake failed"), "{text}");
    assert!(text.contains("not valid for name"), "{text}");
    let chain_only = format!(
        "{}?sslmode=verify-ca&sslrootcert={}",
        server.url("postgres", "127.0.0.1"),
        ca.display()
    );
    assert_eq!(works(&chain_only).await, Some(true));
}

#[tokio::test]
async fn a_plain_connection_to_a_tls_only_server_says_tls_is_required() {
    let Some(server) = server() else { return };
    let url = format!("{}?sslmode=disable", server.url("postgres", "localhost"));
    let text = refused(Idem::open(&url).await);
    assert!(
        text.contains("accepts only encrypted connections"),
        "{text}"
    );
    assert!(text.contains("sslmode=require"), "{text}");
}

#[tokio::test]
async fn prefer_and_require_encrypt_without_checking_like_libpq() {
    let Some(server) = server() else { return };
    for mode in ["prefer", "require"] {
        let url = format!("{}?sslmode={mode}", server.url("postgres", "127.0.0.1"));
        assert_eq!(works(&url).await, Some(true), "{mode}");
    }
}

#[tokio::test]
async fn a_client_certificate_logs_in_a_user_the_server_authenticates_by_certificate() {
    let Some(server) = server() else { return };
    let (crt, key) = server.pki.issue(
        "certuser",
        &[],
        "certuser",
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let base = format!(
        "{}?sslmode=verify-full&sslrootcert={}&schema=certschema",
        server.url("certuser", "localhost"),
        server.pki.ca().display()
    );
    let with_cert = format!("{base}&sslcert={}&sslkey={}", crt.display(), key.display());
    assert_eq!(works(&with_cert).await, Some(true));
    let text = refused(Idem::open(&base).await);
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn sslmode_disable_on_the_shared_server_says_not_encrypted() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    assert_eq!(
        works(&format!("{url}{sep}sslmode=disable")).await,
        Some(false)
    );
}

/// A private TLS-only Redis (its certificate names `localhost` only), its port, and the PKI.
struct TlsRedis {
    port: u16,
    pki: Pki,
    _dir: tempfile::TempDir,
    _server: std::process::Child,
}

/// Starts one for a test; `clients`: `--tls-auth-clients` (`no` or `yes`).
fn tls_redis(clients: &str) -> Option<TlsRedis> {
    test_server_url("IDEM_TEST_REDIS_URL")?;
    let pki = Pki::new("idem test CA");
    let (crt, key) = pki.issue(
        "redis",
        &["localhost"],
        "localhost",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let dir = tempfile::tempdir().unwrap();
    let port = servers::free_port();
    let args: Vec<String> = [
        "--bind",
        "127.0.0.1",
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        &crt.display().to_string(),
        "--tls-key-file",
        &key.display().to_string(),
        "--tls-ca-cert-file",
        &pki.ca().display().to_string(),
        "--tls-auth-clients",
        clients,
        "--save",
        "",
        "--dir",
        &dir.path().display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let server = servers::watched("redis-server", &args);
    servers::wait_for_port(port, "redis-server (TLS)");
    Some(TlsRedis {
        port,
        pki,
        _dir: dir,
        _server: server,
    })
}

#[tokio::test]
async fn rediss_with_the_ca_succeeds_and_the_health_check_says_encrypted() {
    let Some(redis) = tls_redis("no") else { return };
    let url = format!(
        "rediss://localhost:{}/?tls_ca={}",
        redis.port,
        redis.pki.ca().display()
    );
    assert_eq!(works(&url).await, Some(true));
}

#[tokio::test]
async fn rediss_refuses_the_wrong_ca_and_a_host_name_the_certificate_does_not_name() {
    let Some(redis) = tls_redis("no") else { return };
    let other = Pki::new("another CA");
    let wrong_ca = format!(
        "rediss://localhost:{}/?tls_ca={}",
        redis.port,
        other.ca().display()
    );
    let text = refused(Idem::open(&wrong_ca).await);
    assert!(text.contains("TLS handshake failed"), "{text}");
    let wrong_host = format!(
        "rediss://127.0.0.1:{}/?tls_ca={}",
        redis.port,
        redis.pki.ca().display()
    );
    let text = refused(Idem::open(&wrong_host).await);
    assert!(text.contains("TLS handshake failed"), "{text}");
    // No way to turn the check off: the URL that would is refused.
    let insecure = format!("rediss://127.0.0.1:{}/#insecure", redis.port);
    assert!(refused(Idem::open(&insecure).await).contains("tls_ca"));
}

#[tokio::test]
async fn plain_redis_to_a_tls_only_server_is_a_clear_error() {
    let Some(redis) = tls_redis("no") else { return };
    let url = format!("redis://localhost:{}/?timeout_ms=2000", redis.port);
    let text = refused(Idem::open(&url).await);
    assert!(text.contains("rediss://"), "{text}");
}

#[tokio::test]
async fn a_redis_that_asks_for_a_client_certificate_takes_ours() {
    let Some(redis) = tls_redis("yes") else {
        return;
    };
    let (crt, key) = redis.pki.issue(
        "client",
        &[],
        "idem-client",
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let base = format!(
        "rediss://localhost:{}/?tls_ca={}",
        redis.port,
        redis.pki.ca().display()
    );
    let with_cert = format!(
        "{base}&tls_cert={}&tls_key={}",
        crt.display(),
        key.display()
    );
    assert_eq!(works(&with_cert).await, Some(true));
    refused(Idem::open(&base).await);
}
