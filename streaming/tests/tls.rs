//! The streaming endpoint over TLS (certificate made by openssl here).

mod common;

use std::sync::Arc;

use common::*;
use crust_streaming::{StreamingConfig, TlsConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::{
    self, pki_types::CertificateDer, pki_types::ServerName, pki_types::pem::PemObject,
};

#[tokio::test]
async fn serves_https_and_reports_bad_key_files() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
        ])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    if !made.as_ref().is_ok_and(|o| o.status.success()) {
        skip!("openssl cannot make a test certificate");
    }
    let tls = TlsConfig {
        cert_path: cert.clone(),
        key_path: key.clone(),
    };
    let (server, _) = start(StreamingConfig {
        tls: Some(tls),
        ..Default::default()
    })
    .await;
    let url = server
        .get_exec_url(exec_req(&["exit", "0"], false, true, false, false))
        .unwrap();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&cert).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let path = url
        .split_once("127.0.0.1")
        .unwrap()
        .1
        .split_once('/')
        .unwrap()
        .1;
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    // A good token, but no upgrade asked for: 400, and the token is spent.
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&out)
    );

    // Unreadable key material is a clear configuration error.
    let bad = TlsConfig {
        cert_path: cert,
        key_path: dir.path().join("missing.pem"),
    };
    let err = crust_streaming::StreamingServer::start(
        StreamingConfig {
            tls: Some(bad),
            ..Default::default()
        },
        Arc::new(Fake::default()),
    )
    .await
    .err()
    .expect("refused");
    assert!(err.to_string().contains("missing.pem"), "{err}");
}
