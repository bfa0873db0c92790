//! TLS for the streaming endpoint (rustls with aws-lc-rs, PEM files).

use std::sync::Arc;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{
    self,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};

use crate::Error;
use crate::config::TlsConfig;

pub(crate) fn acceptor(cfg: &TlsConfig) -> Result<TlsAcceptor, Error> {
    let err = |path: &std::path::Path, reason: String| Error::Tls {
        path: path.to_path_buf(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cfg.cert_path)
        .map_err(|e| err(&cfg.cert_path, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(&cfg.cert_path, e.to_string()))?;
    if certs.is_empty() {
        return Err(err(&cfg.cert_path, "no certificate in file".into()));
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key_path)
        .map_err(|e| err(&cfg.key_path, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&cfg.cert_path, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| err(&cfg.key_path, e.to_string()))?;
    // HTTP/1.1 only: the upgrades need it.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
