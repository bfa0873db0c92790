use std::path::PathBuf;

use nix::errno::Errno;

/// Errors of this crate. [`Error::is_invalid_argument`] tells the daemon
/// which ones the client caused (gRPC InvalidArgument); the rest are host
/// failures (Internal).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Client input that is refused before anything is touched.
    #[error("invalid {what}: {why}")]
    InvalidArgument { what: String, why: String },

    /// The kernel refused a sysctl that passed validation (unknown in this
    /// namespace, value out of range, ...).
    #[error("cannot set sysctl {name}={value:?}: {source}")]
    Sysctl {
        name: String,
        value: String,
        #[source]
        source: std::io::Error,
    },

    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{op}: {source}")]
    Sys {
        op: &'static str,
        #[source]
        source: Errno,
    },

    #[error("cgroup {path}: {source}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The process whose namespaces were to be joined has exited.
    #[error("process {pid} is gone")]
    ProcessGone { pid: i32 },

    /// The namespace helper thread died (a bug, reported instead of
    /// propagating the panic into the daemon).
    #[error("namespace helper thread panicked")]
    HelperPanicked,
}

impl Error {
    /// Whether the request, not the host, is at fault.
    pub fn is_invalid_argument(&self) -> bool {
        match self {
            Error::InvalidArgument { .. } => true,
            // ENOENT: no such sysctl in the pod's namespaces; EINVAL/ERANGE:
            // a value the kernel does not accept.
            Error::Sysctl { source, .. } => matches!(
                source.raw_os_error().map(Errno::from_raw),
                Some(Errno::ENOENT | Errno::EINVAL | Errno::ERANGE)
            ),
            _ => false,
        }
    }

    pub(crate) fn invalid(what: impl Into<String>, why: impl Into<String>) -> Self {
        Error::InvalidArgument {
            what: what.into(),
            why: why.into(),
        }
    }

    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }

    pub(crate) fn sys(op: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Error::Sys { op, source }
    }
}
