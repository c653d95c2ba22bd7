//! TLS to Postgres with rustls: the libpq `sslmode` values, a CA file or the system's roots, and
//! a client certificate.
//!
//! | `sslmode` | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default, as libpq's) | when the server offers it | no (with `sslrootcert`: chain) |
//! | `require` | always, or the connection fails | no (with `sslrootcert`: chain, as libpq) |
//! | `verify-ca` | always | chain to a trusted root |
//! | `verify-full` | always | chain, and the host name (or IP address) it was reached by |
//!
//! The trusted roots are the file named by `sslrootcert` (PEM, one or more certificates) or,
//! without it or with `sslrootcert=system`, the system's store. `sslcert` and `sslkey` (PEM files)
//! present a client certificate. The crypto provider is rustls' `ring`, set on the connector
//! (the process-wide default is left alone).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// How a connection is encrypted and checked: the `sslmode` of the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS when the server offers it, else plain text; the certificate is not checked unless a
    /// root certificate is named.
    Prefer,
    /// TLS or no connection; the certificate is not checked unless a root certificate is named.
    Require,
    /// TLS, and the server's certificate must chain to a trusted root.
    VerifyCa,
    /// TLS, a trusted chain, and a certificate for the host name connected to.
    VerifyFull,
}

impl SslMode {
    /// Parses a libpq `sslmode` value.
    pub fn parse(value: &str) -> Result<Self, String> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(
                    "`sslmode=allow` is not supported: use `prefer` (TLS when offered) or \
                     `disable`"
                        .into(),
                );
            }
            other => {
                return Err(format!(
                    "`sslmode` must be disable, prefer, require, verify-ca or verify-full, not \
                     `{other}`"
                ));
            }
        })
    }
}

/// The TLS settings of a Postgres store (from `sslmode`, `sslrootcert`, `sslcert`, `sslkey`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    /// How the connection is encrypted and checked.
    pub mode: SslMode,
    /// A PEM file of trusted root certificates; `None` trusts the system's store.
    pub root_cert: Option<PathBuf>,
    /// A client certificate and its private key (PEM files).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            mode: SslMode::Prefer,
            root_cert: None,
            client_cert: None,
        }
    }
}

impl TlsOptions {
    /// The mode tokio-postgres negotiates with (it checks nothing itself).
    pub(super) fn negotiation(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }

    /// What the server's certificate is checked against.
    fn check(&self) -> Check {
        match (self.mode, &self.root_cert) {
            (SslMode::VerifyFull, _) => Check::Full,
            (SslMode::VerifyCa, _) | (SslMode::Require | SslMode::Prefer, Some(_)) => Check::Chain,
            _ => Check::Nothing,
        }
    }

    /// The connector, with its files read now: an unreadable or empty file is an error here, at
    /// open, not at the first connection.
    pub(super) fn connector(&self) -> Result<Connector, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = Arc::new(self.roots()?);
        let verifier: Arc<dyn ServerCertVerifier> = match self.check() {
            Check::Nothing => Arc::new(AnyCertificate(provider.signature_verification_algorithms)),
            check => {
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| format!("the trusted roots cannot be used: {e}"))?;
                if check == Check::Full {
                    webpki
                } else {
                    Arc::new(AnyName(webpki))
                }
            }
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certificates(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("`sslkey` {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("`sslcert`/`sslkey` do not make a client identity: {e}"))?
            }
        };
        let handshakes = Arc::new(AtomicU64::new(0));
        Ok(Connector {
            inner: tokio_postgres_rustls::MakeRustlsConnect::new(config),
            handshakes,
        })
    }

    fn roots(&self) -> Result<RootCertStore, String> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            Some(path) => {
                for cert in read_certificates(path, "sslrootcert")? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("`sslrootcert` {}: {e}", path.display()))?;
                }
            }
            None if self.check() == Check::Nothing => {}
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(
                        "no trusted root certificates found in the system's store; name a CA \
                         file with `sslrootcert=PATH`"
                            .into(),
                    );
                }
            }
        }
        Ok(roots)
    }
}

fn read_certificates(path: &Path, option: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("`{option}` {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "`{option}` {}: no PEM certificate in the file",
            path.display()
        ));
    }
    Ok(certs)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    Full,
}

/// The rustls connector of a store, counting the TLS handshakes it started (so that the health
/// check can say whether connections are encrypted).
#[derive(Clone)]
pub(super) struct Connector {
    inner: tokio_postgres_rustls::MakeRustlsConnect,
    handshakes: Arc<AtomicU64>,
}

impl Connector {
    /// How many connections negotiated TLS so far.
    pub(super) fn handshakes(&self) -> u64 {
        self.handshakes.load(Ordering::Relaxed)
    }
}

impl<S> tokio_postgres::tls::MakeTlsConnect<S> for Connector
where
    tokio_postgres_rustls::MakeRustlsConnect: tokio_postgres::tls::MakeTlsConnect<S>,
{
    type Stream = <tokio_postgres_rustls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<S>>::Stream;
    type TlsConnect = Counted<
        <tokio_postgres_rustls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<S>>::TlsConnect,
    >;
    type Error =
        <tokio_postgres_rustls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        Ok(Counted {
            inner: self.inner.make_tls_connect(domain)?,
            handshakes: self.handshakes.clone(),
        })
    }
}

/// A TLS connect that counts itself when tokio-postgres starts it (the server agreed to TLS).
pub(super) struct Counted<T> {
    inner: T,
    handshakes: Arc<AtomicU64>,
}

impl<S, T: tokio_postgres::tls::TlsConnect<S>> tokio_postgres::tls::TlsConnect<S> for Counted<T> {
    type Stream = T::Stream;
    type Error = T::Error;
    type Future = T::Future;

    fn connect(self, stream: S) -> Self::Future {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        self.inner.connect(stream)
    }
}

/// `sslmode=prefer`/`require` without a root certificate, as libpq: encrypted, the server's
/// certificate unchecked (the handshake's signatures still are).
#[derive(Debug)]
struct AnyCertificate(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name in the certificate may be any.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::{SslMode, TlsOptions};

    #[test]
    fn libpq_modes_parse_and_allow_is_refused_with_a_way_out() {
        assert_eq!(SslMode::parse("verify-full").unwrap(), SslMode::VerifyFull);
        assert_eq!(SslMode::parse("disable").unwrap(), SslMode::Disable);
        assert!(SslMode::parse("allow").unwrap_err().contains("prefer"));
        assert!(
            SslMode::parse("verify_full")
                .unwrap_err()
                .contains("verify-full")
        );
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_an_error_at_open() {
        let missing = TlsOptions {
            mode: SslMode::VerifyFull,
            root_cert: Some("/nonexistent/ca.pem".into()),
            client_cert: None,
        };
        let err = missing.connector().err().expect("an error");
        assert!(
            err.contains("sslrootcert") && err.contains("/nonexistent/ca.pem"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = TlsOptions {
            root_cert: Some(empty),
            ..missing
        }
        .connector()
        .err()
        .expect("an error");
        assert!(err.contains("no PEM certificate"), "{err}");
    }
}
