//! The monitor's one error type: start-up failures (reported on the
//! start-up pipe) and failed requests (answered with an [`ErrorKind`] the
//! daemon maps to a gRPC status).

use std::io;

use crust_shim_protocol::ErrorKind;

use crate::runtime::RuntimeError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A malformed request, or one this monitor does not take.
    #[error("{0}")]
    InvalidArgument(String),
    /// Not possible in the process's current state.
    #[error("{0}")]
    FailedPrecondition(&'static str),
    /// The log path is unusable: something in the pod's log directory is
    /// in the way (a symlink, not a regular file).
    #[error("{0}")]
    LogRefused(String),
    /// The OCI runtime failed (its own message).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// An exec session's monitor could not start the process (its message).
    #[error("{0}")]
    ExecSession(String),
    /// The state directory holds a configuration the monitor cannot use.
    #[error("{0}")]
    Config(String),
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// Something else that should not happen.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    /// How the daemon should see it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::FailedPrecondition(_) | Error::LogRefused(_) => ErrorKind::FailedPrecondition,
            Error::Runtime(_) | Error::ExecSession(_) => ErrorKind::Runtime,
            Error::Config(_) | Error::Io { .. } | Error::Internal(_) => ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_messages() {
        let e = Error::io("binding ctl.sock")(io::Error::from(io::ErrorKind::AddrInUse));
        assert_eq!(e.kind(), ErrorKind::Internal);
        assert!(e.to_string().starts_with("binding ctl.sock: "), "{e}");
        let e = Error::from(RuntimeError::new("runc create: no such file"));
        assert_eq!(e.kind(), ErrorKind::Runtime);
        assert_eq!(e.to_string(), "runc create: no such file");
        assert_eq!(
            Error::FailedPrecondition("already started").kind(),
            ErrorKind::FailedPrecondition
        );
        assert_eq!(
            Error::InvalidArgument("bad signal 0".into()).kind(),
            ErrorKind::InvalidArgument
        );
    }
}
