use std::path::PathBuf;

/// Errors of the streaming server's API. `InvalidArgument` and
/// `ResourceExhausted` map onto the gRPC codes of the same names.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid argument {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("too many streaming requests in flight ({0}); retry later")]
    ResourceExhausted(usize),
    #[error("streaming server: bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("streaming server TLS: {path}: {reason}")]
    Tls { path: PathBuf, reason: String },
    #[error("streaming server: {0}")]
    Config(String),
}

impl Error {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }
}
