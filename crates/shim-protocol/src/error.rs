//! What can go wrong talking to a monitor.

use std::io;

use crate::messages::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The monitor could not create the container (the runtime's message).
    #[error("{0}")]
    Startup(String),
    /// The monitor refused or failed the request.
    #[error("{message}")]
    Shim { kind: ErrorKind, message: String },
    /// No monitor is running for this state directory (read the exit file).
    #[error("the monitor is not running")]
    Gone,
    /// The monitor binary cannot be used (copied, sealed or run).
    #[error("monitor binary {}: {message}", path.display())]
    Binary {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("protocol error: {0}")]
    Protocol(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A connection error that means the monitor is gone, or going: it exited
/// with our connection still unanswered.
pub(crate) fn gone_or(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::NotFound
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Error::Gone,
        _ => Error::Io(e),
    }
}

pub(crate) fn unexpected(reply: impl std::fmt::Debug) -> Error {
    Error::Protocol(format!("unexpected reply {reply:?}"))
}
