use std::path::PathBuf;

/// Errors of this crate. [`Error::is_invalid_argument`] tells the daemon
/// which ones the client caused (gRPC InvalidArgument),
/// [`Error::is_unsupported`] what this host or kernel cannot do; the rest
/// are host failures (Internal).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Client input refused before anything was touched. `what` names the
    /// field or key (quoting at most [`MAX_QUOTE`] bytes of it).
    #[error("invalid {what}: {why}")]
    Invalid { what: String, why: String },

    /// A request this host cannot carry out (a resource of another cgroup
    /// version, a controller that is not enabled, ...). Nothing was changed
    /// when it comes from validation.
    #[error("{what}: {why}")]
    Unsupported { what: String, why: String },

    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The kernel refused a value written to a control file (EINVAL and
    /// ERANGE: not a value it takes; EBUSY: e.g. a limit under the usage).
    #[error("write {} to {}: {source}", quote(.value), .path.display())]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },

    /// A control file whose content is not what the kernel writes.
    #[error("cannot parse {path}: {why}")]
    Parse { path: PathBuf, why: String },

    /// Processes were still in the cgroup when the wait ran out.
    #[error("cgroup {path} still holds processes after {waited_ms} ms")]
    NotEmpty { path: PathBuf, waited_ms: u64 },

    #[error("systemd: {op}: {source}")]
    Dbus {
        op: String,
        #[source]
        source: Box<zbus::Error>,
    },

    /// A systemd job or unit did not end as asked.
    #[error("systemd: {0}")]
    Systemd(String),
}

/// How many bytes of client input an error message quotes at most.
pub const MAX_QUOTE: usize = 256;

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether the request, not the host, is at fault.
    pub fn is_invalid_argument(&self) -> bool {
        match self {
            Error::Invalid { .. } => true,
            Error::Write { source, .. } => matches!(source.raw_os_error(), Some(22 | 34)),
            _ => false,
        }
    }

    /// Whether the request asks for something this host cannot do.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }

    /// Whether the error says that a file or cgroup does not exist.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Io { source, .. } | Error::Write { source, .. } => {
                source.kind() == std::io::ErrorKind::NotFound
            }
            _ => false,
        }
    }

    pub(crate) fn invalid(what: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            why: why.into(),
        }
    }

    pub(crate) fn unsupported(what: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Unsupported {
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

    pub(crate) fn dbus(op: impl Into<String>) -> impl FnOnce(zbus::Error) -> Self {
        let op = op.into();
        move |source| Error::Dbus {
            op,
            source: Box::new(source),
        }
    }
}

/// `s` as a quoted string for an error message, cut to [`MAX_QUOTE`] bytes
/// (on a character boundary) so that hostile input cannot bloat a gRPC
/// status.
pub fn quote(s: &str) -> String {
    if s.len() <= MAX_QUOTE {
        return format!("{s:?}");
    }
    let mut end = MAX_QUOTE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_bounded() {
        assert_eq!(quote("a\nb"), "\"a\\nb\"");
        let long = "é".repeat(1000);
        let q = quote(&long);
        assert!(q.len() < 2 * MAX_QUOTE + 40, "{}", q.len());
        assert!(q.ends_with("(2000 bytes)"), "{q}");
    }
}
