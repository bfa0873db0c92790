//! Configuration of the streaming server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// TLS for the streaming endpoint: PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// Certificate chain, leaf first.
    pub cert_path: PathBuf,
    /// PKCS#8, PKCS#1 or SEC1 private key.
    pub key_path: PathBuf,
}

/// How the streaming server listens and what it bounds.
#[derive(Debug, Clone)]
pub struct StreamingConfig {
    /// Where to listen. The default, 127.0.0.1 on a free port, is what
    /// kubelet proxies to.
    pub addr: SocketAddr,
    /// Serve https instead of http.
    pub tls: Option<TlsConfig>,
    /// The `scheme://host:port` put in URLs, when the listening address is
    /// not what clients should dial (say 0.0.0.0 behind a node IP). By
    /// default it is derived from the bound address (an unspecified address
    /// becomes loopback).
    pub public_base_url: Option<String>,
    /// How long a URL stays usable (single use either way).
    pub token_ttl: Duration,
    /// URLs handed out but not yet used, at most; more are refused until
    /// some are used or expire.
    pub max_outstanding_tokens: usize,
    /// How long a client has, after the upgrade, to open the streams of an
    /// exec or attach, or both streams of a port-forward request.
    pub stream_creation_timeout: Duration,
    /// A session with no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// When the client goes away, how long a backend call gets to notice
    /// and return before its future is dropped.
    pub disconnect_grace: Duration,
    /// Connections served at once (each holds at most one session).
    pub max_connections: usize,
    /// Streams one SPDY session may have open at once.
    pub max_streams_per_session: usize,
    /// Bytes buffered per stream before the connection stops reading.
    pub stream_buffer: usize,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        StreamingConfig {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            tls: None,
            public_base_url: None,
            token_ttl: Duration::from_secs(60),
            max_outstanding_tokens: 1000,
            stream_creation_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(4 * 3600),
            disconnect_grace: Duration::from_secs(5),
            max_connections: 1024,
            max_streams_per_session: 256,
            stream_buffer: 256 * 1024,
        }
    }
}
