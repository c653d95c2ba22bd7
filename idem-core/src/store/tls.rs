//! What a TLS failure looks like under a driver's error, for the backends that speak TLS
//! (feature `rustls`).

/// The TLS error under a driver's error, if a TLS handshake is what failed: a `rustls::Error`
/// in the chain of sources (itself, or inside an `io::Error`), or, where a driver kept only its
/// text, a rustls message.
pub fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(e);
    while let Some(error) = source {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(tls) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls.to_string());
        }
        let text = error.to_string();
        if [
            "invalid peer certificate",
            "received fatal alert",
            "peer is incompatible",
            "peer misbehaved",
        ]
        .iter()
        .any(|tls| text.contains(tls))
        {
            return Some(text);
        }
        source = error.source();
    }
    None
}
